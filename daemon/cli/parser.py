"""The ``goald`` command's arguments and exit codes.

Exit codes (also in the README): 0 success; 1 failure; 2 usage error or invalid input; 3 not
found; 4 conflict or a transition that is not allowed; 69 no daemon answers; 75 another goald
holds the state directory; 78 invalid configuration.
"""

from __future__ import annotations

import argparse
from datetime import datetime
from pathlib import Path

from daemon import __version__
from daemon.errors import DaemonError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_CONFLICT = 4
EXIT_UNAVAILABLE = 69
#: Another goald holds the state directory (``EX_TEMPFAIL``: try again once it has stopped).
EXIT_LOCKED = 75
EXIT_CONFIG = 78


class UsageError(DaemonError):
    """Bad command-line usage (exit 2)."""


def _add_goal_options(p: argparse.ArgumentParser, *, for_edit: bool = False) -> None:
    p.add_argument("--title")
    p.add_argument("--max-rounds", type=int)
    p.add_argument("--max-tokens", type=int, help="total token budget")
    p.add_argument("--max-cost", type=float)
    p.add_argument("--max-wall", type=float, metavar="SECONDS", help="wall time while active")
    p.add_argument("--deadline", help="ISO 8601 with a time zone, e.g. 2026-12-31T23:00:00Z")
    p.add_argument("--verify", action="append", metavar="CMD", help="a verification command (repeatable)")
    p.add_argument("--verify-timeout", type=float, default=300.0)
    if not for_edit:
        p.add_argument("--key")
        p.add_argument("--model", help="PROVIDER:MODEL")
        p.add_argument("--workdir")
        p.add_argument("--session", help="run the goal on an existing session")
        p.add_argument("--idempotency-key")
        p.add_argument("--stall-rounds", type=int)
        p.add_argument(
            "--tool",
            action="append",
            metavar="PATTERN",
            help='allow a tool or shell command pattern (repeatable; e.g. read_file, "shell:git *");'
            " replaces the configured tool_policy for this goal",
        )
        _add_sandbox_options(p)


def _add_sandbox_options(p: argparse.ArgumentParser) -> None:
    """A goal's progress command and its own sandbox settings (merged with ``[goal_sandbox.<key>]``)."""
    p.add_argument("--progress", metavar="CMD", help="a command whose changed output counts as progress")
    p.add_argument("--progress-timeout", type=float, default=60.0, metavar="SECONDS")
    p.add_argument(
        "--network",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the network on (or off) for the goal's commands",
    )
    p.add_argument(
        "--read-only-path", action="append", metavar="PATH", help="a path the goal's commands may read (repeatable)"
    )
    p.add_argument("--max-processes", type=int, metavar="N", help="processes of one command at once")
    p.add_argument("--max-memory", type=int, metavar="MIB", help="memory of one command as a whole, in MiB")
    p.add_argument(
        "--secret",
        action="append",
        metavar="NAME=env:VAR|credential:FILE",
        help="a secret environment variable of the goal's commands, by where the daemon reads it",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="goald", description="goald: a goal-driven autonomous agent daemon")
    parser.add_argument("--version", action="version", version=f"goald {__version__}")
    parser.add_argument("--config", type=Path, default=None, help="TOML settings file (or GOALD_CONFIG)")
    parser.add_argument("--socket", type=Path, default=None, help="control socket (default from settings)")
    parser.add_argument("--log-level", default=None, help="log level on stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the daemon")
    serve.add_argument("--stdio", action="store_true", help="also serve the protocol on stdin/stdout")
    serve.add_argument("--config", type=Path, default=argparse.SUPPRESS, help="TOML settings file")

    status = sub.add_parser("status", help="the daemon's health")
    status.add_argument("--json", action="store_true")

    goal = sub.add_parser("goal", help="manage goals")
    gsub = goal.add_subparsers(dest="goal_command", metavar="ACTION")
    add = gsub.add_parser("add", help="create a goal")
    add.add_argument("objective")
    _add_goal_options(add)
    add.add_argument("--json", action="store_true")
    lst = gsub.add_parser("list", help="list goals")
    lst.add_argument("--status")
    lst.add_argument("--json", action="store_true")
    show = gsub.add_parser("show", help="show one goal")
    show.add_argument("goal")
    show.add_argument("--json", action="store_true")
    show.add_argument("--watch", action="store_true", help="follow changes until the goal stops")
    for action in ("pause", "resume", "cancel"):
        a = gsub.add_parser(action, help=f"{action} a goal")
        a.add_argument("goal")
        a.add_argument("--json", action="store_true")
        if action == "resume":
            a.add_argument("--max-rounds", type=int)
            a.add_argument("--max-tokens", type=int)
            a.add_argument("--max-cost", type=float)
            a.add_argument("--max-wall", type=float)
            a.add_argument("--deadline")
    edit = gsub.add_parser("edit", help="edit a goal's objective, budgets or verification")
    edit.add_argument("goal")
    edit.add_argument("--objective")
    _add_goal_options(edit, for_edit=True)
    edit.add_argument("--json", action="store_true")
    logs = gsub.add_parser("logs", help="a goal's events")
    logs.add_argument("goal")
    logs.add_argument("--follow", "-f", action="store_true")
    logs.add_argument("--json", action="store_true")

    send = sub.add_parser("send", help="send a message to a session or a goal's session")
    send.add_argument("target", metavar="SESSION_OR_GOAL")
    send.add_argument("text")
    send.add_argument("--steer", action="store_true")
    send.add_argument("--context", action="store_true")
    send.add_argument("--json", action="store_true")
    send.add_argument(
        "--reopen",
        action="store_true",
        help="to an ended goal (completed, failed, cancelled, exhausted): resume it with its budgets first"
        " (without it such a message is refused)",
    )
    send.add_argument(
        "--resume",
        action="store_true",
        help="to a paused goal: resume it as well (without it the message runs one turn and the goal stays paused)",
    )

    sched = sub.add_parser("schedule", help="manage schedules")
    ssub = sched.add_subparsers(dest="schedule_command", metavar="ACTION")
    sadd = ssub.add_parser("add", help="add (or update, by --key) a schedule that creates a goal")
    trig = sadd.add_mutually_exclusive_group(required=True)
    trig.add_argument("--cron", help='5 fields, e.g. "0 3 * * *"')
    trig.add_argument("--every", type=float, metavar="SECONDS")
    trig.add_argument("--at", help="one-shot ISO 8601 instant with a time zone")
    sadd.add_argument("--timezone", default="UTC")
    sadd.add_argument("--key")
    sadd.add_argument("--misfire", choices=["coalesce", "skip"], default="coalesce")
    sadd.add_argument("--concurrency", choices=["forbid", "replace", "allow"], default="forbid")
    sadd.add_argument("--starting-deadline", type=float, metavar="SECONDS")
    sadd.add_argument("objective")
    sadd.add_argument("--title")
    sadd.add_argument("--model")
    sadd.add_argument("--max-rounds", type=int)
    sadd.add_argument("--max-tokens", type=int)
    sadd.add_argument("--verify", action="append", metavar="CMD")
    sadd.add_argument("--tool", action="append", metavar="PATTERN", help="the goal's tool allowlist (repeatable)")
    _add_sandbox_options(sadd)
    sadd.add_argument("--json", action="store_true")
    slist = ssub.add_parser("list", help="list schedules with next fire time and last outcome")
    slist.add_argument("--json", action="store_true")
    srm = ssub.add_parser("rm", help="remove a schedule")
    srm.add_argument("schedule")
    sruns = ssub.add_parser("runs", help="a schedule's runs")
    sruns.add_argument("schedule")
    sruns.add_argument("--limit", type=int, default=20)
    sruns.add_argument("--json", action="store_true")

    store = sub.add_parser("store", help="the database: sizes, retention, space")
    stsub = store.add_subparsers(dest="store_command", metavar="ACTION", required=True)
    ststats = stsub.add_parser("stats", help="database size, rows per table, the largest sessions")
    ststats.add_argument("--top", type=int, default=10, help="how many of the largest sessions")
    ststats.add_argument("--json", action="store_true")
    stcompact = stsub.add_parser("compact", help="run retention now and give free space back")
    stcompact.add_argument("--json", action="store_true")
    stsub.add_parser("vacuum", help="offline full VACUUM (refused while a daemon runs)")

    config = sub.add_parser("config", help="configuration")
    csub = config.add_subparsers(dest="config_command", metavar="ACTION")
    check = csub.add_parser("check", help="validate and print the effective settings (secrets masked)")
    check.add_argument("--config", dest="check_config", type=Path, default=None)

    demo = sub.add_parser("demo", help="run the demo goal on the embedded defaults")
    demo.add_argument("--state-dir", type=Path, default=None, help="keep the demo's state here (default: temp)")
    demo.add_argument("--plain", action="store_true", help="plain lines even on a terminal")

    run = sub.add_parser(
        "run",
        help="one prompt in an embedded host, no daemon needed: print the final response",
        description="Exit codes: 0 end_turn; 3 max_tokens or budget; 4 max_steps; 1 error, interrupted or no turn; "
        "130 cancelled or SIGINT; 2 usage error.",
    )
    run.add_argument("text", metavar="TEXT", help="the prompt (- reads it from stdin)")
    run.add_argument("--model", help="PROVIDER:MODEL (e.g. scripted:echo)")
    run.add_argument("--workdir", type=Path, help="the agent's work directory (default: a temporary one)")
    run.add_argument("--state-dir", type=Path, default=None, help="keep the run's state here (default: temp, removed)")
    run.add_argument("--json", action="store_true", help="print the whole RunResult as JSON")
    run.add_argument("--max-tokens", type=int, help="total token budget of the run")
    run.add_argument("--max-steps", type=int, help="model steps per turn")
    run.add_argument("--config", type=Path, default=argparse.SUPPRESS, help="TOML settings file")

    acp = sub.add_parser("acp", help="serve the Agent Client Protocol on stdio (for editors such as Zed)")
    acp.add_argument("--config", type=Path, default=argparse.SUPPRESS, help="TOML settings file")
    acp.add_argument(
        "--state-dir", type=Path, default=None, help="the bridge's state directory (default: STATE_DIR/acp)"
    )
    return parser


def parse_deadline(raw: str | None) -> str | None:
    """Validate an ISO 8601 instant with a time zone."""
    if raw is None:
        return None
    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"--deadline {raw!r} is not an ISO 8601 date-time") from None
    if value.tzinfo is None:
        raise UsageError(f"--deadline {raw!r} needs a time zone (e.g. Z or +01:00)")
    return value.isoformat()
