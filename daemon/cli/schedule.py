"""The CLI's ``goald schedule add|list|rm|runs``.

Times of a schedule are shown in the schedule's own zone (``--utc``: in UTC), to the second, with
how far away they are ("in 1m20s"); ``schedule runs`` says how the goal each run started ended.
"""

from __future__ import annotations

import argparse
import json
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from daemon.cli.goal import progress_params, sandbox_params
from daemon.cli.parser import UsageError, parse_deadline
from daemon.client import Connection
from daemon.display import age, status_text, use_utc, when
from daemon.rpc.protocol import RpcError


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


def _line(s: dict[str, Any]) -> str:
    trig = s["trigger"]
    tz = _zone(s["timezone"])
    what = trig.get("expr") or (f"every {trig['seconds']:g}s" if trig["kind"] == "interval" else "once")
    nxt = s.get("nextFireAt")
    next_text = f"{when(nxt, tz)} ({age(nxt)})" if nxt else "-"
    last = f"{s.get('lastOutcome')} ({s.get('lastReason')})" if s.get("lastOutcome") else "never fired"
    return f"{s['id']}  {s.get('key') or '-'}  {trig['kind']} {what} {s['timezone']}  next {next_text}  last {last}"


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
        budgets = {k: v for k, v in (("max_rounds", args.max_rounds), ("max_tokens_total", args.max_tokens)) if v}
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
        print(json.dumps(created, indent=2, sort_keys=True) if args.json else _line(created))
        return 0
    if action == "list":
        result = await client.call("schedule/list")
        if args.json:
            print(json.dumps(result["schedules"], indent=2, sort_keys=True))
        else:
            for s in result["schedules"]:
                print(_line(s))
        return 0
    if action == "rm":
        await client.call("schedule/remove", {"scheduleId": args.schedule})
        return 0
    if action == "runs":
        result = await client.call("schedule/runs", {"scheduleId": args.schedule, "limit": args.limit})
        if args.json:
            print(json.dumps(result["runs"], indent=2, sort_keys=True))
        else:
            for r in result["runs"]:
                goal_ref = f" -> {r['goalId']}: {await _ended(client, r['goalId'])}" if r.get("goalId") else ""
                print(f"{when(r['scheduledFor'])}  {r['outcome']}  {r['reason']}{goal_ref}")
        return 0
    raise UsageError("usage: goald schedule add|list|rm|runs")
