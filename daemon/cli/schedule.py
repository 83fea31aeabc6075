"""The CLI's ``goald schedule add|list|rm|runs|suspend|resume|run``.

Times of a schedule are shown in the schedule's own zone (``--utc``: in UTC), to the second, with
how far away they are ("in 1m20s"); ``schedule runs`` says how the goal each run started ended.
``schedule list`` is a table under a header, as ``kubectl get cronjobs`` (with its SUSPEND column);
every verb that changes something says what it changed, and an empty listing says it is empty.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from daemon.cli.goal import progress_params, sandbox_params
from daemon.cli.parser import UsageError, parse_deadline
from daemon.client import Connection
from daemon.display import age, status_text, use_utc, when
from daemon.rpc.protocol import RpcError
from daemon.schedule.model import CronTrigger, IntervalTrigger, Schedule, ScheduleRun


def _trigger(args: argparse.Namespace) -> dict[str, Any]:
    if args.cron is not None:
        return {"kind": "cron", "expr": args.cron}
    if args.every is not None:
        return {"kind": "interval", "seconds": args.every}
    return {"kind": "date", "at": parse_deadline(args.at, "--at")}


def _zone(name: str) -> ZoneInfo | None:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None


#: The header of ``schedule list``'s table (its columns are separated by two spaces, as its rows).
HEADER = "ID  KEY  TRIGGER  SUSPENDED  NEXT  LAST"


def outcome_text(outcome: str | None, manual: bool = False) -> str:
    """A run's outcome as shown: ``skipped (suspended)``, ``fired (manual)``..."""
    if outcome is None:
        return "-"
    text = {"skipped_suspended": "skipped (suspended)", "skipped_concurrency": "skipped (concurrency)"}.get(
        outcome, outcome
    )
    return f"{text} (manual)" if manual else text


def _line(s: Schedule) -> str:
    trig = s.trigger
    tz = _zone(s.timezone)
    if isinstance(trig, CronTrigger):
        what = trig.expr
    else:
        what = f"every {trig.seconds:g}s" if isinstance(trig, IntervalTrigger) else "once"
    nxt = s.next_fire_at
    next_text = f"{when(nxt, tz)} ({age(nxt)})" if nxt else "-"
    if s.suspended_at:
        next_text = f"(suspended) {next_text}"
    suspended = f"since {when(s.suspended_at, tz)}" if s.suspended_at else "no"
    last = f"{outcome_text(s.last_outcome)} ({s.last_reason})" if s.last_outcome else "never fired"
    return f"{s.id}  {s.key or '-'}  {trig.kind} {what} {s.timezone}  {suspended}  next {next_text}  last {last}"


def _name(s: Schedule) -> str:
    return f"{s.id} ({s.key})" if s.key else str(s.id)


def _run_line(r: ScheduleRun) -> str:
    return f"{when(r.scheduled_for)}  {outcome_text(r.outcome, r.manual)}  {r.reason}"


async def _ended(client: Connection, goal_id: str) -> str:
    """How the goal a run started stands (or ended)."""
    try:
        g = await client.call("goal/get", {"goalId": goal_id})
    except RpcError:
        return "goal deleted"
    return status_text(g)


async def schedule_command(client: Connection, args: argparse.Namespace) -> int:
    """Run one schedule action."""
    action = args.schedule_command
    use_utc(getattr(args, "utc", False))
    if action == "add":
        goal: dict[str, Any] = {"objective": args.objective}
        if args.title:
            goal["title"] = args.title
        if args.model:
            goal["model"] = args.model
        given = (
            ("max_rounds", args.max_rounds),
            ("max_tokens_total", args.max_tokens),
            ("max_cost", args.max_cost),
            ("max_wall_seconds", args.max_wall),
            ("deadline", parse_deadline(args.deadline)),
        )
        budgets = {k: v for k, v in given if v is not None}
        if budgets:
            goal["budgets"] = budgets
        if args.verify:
            goal["verify"] = [{"cmd": c} for c in args.verify]
        if args.tool:
            goal["tools"] = args.tool
        if (progress := progress_params(args)) is not None:
            goal["progress"] = progress
        if (sandbox := sandbox_params(args)) is not None:
            goal["sandbox"] = sandbox
        params = {
            "key": args.key,
            "trigger": _trigger(args),
            "timezone": args.timezone,
            "goal": goal,
            "misfire": args.misfire,
            "concurrency": args.concurrency,
            "startingDeadlineSeconds": args.starting_deadline,
        }
        created = await client.call("schedule/add", params)
        print(json.dumps(created, indent=2, sort_keys=True) if args.json else _line(Schedule.model_validate(created)))
        for warning in created.get("warnings", []):  # the daemon's: what each fire's goal cannot do
            print(f"warning: {warning}", file=sys.stderr)
        return 0
    if action == "list":
        result = await client.call("schedule/list")
        if args.json:
            print(json.dumps(result["schedules"], indent=2, sort_keys=True))
        elif not result["schedules"]:
            print("no schedules", file=sys.stderr)
        else:
            print(HEADER)
            for s in result["schedules"]:
                print(_line(Schedule.model_validate(s)))
        return 0
    if action == "rm":
        removed = await client.call("schedule/remove", {"scheduleId": args.schedule})
        if args.json:
            print(json.dumps(removed, indent=2, sort_keys=True))
        else:  # the answer of an older daemon is {}
            name = _name(Schedule.model_validate(removed)) if removed else args.schedule
            print(f"removed schedule {name}; its runs and goals stay")
        return 0
    if action == "runs":
        result = await client.call("schedule/runs", {"scheduleId": args.schedule, "limit": args.limit})
        if args.json:
            print(json.dumps(result["runs"], indent=2, sort_keys=True))
        elif not result["runs"]:
            print(f"schedule {args.schedule} has no runs yet", file=sys.stderr)
        else:
            for raw in result["runs"]:
                r = ScheduleRun.model_validate(raw)
                goal_ref = f" -> {r.goal_id}: {await _ended(client, r.goal_id)}" if r.goal_id else ""
                print(f"{_run_line(r)}{goal_ref}")
        return 0
    if action in ("suspend", "resume", "run"):
        return await _change(client, args)
    raise UsageError("usage: goald schedule add|list|rm|runs|suspend|resume|run")


async def _change(client: Connection, args: argparse.Namespace) -> int:
    """``schedule suspend``, ``resume`` and ``run``: each says what it did."""
    action = args.schedule_command
    ref = {"scheduleId": args.schedule}
    if action == "suspend":
        out = await client.call("schedule/suspend", ref)
        s = Schedule.model_validate(out)
        said = f"suspended schedule {_name(s)}: its instants are recorded 'skipped (suspended)' until it is resumed"
    elif action == "resume":
        out = await client.call("schedule/resume", ref)
        s = Schedule.model_validate(out["schedule"])
        said = f"resumed schedule {_name(s)}"
        if out["run"] is not None:
            said += f"; {_run_line(ScheduleRun.model_validate(out['run']))}"
        elif s.misfire == "skip":
            said += "; nothing fired for the instants skipped while suspended (misfire policy skip)"
    else:
        out = await client.call("schedule/run", ref)
        said = f"schedule {args.schedule}: {_run_line(ScheduleRun.model_validate(out))}"
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        print(said)
    return 0
