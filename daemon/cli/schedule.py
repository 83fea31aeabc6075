"""The CLI's ``goald schedule add|list|rm|runs``."""

from __future__ import annotations

import argparse
import json
from typing import Any

from daemon.cli.goal import progress_params, sandbox_params
from daemon.cli.parser import UsageError, parse_deadline
from daemon.client import Connection


def _trigger(args: argparse.Namespace) -> dict[str, Any]:
    if args.cron is not None:
        return {"kind": "cron", "expr": args.cron}
    if args.every is not None:
        return {"kind": "interval", "seconds": args.every}
    return {"kind": "date", "at": parse_deadline(args.at)}


def _line(s: dict[str, Any]) -> str:
    trig = s["trigger"]
    what = trig.get("expr") or (f"every {trig['seconds']:g}s" if trig["kind"] == "interval" else f"at {trig.get('at')}")
    last = f"{s.get('lastOutcome')} ({s.get('lastReason')})" if s.get("lastOutcome") else "never fired"
    return (
        f"{s['id']}  {s.get('key') or '-'}  {trig['kind']} {what} {s['timezone']}  "
        f"next {s.get('nextFireAt') or '-'}  last {last}"
    )


async def schedule_command(client: Connection, args: argparse.Namespace) -> int:
    """Run one schedule action."""
    action = args.schedule_command
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
                goal_ref = f" -> {r['goalId']}" if r.get("goalId") else ""
                print(f"{r['scheduledFor']}  {r['outcome']}  {r['reason']}{goal_ref}")
        return 0
    raise UsageError("usage: goald schedule add|list|rm|runs")
