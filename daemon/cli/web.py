"""``goald web token add NAME [--read-only] | list | remove NAME``: the status page's tokens.

These work on the token file directly (``<state_dir>/web-tokens.json``, or ``[web] tokens_file``),
with or without a running daemon: the daemon re-reads the file when it changes. A new token is
printed once, on stdout; only its salted hash is kept. A bad name raises
:class:`~daemon.web.tokens.TokenError` (the CLI's exit 2). This module imports nothing of the
CLI's own (the parser imports it).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (the parser imports this module: the settings and the web package stay unloaded)
    from daemon.settings import Settings


def add_web_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``web`` command group."""
    web = sub.add_parser("web", help="the status page: its access tokens")
    wsub = web.add_subparsers(dest="web_command", metavar="ACTION", required=True)
    token = wsub.add_parser("token", help="named access tokens (stored hashed in the state directory)")
    tsub = token.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    add = tsub.add_parser("add", help="make a token and print it (once)")
    add.add_argument("name", help="who the token is for; recorded with every action taken with it")
    add.add_argument("--read-only", action="store_true", help="may look, cannot pause, resume, cancel or send")
    lst = tsub.add_parser("list", help="the tokens' names (never the tokens)")
    lst.add_argument("--json", action="store_true", help="print JSON instead of text")
    rm = tsub.add_parser("remove", help="remove a token (its cookies stop working at once)")
    rm.add_argument("name", help="the token's name")


def web_command(settings: Settings, args: argparse.Namespace) -> int:
    """Run ``goald web token ...``; returns the exit code.

    Raises:
        TokenError: the name is invalid, taken, or unknown (nothing was written).
    """
    from daemon.web.tokens import TokenFile

    tokens = TokenFile(settings.web.tokens_path(settings.state_dir))
    match args.token_command:
        case "add":
            secret = tokens.add(args.name, read_only=args.read_only)
            print(secret)
            where = settings.web.listen or settings.web.socket
            note = "" if settings.web.enabled else " ([web] enabled = false: the page is off)"
            print(
                f"token {args.name!r}{' (read-only)' if args.read_only else ''}: shown once; open the page"
                f" on {where} with ?token=<the token>{note}",
                file=sys.stderr,
            )
        case "list":
            rows = [{"name": t.name, "readOnly": t.read_only, "created": t.created} for t in tokens.tokens().values()]
            if args.json:
                print(json.dumps(rows, indent=2))
            else:
                for r in rows:
                    print(f"{r['name']}\t{'read-only' if r['readOnly'] else 'read-write'}\t{r['created']}")
        case "remove":
            tokens.remove(args.name)
    return 0
