"""``goald goal add|pause|resume|cancel|edit|delete``, through the daemon, and the dispatch of every
``goald goal`` command; and the params from the command line that goals and schedules share
(budgets, verification, progress, sandbox). The commands that read goals (``list``, ``show``,
``logs``) are :mod:`daemon.cli.goal_view`.

A goal is named by its key, its id or a unique prefix of its id; the daemon resolves it (an
ambiguous prefix is answered with the candidates). ``goal delete`` asks before it removes anything
unless ``--yes``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from daemon.cli.branches import goal_commit, goal_diff
from daemon.cli.goal_view import goal_list, goal_logs, goal_show
from daemon.cli.parser import EXIT_CONFLICT, EXIT_FAILURE, EXIT_OK, UsageError, parse_deadline, print_json
from daemon.cli.questions import goal_answer, goal_questions, goal_revoke, goal_withdraw
from daemon.cli.transfer import goal_export, goal_import
from daemon.client import Connection
from daemon.display import goal_line, status_text, use_utc, when
from daemon.rpc.protocol import ErrorCode, RpcError
from daemon.rpc.views import GoalView

#: Length of a whole session id (``ses_`` and 26 characters); anything shorter is a prefix.
_SESSION_ID_LEN = 30


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
        goal = GoalView.model_validate(await client.call("goal/get", {"goalId": target}))  # an id, prefix or key
        return goal.session_id
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
        raise UsageError(
            "usage: goald goal add|list|show|pause|resume|cancel|answer|withdraw|questions|revoke|diff|commit|replay"
            "|edit|logs|delete"
        )
    handler: Callable[[Connection, argparse.Namespace], Awaitable[int]] = GOAL_ACTIONS[action]
    return await handler(client, args)


def _absolute(path: str | None) -> str | None:
    """A path given on the command line, absolute (the daemon resolves it, not in the CLI's directory)."""
    return os.path.abspath(os.path.expanduser(path)) if path else None


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
        "repo": _absolute(args.repo),
        "base": args.base,
        "branch": args.branch,
        "commitOnComplete": args.commit_on_complete or None,
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


async def goal_replay(client: Connection, args: argparse.Namespace) -> int:
    """``goal replay KEY [--model M] [--key K] [budgets]``: the same goal from the same start."""
    params: dict[str, Any] = {"goalId": args.goal, "model": args.model, "key": args.key}
    params["budgets"] = await _changed_budgets(client, args)
    created = await client.call("goal/replay", {k: v for k, v in params.items() if v is not None})
    if args.json:
        print_json(created)
    else:
        start = (
            f"on branch {created['branch']} from {created['baseCommit']}"
            if created.get("branch")
            else f"from its recorded start ({created.get('startFiles', 0)} file(s)) in {created['workdir']}"
        )
        print(f"{created['goalId']} replays {args.goal} {start}")
    return EXIT_OK


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
    edited = GoalView.model_validate(g)
    if edited.status.value == "exhausted" and _budgets(args) is not None:
        # As systemctl after an edit of a unit: the change is saved, the next command is named.
        ref = edited.key or edited.id
        print(
            f"note: goal {ref} is still exhausted: an edit changes its budgets only;"
            f" `goald goal resume {ref}` resumes it with them",
            file=sys.stderr,
        )
    return EXIT_OK


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
    g = GoalView.model_validate(await client.call("goal/get", {"goalId": args.goal}))
    if g.status.value in ("active", "paused", "waiting"):
        print(f"goald: goal {g.id} is {status_text(g)}: cancel it before deleting it", file=sys.stderr)
        return EXIT_CONFLICT
    if not args.yes:
        prompt = (
            f"delete goal {g.id} ({status_text(g)}, created {when(g.created_at)}: {g.title[:60]})"
            f" with its session {g.session_id} and that session's events? The work directory stays. [y/N] "
        )
        print(prompt, end="", file=sys.stderr, flush=True)
        answer = sys.stdin.readline()
        if answer.strip().lower() not in ("y", "yes"):
            hint = "" if answer else " (no answer on stdin: give --yes to delete without asking)"
            print(f"\nnot deleted{hint}", file=sys.stderr)
            return EXIT_FAILURE
    done = await client.call("goal/delete", {"goalId": g.id})
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
    "answer": goal_answer,
    "withdraw": goal_withdraw,
    "questions": goal_questions,
    "revoke": goal_revoke,
    "diff": goal_diff,
    "commit": goal_commit,
    "replay": goal_replay,
}
