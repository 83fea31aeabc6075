"""``goald goal list|show|logs``: the commands that read goals, once or as they change.

``goal list`` (``--watch``: the table again whenever a goal changes), ``goal show`` (the describe
view; ``--json`` prints the goal as ``goal/get`` does, the shape scripts read; ``--watch`` follows
it) and ``goal logs`` (the goal's session events, ``--tail``/``--since``, ``--follow`` until the goal
ends). The commands that change a goal are :mod:`daemon.cli.goal`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from agent import parse_payload
from daemon.cli.goal_show import describe_lines
from daemon.cli.parser import EXIT_OK, UsageError, parse_instant, print_json
from daemon.cli.questions import approval_lines, open_question_lines
from daemon.client import Connection
from daemon.display import TERMINAL, GoalDisplay, describe_event, goal_table, watch_goal, when
from daemon.rpc.views import GoalView
from goals import GOAL_CHANGED, GoalChanged

_AGE = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(raw: str | None, now: datetime | None = None) -> str | None:
    """``--since``: an age (``30m``, ``2h``, ``1d``) or an ISO 8601 instant with a time zone."""
    if raw is None:
        return None
    m = _AGE.match(raw.strip())
    if m:
        ago = timedelta(seconds=float(m[1]) * _UNIT_SECONDS[m[2]])
        return ((now or datetime.now(UTC)) - ago).isoformat()
    return parse_instant(raw, "--since", f"--since {raw!r}: give an age such as 30m, 2h or 1d, or an ISO 8601 instant")


async def _listed(client: Connection, args: argparse.Namespace) -> tuple[list[dict[str, Any]], int]:
    """``goal list``'s goals (the newest ``--limit``) and how many matched in all."""
    params = {"status": args.status, "schedule": args.schedule, "since": parse_since(args.since)}
    result = await client.call("goal/list", {k: v for k, v in params.items() if v is not None})
    goals = result["goals"]
    if args.limit is not None:
        if args.limit < 1:
            raise UsageError("--limit must be at least 1")
        goals = goals[: args.limit]  # newest first: the latest N
    return goals, len(result["goals"])


async def watch_goals(client: Connection, args: argparse.Namespace) -> int:
    """``goal list --watch``: the table again whenever a goal changes, as ``kubectl get -w`` and
    ``watch`` do: redrawn in place on a terminal, a new table per change otherwise (``--json``: a
    JSON array a line). It follows every session's events live and draws when the listing differs
    from the last one drawn; Ctrl-C (or SIGTERM) ends it with exit 0."""
    import asyncio
    import signal

    tty = sys.stdout.isatty() and not args.json
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await client.call("session/subscribe", {})  # every session, live: any change of a goal
        shown: list[dict[str, Any]] | None = None
        while not stop.is_set():
            goals, total = await _listed(client, args)
            if goals != shown:
                shown = goals
                _draw(goals, total, args, tty)
            note = asyncio.ensure_future(client.next_notification())
            await asyncio.wait({note, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not note.done():
                note.cancel()
            elif note.exception() is not None:
                note.result()  # raises when the daemon closed the connection
    finally:
        stopping.cancel()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return EXIT_OK


def _draw(goals: list[dict[str, Any]], total: int, args: argparse.Namespace, tty: bool) -> None:
    """One drawing of ``goal list --watch``."""
    if args.json:
        print(json.dumps(goals, sort_keys=True, default=str), flush=True)
        return
    lines = goal_table([GoalView.model_validate(g) for g in goals]) if goals else ["no goals"]
    if len(goals) < total:
        lines.append(f"({len(goals)} of {total} goals shown: --limit {args.limit})")
    if tty:  # in place, under a heading as watch(1) gives one
        heading = f"goald goal list --watch: {len(goals)} goal(s), {when(datetime.now(UTC))}; Ctrl-C ends"
        sys.stdout.write("\x1b[H\x1b[2J" + "\n".join([heading, "", *lines]) + "\n")
    else:
        sys.stdout.write("\n".join(lines) + "\n\n")
    sys.stdout.flush()


async def goal_list(client: Connection, args: argparse.Namespace) -> int:
    if args.watch:
        return await watch_goals(client, args)
    goals, total = await _listed(client, args)
    if args.json:
        print_json(goals)
        return EXIT_OK
    if not goals:
        print("no goals", file=sys.stderr)
        return EXIT_OK
    for line in goal_table([GoalView.model_validate(g) for g in goals]):
        print(line)
    if len(goals) < total:
        print(f"({len(goals)} of {total} goals shown: --limit {args.limit})", file=sys.stderr)
    return EXIT_OK


async def goal_show(client: Connection, args: argparse.Namespace) -> int:
    if args.watch:
        return await watch_goal(client, args.goal, as_json=args.json)
    if args.json:
        print_json(await client.call("goal/get", {"goalId": args.goal}))
    else:
        described = await client.call("goal/describe", {"goalId": args.goal})
        print("\n".join(describe_lines(described) + open_question_lines(described) + approval_lines(described)))
    return EXIT_OK


async def goal_logs(client: Connection, args: argparse.Namespace) -> int:
    """The goal's session events; with ``--follow``, new ones as they commit, until the goal ends.
    ``--tail N`` prints the latest N, ``--since`` those since an age or an instant (both: the latest
    N of those), as ``journalctl -n``/``--since`` and ``kubectl logs --tail``/``--since`` do.

    Following also shows the goal (status, reason, rounds, tokens and cost against its budgets) as
    it changes: a live panel under the events on a terminal, else a goal line per change (with
    ``--json`` only the events, one JSON object a line).
    """
    from collections import deque

    from daemon.display import parse_time

    if args.tail is not None and args.tail < 0:
        raise UsageError("--tail must be 0 or more (the number of latest events to print)")
    since = parse_time(parse_since(args.since))
    g = GoalView.model_validate(await client.call("goal/get", {"goalId": args.goal}))
    gid, sid = g.id, g.session_id
    live = args.follow and not args.json and sys.stdout.isatty()
    with GoalDisplay(live=live) as view:
        after = await _tail_start(client, sid, args.tail) if since is None else 0
        ended = g.status.value in TERMINAL  # its ending event may be before the tail
        shown: deque[dict[str, Any]] = deque(maxlen=args.tail)  # all of them without --tail
        while True:
            page = await client.call("session/events", {"sessionId": sid, "afterSeq": after, "limit": 1000})
            for ev in page["events"]:
                if since is None or (at := parse_time(ev["at"])) is None or at >= since:
                    shown.append(ev)
                ended = ended or _ends(ev, gid)
            after = page["lastSeq"]
            if len(page["events"]) < 1000:
                break
        for ev in shown:
            view.event(_event_text(sid, ev["seq"], ev, args.json))
        if not args.follow:
            return EXIT_OK
        # Resuming right after the last event read: nothing committed in between is missed.
        await client.call("session/subscribe", {"sessionId": sid, "afterSeq": after})
        while True:
            if not args.json:
                view.goal(await client.call("goal/get", {"goalId": gid}))
            if ended:
                return EXIT_OK
            note = await client.next_notification()
            if note.get("method") != "session.event":
                continue
            p = note["params"]
            view.event(_event_text(sid, p["seq"], p["event"], args.json))
            ended = _ends(p["event"], gid)


async def _tail_start(client: Connection, sid: str, tail: int | None) -> int:
    """Where to read from for the latest ``tail`` events (``0``: from the start): the session's last
    sequence number less ``tail``. Pruned events leave gaps, so an earlier start may be needed; the
    caller keeps only the last ``tail`` of what it reads."""
    if tail is None:
        return 0
    last = int((await client.call("agent/status", {"sessionId": sid}))["lastSeq"])
    start, need = last, tail
    while start > 0:
        start = max(0, last - need)
        page = await client.call("session/events", {"sessionId": sid, "afterSeq": start, "limit": 1000})
        if len(page["events"]) >= min(tail, 1000) or start == 0:
            return start
        need *= 2  # fewer events than sequence numbers: some were pruned; look further back
    return 0


def _ends(ev: dict[str, Any], goal_id: str) -> bool:
    """Whether ``ev`` ends the goal (a session may hold other goals before or after it)."""
    if ev["type"] != GOAL_CHANGED:
        return False
    changed = parse_payload(ev["type"], ev["data"])
    return isinstance(changed, GoalChanged) and changed.goal_id == goal_id and changed.status in TERMINAL


def _event_text(sid: str, seq: int, ev: dict[str, Any], as_json: bool) -> str:
    if as_json:
        return json.dumps({"sessionId": sid, "seq": seq, **ev}, default=str)
    return f"[{seq:>5}] {when(ev['at'])} {describe_event(ev['type'], ev['data'])}"
