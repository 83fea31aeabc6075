"""The ``goald`` command. Thin: parse arguments, call the daemon (or the packages), map outcomes to
exit codes (:mod:`daemon.cli.parser`). All logic lives in the packages; ``main(argv) -> int`` never
calls ``sys.exit``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import select
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from daemon import __version__
from daemon.cli.parser import (
    EXIT_CONFIG,
    EXIT_CONFLICT,
    EXIT_FAILURE,
    EXIT_LOCKED,
    EXIT_NOPERM,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    UsageError,
    build_parser,
)
from daemon.client.connection import Connection, DaemonUnavailable, SocketPermissionDenied
from daemon.logs import setup_logging
from daemon.rpc.protocol import ErrorCode, RpcError

if TYPE_CHECKING:
    from daemon.settings import Settings

# Only what every command needs is imported above: the parser and the connection to a daemon. The
# rest (the settings' models, the host, the store, the sandbox, the demo) is imported by the command
# that uses it, so that ``goald goal list`` starts in a fraction of the time ``goald serve`` takes
# to import (tests/daemon/test_cli_imports.py counts what a command loads).

Handler = Callable[[Connection, argparse.Namespace], Awaitable[int]]

#: The commands that talk to a running daemon: name → (module, function), imported when called.
COMMANDS: dict[str, tuple[str, str]] = {
    "status": ("daemon.cli.status", "status"),
    "reload": ("daemon.cli.status", "reload"),
    "goal": ("daemon.cli.goal", "goal"),
    "send": ("daemon.cli.session", "send"),
    "schedule": ("daemon.cli.schedule", "schedule_command"),
    "store": ("daemon.cli.store", "store_command"),
    "node": ("daemon.cli.node", "node_command"),
    "notify": ("daemon.cli.notify", "notify_command"),
    "eval": ("daemon.cli.evals", "eval_command"),
}


def command_handler(cmd: str) -> Handler | None:
    """The function that runs ``cmd`` against a daemon (its module imported now), or ``None``."""
    where = COMMANDS.get(cmd)
    if where is None:
        return None
    handler: Handler = getattr(importlib.import_module(where[0]), where[1])
    return handler


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
        code = _dispatch(args)
        if not sys.stdout.closed:  # (``serve --stdio`` hands stdout to the protocol, which closes it)
            sys.stdout.flush()  # here, not at exit: a reader that went away is handled below
        return code
    except BrokenPipeError:
        # Whoever read stdout went away (`goald goal list | head -1`): what it wanted it has; no
        # traceback, and nothing more is written to the closed pipe at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except UsageError as exc:
        print(f"goald: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


#: The system daemon's configuration (the system unit's ``--config``).
SYSTEM_CONFIG = Path("/etc/goald/goald.toml")


def user_config() -> Path:
    """The per-user configuration: ``$XDG_CONFIG_HOME/goald/goald.toml`` (``~/.config`` by default)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "goald" / "goald.toml"


def config_candidates(*, serve: bool = False) -> tuple[Path, ...]:
    """Where a configuration is looked for, in order. A command looks at the system daemon's
    ``/etc/goald/goald.toml``, then the per-user one. ``goald serve`` by root looks at the same
    two; by another user only at the per-user one: the system configuration names the system
    daemon's state directory, which a daemon started by hand must not take by surprise."""
    if serve and os.geteuid() != 0:
        return (user_config(),)
    return (SYSTEM_CONFIG, user_config())


def find_config(args: argparse.Namespace, *, discover: bool = True, serve: bool = False) -> Path | None:
    """The configuration a command reads: ``--config``, else ``GOALD_CONFIG``, else (``discover``:
    every command but ``run`` and ``store vacuum``) the first of ``config_candidates`` that
    exists, else none (the defaults). ``GOALD_SOCKET`` (or ``--socket``) still names the socket
    over whatever is found."""
    if args.config is not None:
        return Path(args.config)
    if os.environ.get("GOALD_CONFIG"):
        return Path(os.environ["GOALD_CONFIG"])
    if discover:
        for candidate in config_candidates(serve=serve):
            try:
                if candidate.is_file() and os.access(candidate, os.R_OK):
                    return candidate
            except OSError:  # a directory this user may not look into: not theirs to use
                continue
    return None


def _settings(args: argparse.Namespace) -> Settings:
    # run and store vacuum read only what they are told; serve reads what the CLI and config check
    # read (by another user than root, the per-user file only: see config_candidates).
    discover = args.command != "run" and not (
        args.command == "store" and getattr(args, "store_command", None) == "vacuum"
    )
    from daemon.settings import load_settings

    args.config_in_use = find_config(args, discover=discover, serve=args.command == "serve")
    return load_settings(args.config_in_use)


def config_line(path: Path | None) -> str:
    """What ``goald serve`` logs at start: the version and the configuration in use."""
    if path is not None:
        return f"goald {__version__} starting with the configuration {path}"
    looked = " or ".join(str(p) for p in config_candidates(serve=True))
    return f"goald {__version__} starting with built-in defaults: no config file at {looked}"


def _dispatch(args: argparse.Namespace) -> int:
    cmd = args.command
    if cmd in ("serve", "run", "demo", "acp"):
        # The daemon's files (database, WAL, work directories, logs of tools) are its own: 0600 and
        # 0700, outside systemd (whose units set UMask=0077) too.
        os.umask(0o077)
    local = _without_settings(args)
    if local is not None:
        return local
    if cmd in COMMANDS and not (cmd == "store" and args.store_command in ("vacuum", "backup", "restore")):
        socket_path = quick_socket(args)
        if socket_path is not None:
            return _talk(socket_path, args)
    from daemon.settings import ConfigError

    try:
        settings = _settings(args)
    except ConfigError as exc:
        print(f"goald: invalid configuration: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    offline = _without_daemon(settings, args)
    if offline is not None:
        return offline
    if cmd == "serve":
        return _serve(settings, args)
    return _talk(args.socket or settings.socket_path, args)


def _talk(socket_path: Path, args: argparse.Namespace) -> int:
    """A command that talks to the daemon on ``socket_path``."""
    setup_logging(args.log_level or "WARNING")
    handler = command_handler(args.command)
    if handler is None:
        raise UsageError(f"unknown command {args.command}")
    return asyncio.run(_with_client(socket_path, handler, args))


def _env(name: str) -> str | None:
    """A ``GOALD_*`` variable as the settings read it (its name in any case)."""
    for key, value in os.environ.items():
        if key.upper() == name:
            return value
    return None


def quick_socket(args: argparse.Namespace) -> Path | None:
    """The control socket of a command that only talks to a daemon, found as the settings would find
    it (``--socket``, ``GOALD_SOCKET``, the file's ``socket``, else ``goald.sock`` in ``GOALD_STATE_DIR``,
    the file's ``state_dir`` or the default state directory) without validating the whole
    configuration, whose models take most of a second to import: the running daemon has its own.
    ``None`` when the file cannot be read or either key is not a plain string; then the full
    settings decide, and a broken file is refused naming what is wrong (exit 78) as before."""
    import tomllib

    from daemon.lock import default_state_dir

    if args.socket:
        return Path(args.socket)
    args.config_in_use = path = find_config(args)
    data: dict[str, object] = {}
    if path is not None:
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError):
            return None
    socket = _env("GOALD_SOCKET") or data.get("socket")
    state_dir = _env("GOALD_STATE_DIR") or data.get("state_dir")
    if not isinstance(socket, str | None) or not isinstance(state_dir, str | None):
        return None
    if socket:
        found = Path(socket).expanduser()
    else:
        found = (Path(state_dir) if state_dir else default_state_dir()).expanduser() / "goald.sock"
    return found if found.is_absolute() else None  # a relative one: the settings name the error


def _without_settings(args: argparse.Namespace) -> int | None:
    """The exit code of a command that reads its own settings (or none), else ``None``."""
    cmd = args.command
    if cmd == "demo":
        from daemon.demo import run_demo

        setup_logging(args.log_level or "WARNING")
        return asyncio.run(run_demo(args.state_dir, sys.stdout, plain=args.plain))
    if cmd == "config":
        return _config_check(args)
    if cmd == "completion":
        from daemon.cli.completion import completion_script

        print(completion_script(build_parser(), args.shell), end="")
        return EXIT_OK
    if cmd == "acp":
        return _acp(args)
    return None


def _without_daemon(settings: Settings, args: argparse.Namespace) -> int | None:
    """The exit code of a command that needs the settings but no running daemon, else ``None``."""
    cmd = args.command
    if cmd == "run":
        return _run(settings, args)
    if cmd == "web":  # the token file itself: no daemon needed
        from daemon.cli.web import web_command
        from daemon.web.tokens import TokenError

        try:
            return web_command(settings, args)
        except TokenError as exc:
            print(f"goald: {exc}", file=sys.stderr)
            return EXIT_USAGE
    if cmd == "store" and args.store_command in ("vacuum", "backup", "restore"):
        from daemon.cli.store import backup, restore, vacuum

        if args.store_command == "vacuum":
            return vacuum(settings)
        setup_logging(args.log_level or "WARNING")
        if args.store_command == "backup":
            return backup(settings, args.socket or settings.socket_path, args.path)
        return restore(settings, args.path, replace=args.replace)
    return None


def _serve(settings: Settings, args: argparse.Namespace) -> int:
    """``goald serve``: the daemon in this process, each refusal to start mapped to its exit code."""
    from loguru import logger

    from agent.errors import SchemaTooNew
    from agent.schema import MigrationFailed
    from daemon.checks import StateDirUnusable, state_dir_problem
    from daemon.config_check import config_findings
    from daemon.host import Host
    from daemon.lock import StateDirLocked
    from daemon.settings import ConfigError

    setup_logging(args.log_level or settings.log_level, settings.log_format, journal_socket=settings.journal_socket)
    try:
        # An unusable state directory is one line and exit 78, before anything else is said.
        if (problem := state_dir_problem(settings.state_dir)) is not None:
            raise StateDirUnusable(problem)
        host = Host(settings)
        findings = config_findings(settings, host.models)
        for finding in findings:
            if not finding.advice and not finding.refuses_start:
                logger.warning("configuration: {}", finding)
        if refusing := [f for f in findings if f.refuses_start]:
            raise ConfigError("; ".join(str(f) for f in refusing))
        start_line = config_line(getattr(args, "config_in_use", None))
        return asyncio.run(host.run(stdio=args.stdio, start_line=start_line))
    except StateDirLocked as exc:  # nothing was written: the other daemon's state is untouched
        print(f"goald: {exc}", file=sys.stderr)
        return EXIT_LOCKED
    except ConfigError as exc:  # e.g. an invalid goals file: the file, entry and field are named
        print(f"goald: invalid configuration: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except (MigrationFailed, SchemaTooNew) as exc:  # the database unchanged; not worth a restart loop
        print(f"goald: refusing to start: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except RuntimeError as exc:
        print(f"goald: {exc}", file=sys.stderr)
        return EXIT_FAILURE


async def _with_client(
    socket_path: Path, handler: Callable[[Connection, argparse.Namespace], Awaitable[int]], args: argparse.Namespace
) -> int:

    try:
        client = await Connection.connect(socket_path)
    except SocketPermissionDenied as exc:
        print(f"goald: permission denied: {exc}", file=sys.stderr)
        return EXIT_NOPERM
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
    except BrokenPipeError as exc:
        if stdout_gone():
            raise  # the reader of stdout went away, not the daemon: main() ends quietly
        print(f"goald: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except ConnectionError as exc:
        print(f"goald: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    finally:
        await client.close()


def stdout_gone() -> bool:
    """Whether stdout is a pipe or socket whose reader has closed it (poll reports an error on it)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (OSError, ValueError):
        return False


def _acp(args: argparse.Namespace) -> int:
    # Imported here, not at the top: the ACP SDK takes about half a second to import, and only
    # ``goald acp`` needs it (every other command would pay for it).
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


def _run(settings: Settings, args: argparse.Namespace) -> int:
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
    from daemon.config_check import config_findings
    from daemon.declared import check_declared
    from daemon.host import Host
    from daemon.settings import ConfigError, load_settings

    if args.config_command != "check":
        raise UsageError("usage: goald config check [--config FILE] [--strict]")
    path = args.check_config or find_config(args)
    try:
        settings = load_settings(path)
        host = Host(settings)
        declared = None
        if settings.goals_file is not None:
            # The declared goals and schedules are configuration too: checked as the daemon would
            # at start (nothing is written; the store is not opened).
            declared = check_declared(settings.goals_file, host)
    except ConfigError as exc:
        print(f"goald: invalid configuration: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(json.dumps(settings.masked(), indent=2, sort_keys=True))
    findings = config_findings(settings, host.models, declared)
    for finding in findings:
        print(f"goald: warning: {finding}", file=sys.stderr)
    if findings and args.strict:
        print(f"goald: {len(findings)} warning(s), refused by --strict", file=sys.stderr)
        return EXIT_CONFIG
    return EXIT_OK


def entrypoint() -> None:
    """Console-script entry point."""
    sys.exit(main())
