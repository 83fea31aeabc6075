"""The ``goald`` command. Thin: parse arguments, call the packages, map outcomes to exit codes."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from daemon import __version__
from daemon.logs import setup_logging

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="goald", description="goald: a goal-driven autonomous agent daemon")
    parser.add_argument("--version", action="version", version=f"goald {__version__}")
    parser.add_argument("--log-level", default="WARNING", help="log level on stderr (default WARNING)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser("demo", help="run the demo on the embedded defaults (temp state dir, scripted model)")
    demo.add_argument("--state-dir", type=Path, default=None, help="keep the demo's state here (default: temp)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    setup_logging(args.log_level)
    if args.command == "demo":
        from daemon.demo import run_demo

        return asyncio.run(run_demo(args.state_dir, sys.stdout))
    parser.print_help(sys.stderr)
    return EXIT_USAGE


def entrypoint() -> None:
    """Console-script entry point."""
    sys.exit(main())
