"""The options ``goal add``, ``goal edit``, ``goal resume`` and ``schedule add`` share: a goal's
budgets, verification, tools and sandbox (:mod:`daemon.cli.parser` builds the commands with them),
and the help words every command's parser uses."""

from __future__ import annotations

import argparse
from typing import TypeAlias

JSON_HELP = "print JSON (camelCase keys) instead of text"
GOAL_HELP = "a goal key, goal id, or unique prefix of an id"
SCHEDULE_HELP = "a schedule key, schedule id, or unique prefix of an id"
#: What ``add_subparsers`` returns: each command group adds its parsers to it.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

GOAL_STATUSES = ["active", "waiting", "paused", "completed", "failed", "cancelled", "exhausted"]


def add_goal_options(p: argparse.ArgumentParser, *, for_edit: bool = False) -> None:
    """A goal's title, budgets and verification; for a new goal (not ``for_edit``) also its key,
    model, work directory, session, rules, tools, progress command and sandbox."""
    p.add_argument("--title", help="a short name shown in lists (default: the objective's first line)")
    add_budget_options(p)
    p.add_argument(
        "--verify",
        action="append",
        metavar="CMD",
        help="a shell command run in the work directory when the agent claims completion; exit 0 passes (repeatable)",
    )
    p.add_argument(
        "--verify-timeout", type=float, default=300.0, metavar="SECONDS", help="time limit of each --verify command"
    )
    if not for_edit:
        p.add_argument("--key", help="a unique name to address the goal by, instead of its id")
        p.add_argument("--model", help="PROVIDER:MODEL (default: the configured default_model)")
        p.add_argument("--workdir", help="an existing directory inside workdir_roots (default: a new one)")
        p.add_argument("--session", help="run the goal on an existing session (id or unique prefix)")
        p.add_argument("--idempotency-key", help="a repeated create with the same key returns the first goal")
        p.add_argument(
            "--stall-rounds", type=int, metavar="N", help="rounds without progress before it pauses stalled (default 3)"
        )
        p.add_argument(
            "--infra-retries",
            type=int,
            metavar="N",
            help="rounds re-run in a row for infrastructure trouble (a daemon stop, an unreachable provider), never"
            " counted as rounds, before it tries only hourly (default 20)",
        )
        p.add_argument(
            "--tool",
            action="append",
            metavar="PATTERN",
            help='allow a tool or shell command pattern (repeatable; e.g. read_file, "shell:git *");'
            " replaces the configured tool_policy for this goal",
        )
        add_sandbox_options(p)


def add_budget_options(p: argparse.ArgumentParser) -> None:
    """A goal's budgets (each one absent: no limit of that kind)."""
    p.add_argument("--max-rounds", type=int, metavar="N", help="rounds (continuations) the goal may run")
    p.add_argument("--max-tokens", type=int, metavar="TOKENS", help="total tokens (input + output) of all its calls")
    p.add_argument(
        "--max-cost",
        type=float,
        metavar="AMOUNT",
        help="total cost, in the currency of the provider's prices (per million tokens, e.g. USD);"
        " the model must have prices",
    )
    p.add_argument("--max-wall", type=float, metavar="SECONDS", help="wall-clock seconds while active")
    p.add_argument("--deadline", help="ISO 8601 instant with a time zone, e.g. 2026-12-31T23:00:00Z")


def add_sandbox_options(p: argparse.ArgumentParser) -> None:
    """A goal's progress command and its own sandbox settings (merged with ``[goal_sandbox.<key>]``)."""
    p.add_argument("--progress", metavar="CMD", help="a command whose changed output counts as progress")
    p.add_argument(
        "--progress-timeout", type=float, default=60.0, metavar="SECONDS", help="time limit of the --progress command"
    )
    p.add_argument(
        "--network",
        choices=("off", "host"),
        default=None,
        help="the goal's commands' network: off, or host (the host's network, its loopback included: unsafe)",
    )
    p.add_argument("--no-network", dest="network", action="store_const", const="off", help="the same as --network off")
    p.add_argument(
        "--network-allow",
        action="append",
        metavar="HOST",
        help="a host name (or *.domain) the goal's commands may reach through the daemon's proxy (repeatable)",
    )
    p.add_argument(
        "--read-only-path", action="append", metavar="PATH", help="a path the goal's commands may read (repeatable)"
    )
    p.add_argument("--max-processes", type=int, metavar="N", help="processes of the goal's commands together, at once")
    p.add_argument("--max-memory", type=int, metavar="MIB", help="memory of the goal's commands together, in MiB")
    p.add_argument("--max-disk", type=int, metavar="MIB", help="what the work directory may hold on disk, in MiB")
    p.add_argument(
        "--secret",
        action="append",
        metavar="NAME=env:VAR|credential:FILE",
        help="a secret environment variable of the goal's commands, by where the daemon reads it",
    )


__all__ = ["add_budget_options", "add_goal_options", "add_sandbox_options"]
