"""The ``goald`` command. Thin: parse arguments, call the daemon (or the packages), map outcomes to
exit codes. All logic lives in the packages; ``main(argv) -> int`` never calls ``sys.exit``.

Exit codes (also in the README): 0 success; 1 failure; 2 usage error or invalid input; 3 not
found; 4 conflict or a transition that is not allowed; 69 no daemon answers; 78 invalid
configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from daemon import __version__
from daemon.errors import DaemonError
from daemon.logs import setup_logging

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


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return EXIT_USAGE if exc.code not in (0, None) else EXIT_OK
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return _dispatch(args)
    except UsageError as exc:
        print(f"goald: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


def _settings(args: argparse.Namespace) -> Any:
    from daemon.settings import load_settings

    path = args.config or (Path(os.environ["GOALD_CONFIG"]) if os.environ.get("GOALD_CONFIG") else None)
    return load_settings(path)


def _dispatch(args: argparse.Namespace) -> int:
    from daemon.settings import ConfigError

    cmd = args.command
    if cmd in ("serve", "run", "demo", "acp"):
        # The daemon's files (database, WAL, work directories, logs of tools) are its own: 0600 and
        # 0700, outside systemd (whose units set UMask=0077) too.
        os.umask(0o077)
    if cmd == "demo":
        setup_logging(args.log_level or "WARNING")
        from daemon.demo import run_demo

        return asyncio.run(run_demo(args.state_dir, sys.stdout, plain=args.plain))
    if cmd == "config":
        return _config_check(args)
    if cmd == "acp":
        return _acp(args)
    try:
        settings = _settings(args)
    except ConfigError as exc:
        print(f"goald: invalid configuration: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if cmd == "run":
        return _run(settings, args)
    if cmd == "serve":
        setup_logging(args.log_level or settings.log_level, settings.log_format)
        from daemon.host import Host
        from daemon.lock import StateDirLocked

        try:
            return asyncio.run(Host(settings).run(stdio=args.stdio))
        except StateDirLocked as exc:  # nothing was written: the other daemon's state is untouched
            print(f"goald: {exc}", file=sys.stderr)
            return EXIT_LOCKED
        except ConfigError as exc:  # e.g. an invalid goals file: the file, entry and field are named
            print(f"goald: invalid configuration: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        except RuntimeError as exc:
            print(f"goald: {exc}", file=sys.stderr)
            return EXIT_FAILURE
    setup_logging(args.log_level or "WARNING")
    socket_path = args.socket or settings.socket_path
    from daemon.commands import COMMANDS

    handler: Callable[[Any, argparse.Namespace], Awaitable[int]] | None = COMMANDS.get(cmd)
    if handler is None:
        raise UsageError(f"unknown command {cmd}")
    return asyncio.run(_with_client(socket_path, handler, args))


async def _with_client(
    socket_path: Path, handler: Callable[[Any, argparse.Namespace], Awaitable[int]], args: argparse.Namespace
) -> int:
    from daemon.client import Client, DaemonUnavailable
    from daemon.protocol import ErrorCode, RpcError

    try:
        client = await Client.connect(socket_path)
    except DaemonUnavailable as exc:
        print(f"goald: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    try:
        return await handler(client, args)
    except RpcError as exc:
        print(f"goald: {exc.message}", file=sys.stderr)
        codes: dict[int, int] = {
            ErrorCode.NOT_FOUND: EXIT_NOT_FOUND,
            ErrorCode.CONFLICT: EXIT_CONFLICT,
            ErrorCode.INVALID_TRANSITION: EXIT_CONFLICT,
            ErrorCode.INVALID_PARAMS: EXIT_USAGE,
        }
        return codes.get(exc.code, EXIT_FAILURE)
    except ConnectionError as exc:
        print(f"goald: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    finally:
        await client.close()


def _acp(args: argparse.Namespace) -> int:
    from daemon.acp import acp_settings, claim_stdio, run_acp
    from daemon.settings import ConfigError

    path = args.config or (Path(os.environ["GOALD_CONFIG"]) if os.environ.get("GOALD_CONFIG") else None)
    try:
        settings = acp_settings(path, args.state_dir)
    except ConfigError as exc:
        print(f"goald: invalid configuration: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    setup_logging(args.log_level or settings.log_level, settings.log_format)
    # From here on stdout carries ACP messages only (see daemon.acp.serve).
    proto_in, proto_out = claim_stdio()
    return asyncio.run(run_acp(settings, proto_in, proto_out))


def _run(settings: Any, args: argparse.Namespace) -> int:
    from daemon.oneshot import RunOptions, read_text, run_oneshot

    setup_logging(args.log_level or "WARNING")
    for name in ("max_tokens", "max_steps"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    text = read_text(args.text)
    if not text.strip():
        raise UsageError("goald run needs a non-empty TEXT (or - and text on stdin)")
    opts = RunOptions(
        text=text,
        model=args.model,
        workdir=args.workdir,
        state_dir=args.state_dir,
        as_json=args.json,
        max_tokens=args.max_tokens,
        max_steps=args.max_steps,
    )
    try:
        return asyncio.run(run_oneshot(settings, opts, sys.stdout, sys.stderr))
    except BrokenPipeError:
        # Whoever read stdout went away (`goald run ... | head`): not worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILURE


def _config_check(args: argparse.Namespace) -> int:
    from daemon.settings import ConfigError, load_settings

    if args.config_command != "check":
        raise UsageError("usage: goald config check [--config FILE]")
    path = args.check_config or args.config
    if path is None and os.environ.get("GOALD_CONFIG"):
        path = Path(os.environ["GOALD_CONFIG"])
    try:
        settings = load_settings(path)
        if settings.goals_file is not None:
            # The declared goals and schedules are configuration too: checked as the daemon would
            # at start (nothing is written; the store is not opened).
            from daemon.declared import check_declared
            from daemon.host import Host

            check_declared(settings.goals_file, Host(settings))
    except ConfigError as exc:
        print(f"goald: invalid configuration: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(json.dumps(settings.masked(), indent=2, sort_keys=True))
    return EXIT_OK


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


def entrypoint() -> None:
    """Console-script entry point."""
    sys.exit(main())
