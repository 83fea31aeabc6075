"""``goald goal diff`` and ``goal commit``: a goal on a repository, as a branch.

``goal diff KEY`` prints what the goal changed since its start (its latest recorded round against
the start), ``--round N`` what round N changed, ``--stat`` a line per file (lines added and removed,
as ``git diff --numstat`` counts them). ``goal commit KEY`` writes the latest recorded tree as a
commit on the goal's branch in the operator's repository.
"""

from __future__ import annotations

import argparse
from typing import Any

from daemon.cli.parser import EXIT_OK, print_json
from daemon.client import Connection


async def goal_diff(client: Connection, args: argparse.Namespace) -> int:
    """``goal diff KEY [--round N] [--stat]``."""
    params: dict[str, Any] = {"goalId": args.goal, "stat": bool(args.stat)}
    if args.round is not None:
        params["round"] = args.round
    d = await client.call("goal/diff", params)
    if args.json:
        print_json(d)
        return EXIT_OK
    if args.stat:
        for f in d["files"]:
            added = "-" if f["added"] is None else f["added"]
            removed = "-" if f["removed"] is None else f["removed"]
            print(f"{added}\t{removed}\t{f['path']}")
        print(f"{len(d['files'])} file(s) changed, {d['from']} -> {d['to']}")
    else:
        print(d["text"], end="")
    for note in d.get("notes", []):
        print(f"note: {note}")
    return EXIT_OK


async def goal_commit(client: Connection, args: argparse.Namespace) -> int:
    """``goal commit KEY [-m TEXT]``."""
    params: dict[str, Any] = {"goalId": args.goal}
    if args.message:
        params["message"] = args.message
    done = await client.call("goal/commit", params)
    if args.json:
        print_json(done)
    else:
        print(f"{done['commit']} on {done['branch']} in {done['repo']} ({done['checkpoint']})")
    return EXIT_OK
