"""``goald goal add|list|show|pause|resume|cancel|edit|logs|delete``, through the daemon; and the
params from the command line that goals and schedules share (budgets, verification, progress,
sandbox).

A goal is named by its key, its id or a unique prefix of its id; the daemon resolves it (an
ambiguous prefix is answered with the candidates). ``goal show`` is the describe view
(``goal/describe``); with ``--json`` it prints the goal as ``goal/get`` does, the shape scripts
read. ``goal delete`` asks before it removes anything unless ``--yes``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from agent import parse_payload
from daemon.cli.parser import EXIT_CONFLICT, EXIT_FAILURE, EXIT_OK, UsageError, parse_deadline
from daemon.cli.transfer import goal_export, goal_import
from daemon.client import Connection
from daemon.display import (
    TERMINAL,
    GoalDisplay,
    describe_event,
    describe_lines,
    goal_line,
    goal_table,
    status_text,
    use_utc,
    watch_goal,
    when,
)
from daemon.rpc.protocol import ErrorCode, RpcError
from goals import GOAL_CHANGED, GoalChanged

#: Length of a whole session id (``ses_`` and 26 characters); anything shorter is a prefix.
_SESSION_ID_LEN = 30


def print_json(data: Any) -> None:
    """Print ``data`` as indented JSON."""
    print(json.dumps(data, indent=2, sort_keys=True, default=str))


def _budgets(args: argparse.Namespace) -> dict[str, Any] | None:
    b = {
        "maxRounds": getattr(args, "max_rounds", None),
        "maxTokensTotal": getattr(args, "max_tokens", None),
        "maxCost": getattr(args, "max_cost", None),
        "maxWallSeconds": getattr(args, "max_wall", None),
        "deadline": parse_deadline(getattr(args, "deadline", None)),
    }
    b = {k: v for k, v in b.items() if v is not None}
    return b or None


async def _changed_budgets(client: Connection, args: argparse.Namespace) -> dict[str, Any] | None:
    """The goal's budgets with those given on the command line changed, the others kept.

    ``goal/update`` and ``goal/resume`` replace a goal's budgets as a whole; ``--max-rounds 20`` on
    its own must not drop the token or cost budget the goal already has.
    """
    given = _budgets(args)
    if given is None:
        return None
    current = (await client.call("goal/get", {"goalId": args.goal}))["budgets"]
    return {**{k: v for k, v in current.items() if v is not None}, **given}


def _verify(args: argparse.Namespace) -> list[dict[str, Any]] | None:
    cmds = getattr(args, "verify", None)
    if not cmds:
        return None
    timeout = getattr(args, "verify_timeout", 300.0)
    return [{"cmd": c, "timeout": timeout} for c in cmds]


def sandbox_params(args: argparse.Namespace) -> dict[str, Any] | None:
    """The ``sandbox`` object of a goal from the command line (``None``: no flag given).

    Raises:
        UsageError: a malformed ``--secret``.
    """
    out: dict[str, Any] = {}
    allow = getattr(args, "network_allow", None)
    if allow and getattr(args, "network", None) is not None:
        raise UsageError(f"--network {args.network} and --network-allow: one or the other")
    if allow:
        out["network"] = {"allow": allow}
    elif getattr(args, "network", None) is not None:
        out["network"] = args.network
    if getattr(args, "read_only_path", None):
        out["readOnlyPaths"] = args.read_only_path
    if getattr(args, "max_processes", None) is not None:
        out["maxProcesses"] = args.max_processes
    if getattr(args, "max_memory", None) is not None:
        out["maxMemoryMb"] = args.max_memory
    if getattr(args, "max_disk", None) is not None:
        out["maxDiskMb"] = args.max_disk
    for item in getattr(args, "secret", None) or []:
        name, _, where = item.partition("=")
        kind, _, ref = where.partition(":")
        if not name or kind not in ("env", "credential") or not ref:
            raise UsageError(f"--secret {item!r}: expected NAME=env:VARIABLE or NAME=credential:FILE")
        out.setdefault("secrets", {})[name] = {kind: ref}
    return out or None


def progress_params(args: argparse.Namespace) -> dict[str, Any] | None:
    """The ``progress`` command of a goal from the command line (``None``: none given)."""
    cmd = getattr(args, "progress", None)
    return {"cmd": cmd, "timeout": args.progress_timeout} if cmd else None


async def goal_session(client: Connection, target: str) -> str:
    """The session a ``goal_…`` id, a session id prefix or a whole session id names."""
    if not target.startswith("ses_"):
        goal = await client.call("goal/get", {"goalId": target})  # a goal id, id prefix or key
        return str(goal["sessionId"])
    if target.startswith("ses_") and len(target) < _SESSION_ID_LEN:
        found = (await client.call("session/list", {"prefix": target, "limit": 2}))["sessions"]
        if not found:
            raise RpcError(ErrorCode.NOT_FOUND, f"no session {target}")
        if len(found) > 1:
            # Like an ambiguous goal id prefix: invalid input (exit 2), not "not found".
            raise RpcError(ErrorCode.INVALID_PARAMS, f"session id prefix {target!r} is ambiguous")
        return str(found[0]["sessionId"])
    return target


async def goal(client: Connection, args: argparse.Namespace) -> int:
    action = args.goal_command
    use_utc(getattr(args, "utc", False))
    if action is None:
        raise UsageError("usage: goald goal add|list|show|pause|resume|cancel|edit|logs|delete")
    handler: Callable[[Connection, argparse.Namespace], Awaitable[int]] = GOAL_ACTIONS[action]
    return await handler(client, args)


async def goal_add(client: Connection, args: argparse.Namespace) -> int:
    params = {
        "objective": args.objective,
        "title": args.title,
        "key": args.key,
        "budgets": _budgets(args),
        "verify": _verify(args),
        "model": args.model,
        "workdir": args.workdir,
        "sessionId": args.session,
        "idempotencyKey": args.idempotency_key,
        "stallRounds": args.stall_rounds,
        "infraRetries": args.infra_retries,
        "tools": args.tool,
        "progress": progress_params(args),
        "sandbox": sandbox_params(args),
        "keepWorkdir": args.keep_workdir,
        "nodeLabel": args.node_label,
    }
    created = await client.call("goal/create", params)
    if args.json:
        print_json(created)
    else:
        print(f"{created['goalId']} on session {created['sessionId']}")
    if not params["verify"]:
        # Once, on stderr (stdout stays the ids): its completion will rest on the model's word alone.
        print(
            "note: no --verify command: the goal will complete unverified (its completion is the model's word)",
            file=sys.stderr,
        )
    for warning in created.get("warnings", []):  # the daemon's: what the goal as given cannot do
        print(f"warning: {warning}", file=sys.stderr)
    return EXIT_OK


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
    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"--since {raw!r}: give an age such as 30m, 2h or 1d, or an ISO 8601 instant") from None
    if value.tzinfo is None:
        raise UsageError(f"--since {raw!r} needs a time zone (e.g. Z or +01:00)")
    return value.isoformat()


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
    lines = goal_table(goals) if goals else ["no goals"]
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
    for line in goal_table(goals):
        print(line)
    if len(goals) < total:
        print(f"({len(goals)} of {total} goals shown: --limit {args.limit})", file=sys.stderr)
    return EXIT_OK


async def goal_show(client: Connection, args: argparse.Namespace) -> int:
    if args.watch:
        return await watch_goal(client, await client.call("goal/get", {"goalId": args.goal}), as_json=args.json)
    if args.json:
        print_json(await client.call("goal/get", {"goalId": args.goal}))
    else:
        print("\n".join(describe_lines(await client.call("goal/describe", {"goalId": args.goal}))))
    return EXIT_OK


def _status_change(method: str) -> Callable[[Connection, argparse.Namespace], Awaitable[int]]:
    async def run(client: Connection, args: argparse.Namespace) -> int:
        if method == "goal/resume" and (args.all or args.goal is None):
            return await goal_resume_all(client, args)
        params: dict[str, Any] = {"goalId": args.goal}
        if method == "goal/resume":
            params["budgets"] = await _changed_budgets(client, args)
        if method == "goal/pause" and args.reason is not None:
            params["reason"] = args.reason  # the operator's words, kept with the pause
        g = await client.call(method, params)
        if args.json:
            print_json(g)
        else:
            print(goal_line(g))
        return EXIT_OK

    return run


async def goal_edit(client: Connection, args: argparse.Namespace) -> int:
    g = await client.call(
        "goal/update",
        {
            "goalId": args.goal,
            "objective": args.objective,
            "title": args.title,
            "budgets": await _changed_budgets(client, args),
            "verify": _verify(args),
        },
    )
    if args.json:
        print_json(g)
    else:
        print(goal_line(g))
    if g.get("status") == "exhausted" and _budgets(args) is not None:
        # As systemctl after an edit of a unit: the change is saved, the next command is named.
        ref = g.get("key") or g["id"]
        print(
            f"note: goal {ref} is still exhausted: an edit changes its budgets only;"
            f" `goald goal resume {ref}` resumes it with them",
            file=sys.stderr,
        )
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
    g = await client.call("goal/get", {"goalId": args.goal})
    gid, sid = g["id"], g["sessionId"]
    live = args.follow and not args.json and sys.stdout.isatty()
    with GoalDisplay(live=live) as view:
        after = await _tail_start(client, sid, args.tail) if since is None else 0
        ended = g["status"] in TERMINAL  # its ending event may be before the tail
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


async def goal_resume_all(client: Connection, args: argparse.Namespace) -> int:
    """``goal resume --all [--reason R]``: every paused goal (of that reason), each on its own."""
    if not args.all:
        raise UsageError("goald goal resume needs a GOAL, or --all (with --reason to choose which)")
    if args.goal is not None:
        raise UsageError("goald goal resume --all takes no GOAL: leave it out, or drop --all")
    if _budgets(args) is not None:
        raise UsageError("goald goal resume --all keeps each goal's budgets: resume one goal to change its budgets")
    result = await client.call("goal/resumeAll", {"reason": args.reason})
    if args.json:
        print_json(result)
    else:
        for r in result["results"]:
            print(goal_line(r["goal"]) if r["goal"] is not None else f"{r['goalId']}  not resumed: {r['error']}")
        if not result["results"]:
            which = f" paused for {args.reason}" if args.reason else " paused"
            print(f"no goals{which}", file=sys.stderr)
    return EXIT_FAILURE if any(r["error"] for r in result["results"]) else EXIT_OK


async def goal_delete(client: Connection, args: argparse.Namespace) -> int:
    """``goal delete``: an ended goal, with its session and events once confirmed (``--yes``)."""
    g = await client.call("goal/get", {"goalId": args.goal})
    if g["status"] in ("active", "paused"):
        print(f"goald: goal {g['id']} is {status_text(g)}: cancel it before deleting it", file=sys.stderr)
        return EXIT_CONFLICT
    if not args.yes:
        prompt = (
            f"delete goal {g['id']} ({status_text(g)}, created {when(g['createdAt'])}: {g['title'][:60]})"
            f" with its session {g['sessionId']} and that session's events? The work directory stays. [y/N] "
        )
        print(prompt, end="", file=sys.stderr, flush=True)
        answer = sys.stdin.readline()
        if answer.strip().lower() not in ("y", "yes"):
            hint = "" if answer else " (no answer on stdin: give --yes to delete without asking)"
            print(f"\nnot deleted{hint}", file=sys.stderr)
            return EXIT_FAILURE
    done = await client.call("goal/delete", {"goalId": g["id"]})
    if args.json:
        print_json(done)
    else:
        print(f"deleted {done['goal']['id']} and {done['sessionsDeleted']} session(s)")
    return EXIT_OK


GOAL_ACTIONS: dict[str, Callable[[Connection, argparse.Namespace], Awaitable[int]]] = {
    "add": goal_add,
    "list": goal_list,
    "show": goal_show,
    "pause": _status_change("goal/pause"),
    "resume": _status_change("goal/resume"),
    "cancel": _status_change("goal/cancel"),
    "edit": goal_edit,
    "logs": goal_logs,
    "delete": goal_delete,
    "export": goal_export,
    "import": goal_import,
}
