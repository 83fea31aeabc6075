"""The ``goald`` command's arguments and exit codes.

Exit codes (also in the README): 0 success; 1 failure; 2 usage error or invalid input; 3 not
found; 4 conflict or a transition that is not allowed; 69 no daemon answers; 75 another goald
holds the state directory; 77 the caller may not open the socket; 78 invalid configuration.
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from pathlib import Path
from typing import Any

from daemon import __version__
from daemon.cli.examples import add_examples
from daemon.cli.goal_args import add_goal_parser
from daemon.cli.options import (
    JSON_HELP,
    SCHEDULE_HELP,
    Subparsers,
    add_budget_options,
    add_sandbox_options,
)
from daemon.cli.web import add_web_parser
from daemon.errors import DaemonError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_CONFLICT = 4
EXIT_UNAVAILABLE = 69
#: The socket is there but this user may not open it (``EX_NOPERM``, as sysexits.h).
EXIT_NOPERM = 77
#: Another goald holds the state directory (``EX_TEMPFAIL``: try again once it has stopped).
EXIT_LOCKED = 75
EXIT_CONFIG = 78


class UsageError(DaemonError):
    """Bad command-line usage (exit 2)."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="goald", description="goald: a goal-driven autonomous agent daemon")
    parser.add_argument("--version", action="version", version=f"goald {__version__}")
    parser.add_argument("--config", type=Path, default=None, help="TOML settings file (or GOALD_CONFIG)")
    parser.add_argument("--socket", type=Path, default=None, help="control socket (default from settings)")
    parser.add_argument("--log-level", default=None, help="log level on stderr (DEBUG, INFO, WARNING, ERROR)")
    parser.add_argument(
        "--utc", action="store_true", help="show times in UTC (default: the local zone, with its offset)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    # In this order: ``goald --help`` lists the commands as they are added.
    _add_serve_parsers(sub)
    add_goal_parser(sub)
    _add_send_parser(sub)
    _add_schedule_parser(sub)
    _add_store_parser(sub)
    _add_node_parser(sub)
    _add_notify_parser(sub)
    _add_eval_parser(sub)
    _add_config_parser(sub)
    _add_demo_and_run_parsers(sub)
    _add_completion_parser(sub)
    add_web_parser(sub)
    _add_acp_parser(sub)
    add_examples(parser)  # every command's Examples: block (daemon/cli/examples.py)
    return parser


def _add_serve_parsers(sub: Subparsers) -> None:
    """``serve`` and ``status``: the daemon itself."""
    serve = sub.add_parser("serve", help="run the daemon")
    serve.add_argument("--stdio", action="store_true", help="also serve the protocol on stdin/stdout")
    serve.add_argument("--config", type=Path, default=argparse.SUPPRESS, help="TOML settings file")

    status = sub.add_parser("status", help="the daemon's health")
    status.add_argument("--json", action="store_true", help=JSON_HELP)

    reload = sub.add_parser(
        "reload",
        help="re-read the goals file and apply its goals and schedules by key (as SIGHUP and systemctl reload do)",
    )
    reload.add_argument("--json", action="store_true", help=JSON_HELP)


def _add_send_parser(sub: Subparsers) -> None:
    """``send``: a message to a session or a goal's session."""
    send = sub.add_parser("send", help="send a message to a session or a goal's session")
    send.add_argument("target", metavar="SESSION_OR_GOAL", help="a session id (or prefix), or a goal id or key")
    send.add_argument("text", help="the message")
    send.add_argument("--steer", action="store_true", help="deliver into the running turn, at its next step")
    send.add_argument("--context", action="store_true", help="add as context: it wakes no turn by itself")
    send.add_argument("--json", action="store_true", help=JSON_HELP)
    send.add_argument(
        "--reopen",
        action="store_true",
        help="to an ended goal (completed, failed, cancelled, exhausted): resume it with its budgets first"
        " (without it such a message is refused)",
    )
    send.add_argument(
        "--answer",
        action="store_true",
        help="to a goal waiting on its question (SESSION_OR_GOAL: the goal): the message is the answer"
        " (as goald goal answer GOAL TEXT)",
    )
    send.add_argument(
        "--resume",
        action="store_true",
        help="to a paused goal: resume it as well (without it the message runs one turn and the goal stays paused)",
    )


def _add_eval_parser(sub: Subparsers) -> None:
    """``eval run|report SUITE.toml``: compare models on your own goals (:mod:`daemon.cli.evals`)."""
    ev = sub.add_parser("eval", help="compare models on a suite of tasks, N runs each")
    esub = ev.add_subparsers(dest="eval_command", metavar="ACTION")
    for action, text in (
        ("run", "start the suite's runs no goal exists for yet, wait for all, and report"),
        ("report", "the suite's table, from its runs' goals (written beside the suite)"),
    ):
        a = esub.add_parser(action, help=text)
        a.add_argument("suite", metavar="SUITE.toml", help="the suite file")
        a.add_argument("--out", metavar="DIR", help="write the report here (default: the suite's directory)")


def _add_schedule_parser(sub: Subparsers) -> None:
    """``schedule ACTION``: add, list, remove, suspend, resume and run schedules and see their runs."""
    sched = sub.add_parser("schedule", help="manage schedules")
    ssub = sched.add_subparsers(dest="schedule_command", metavar="ACTION")
    _add_schedule_add(ssub)
    slist = ssub.add_parser("list", help="list schedules with next fire time and last outcome")
    slist.add_argument("--json", action="store_true", help=JSON_HELP)
    srm = ssub.add_parser("rm", help="remove a schedule (its runs and goals stay)")
    srm.add_argument("schedule", help=SCHEDULE_HELP)
    srm.add_argument("--json", action="store_true", help=JSON_HELP)
    sruns = ssub.add_parser("runs", help="a schedule's runs, and how the goal each started ended")
    sruns.add_argument("schedule", help=SCHEDULE_HELP)
    sruns.add_argument("--limit", type=int, default=20, metavar="N", help="the latest N runs (default 20)")
    sruns.add_argument("--json", action="store_true", help=JSON_HELP)
    ssuspend = ssub.add_parser(
        "suspend", help="stop a schedule firing: each instant that comes due is recorded 'skipped (suspended)'"
    )
    sresume = ssub.add_parser(
        "resume",
        help="let a suspended schedule fire again; misfire coalesce fires once now for the latest instant skipped"
        " (within --starting-deadline), skip fires nothing",
    )
    srun = ssub.add_parser(
        "run",
        help="fire a schedule now, by hand (like kubectl create job --from=cronjob): one run marked manual;"
        " the concurrency policy and a suspension do not apply, the next fire time stays",
    )
    for p in (ssuspend, sresume, srun):
        p.add_argument("schedule", help=SCHEDULE_HELP)
        p.add_argument("--json", action="store_true", help=JSON_HELP)


def _add_schedule_add(ssub: Subparsers) -> None:
    """``schedule add``: when it fires, and the goal each fire creates."""
    sadd = ssub.add_parser("add", help="add (or update, by --key) a schedule that creates a goal")
    trig = sadd.add_mutually_exclusive_group(required=True)
    trig.add_argument("--cron", help='5 fields, e.g. "0 3 * * *" (in --timezone)')
    trig.add_argument("--every", type=float, metavar="SECONDS", help="fire every SECONDS seconds")
    trig.add_argument("--at", help="one-shot ISO 8601 instant with a time zone")
    sadd.add_argument(
        "--timezone", default="UTC", help="IANA zone of the cron fields, e.g. Europe/Berlin (default UTC)"
    )
    sadd.add_argument("--key", help="a unique name; adding the same key again updates the schedule")
    sadd.add_argument(
        "--misfire", choices=["coalesce", "skip"], default="coalesce", help="fires missed while down: one run, or none"
    )
    sadd.add_argument(
        "--concurrency",
        choices=["forbid", "replace", "allow"],
        default="forbid",
        help="when the previous goal still runs: skip this fire, cancel the previous, or run both",
    )
    sadd.add_argument(
        "--starting-deadline", type=float, metavar="SECONDS", help="a fire later than this many seconds is skipped"
    )
    sadd.add_argument("objective", help="the objective of each goal the schedule starts")
    sadd.add_argument("--title", help="the goals' title (default: the schedule's key or id and the fire time)")
    sadd.add_argument("--model", help="PROVIDER:MODEL (default: the configured default_model)")
    add_budget_options(sadd)  # each goal's own budgets (--deadline: one instant, the same for each)
    sadd.add_argument("--verify", action="append", metavar="CMD", help="a verification command (repeatable)")
    sadd.add_argument("--tool", action="append", metavar="PATTERN", help="the goal's tool allowlist (repeatable)")
    add_sandbox_options(sadd)
    sadd.add_argument("--json", action="store_true", help=JSON_HELP)


def _add_store_parser(sub: Subparsers) -> None:
    """``store ACTION``: the database's sizes, retention, space and backups."""
    store = sub.add_parser("store", help="the database: sizes, retention, space")
    stsub = store.add_subparsers(dest="store_command", metavar="ACTION", required=True)
    ststats = stsub.add_parser("stats", help="database size, rows per table, the largest sessions")
    ststats.add_argument("--top", type=int, default=10, help="how many of the largest sessions")
    ststats.add_argument("--json", action="store_true", help=JSON_HELP)
    stcompact = stsub.add_parser("compact", help="run retention now and give free space back")
    stcompact.add_argument("--json", action="store_true", help=JSON_HELP)
    stsub.add_parser("vacuum", help="offline full VACUUM (refused while a daemon runs)")
    stbackup = stsub.add_parser("backup", help="a consistent copy of the database (online, through the daemon)")
    stbackup.add_argument("path", type=Path, metavar="PATH", help="the copy to write (must not exist)")
    strestore = stsub.add_parser(
        "restore",
        help="copy a backup into the state directory's database (offline; SQLite only)",
        description="Restore a file written by 'goald store backup' into this state directory's database,"
        " then run PRAGMA integrity_check on it. Offline only: refused (exit 75) while a daemon holds the"
        " state directory. Procedure: stop the daemon, restore, check the answer is ok, start."
        " A PostgreSQL store is restored with pg_restore from a pg_dump copy, not with this command.",
    )
    strestore.add_argument("path", type=Path, metavar="BACKUP", help="the backup file to restore")
    strestore.add_argument(
        "--replace",
        action="store_true",
        help="restore over an existing database (it is renamed to <database>.before-restore, not deleted)",
    )


def _add_node_parser(sub: Subparsers) -> None:
    """``node ACTION``: the daemons sharing one PostgreSQL database (a cluster)."""
    node = sub.add_parser("node", help="the cluster's nodes (daemons on one PostgreSQL database)")
    nsub = node.add_subparsers(dest="node_command", metavar="ACTION", required=True)
    nlist = nsub.add_parser("list", help="every node: alive or not, leases held of its limit, last heartbeat, labels")
    nlist.add_argument("--json", action="store_true", help=JSON_HELP)
    drain = nsub.add_parser(
        "drain", help="make a node hand its sessions back at their next idle (for maintenance); it takes no new work"
    )
    drain.add_argument(
        "node", nargs="?", default=None, metavar="NODE", help="the node's name or id (default: the node answering)"
    )
    drain.add_argument("--undo", action="store_true", help="let the node take work again")
    drain.add_argument("--json", action="store_true", help=JSON_HELP)


def _add_notify_parser(sub: Subparsers) -> None:
    """``notify test``: the notification sinks."""
    notify = sub.add_parser("notify", help="notifications")
    nsub = notify.add_subparsers(dest="notify_command", metavar="ACTION", required=True)
    ntest = nsub.add_parser("test", help="send a test message to one sink (or every sink) and show the outcome")
    ntest.add_argument("sink", nargs="?", default=None, help="the sink's name (default: every sink)")
    ntest.add_argument("--json", action="store_true", help=JSON_HELP)


def _add_config_parser(sub: Subparsers) -> None:
    """``config check``: the effective settings and their warnings."""
    config = sub.add_parser("config", help="configuration")
    csub = config.add_subparsers(dest="config_command", metavar="ACTION")
    check = csub.add_parser("check", help="validate and print the effective settings (secrets masked)")
    check.add_argument("--config", dest="check_config", type=Path, default=None, help="TOML settings file")
    check.add_argument(
        "--strict",
        action="store_true",
        help="fail (exit 78) on warnings too: an unset key variable, a model without a provider, a cost cap"
        " on a model without a price, a path that does not exist",
    )


def _add_demo_and_run_parsers(sub: Subparsers) -> None:
    """``demo`` and ``run``: an embedded host, no daemon needed."""
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


def _add_completion_parser(sub: Subparsers) -> None:
    """``completion SHELL``: a completion script generated from this parser."""
    completion = sub.add_parser(
        "completion", help='print a shell completion script (e.g. eval "$(goald completion bash)")'
    )
    completion.add_argument("shell", choices=["bash", "zsh", "fish"], help="the shell")


def _add_acp_parser(sub: Subparsers) -> None:
    """``acp``: the Agent Client Protocol on stdio."""
    acp = sub.add_parser("acp", help="serve the Agent Client Protocol on stdio (for editors such as Zed)")
    acp.add_argument("--config", type=Path, default=argparse.SUPPRESS, help="TOML settings file")
    acp.add_argument(
        "--state-dir", type=Path, default=None, help="the bridge's state directory (default: STATE_DIR/acp)"
    )


def parse_instant(raw: str, flag: str, invalid: str) -> str:
    """An ISO 8601 instant with a time zone, normalised; ``invalid`` is the error when ``raw`` is not
    one (``flag`` names the option in the time-zone error)."""
    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(invalid) from None
    if value.tzinfo is None:
        raise UsageError(f"{flag} {raw!r} needs a time zone (e.g. Z or +01:00)")
    return value.isoformat()


def parse_deadline(raw: str | None, flag: str = "--deadline") -> str | None:
    """Validate an ISO 8601 instant with a time zone (``flag`` names the option in errors)."""
    if raw is None:
        return None
    return parse_instant(raw, flag, f"{flag} {raw!r} is not an ISO 8601 date-time")


def print_json(data: Any) -> None:
    """Print ``data`` as indented JSON (a command's ``--json``)."""
    print(json.dumps(data, indent=2, sort_keys=True, default=str))
