"""``goald goal export GOAL [-o FILE]`` and ``goald goal import FILE``, through the daemon."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from daemon.client import Connection


async def goal_export(client: Connection, args: argparse.Namespace) -> int:
    """Write the goal's export document to ``-o FILE`` (created owner-only; never overwritten) or stdout."""
    doc = await client.call("goal/export", {"goalId": args.goal})
    text = json.dumps(doc, ensure_ascii=False, sort_keys=True) + "\n"
    if args.output is None:
        sys.stdout.write(text)
        return 0
    path = Path(args.output)
    try:
        # It holds the goal's whole history (every prompt): the owner's only, like the database.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        print(f"goald: cannot write {path}: {exc.strerror}", file=sys.stderr)
        return 1
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    events = len(doc["tables"].get("events", []))
    print(f"exported {doc['goal']['id']} ({doc['goal']['status']}) with {events} events to {path}", file=sys.stderr)
    return 0


async def goal_import(client: Connection, args: argparse.Namespace) -> int:
    """Send the document in ``FILE`` (``-``: stdin) to the daemon."""
    try:
        raw = sys.stdin.read() if args.file == "-" else await asyncio.to_thread(Path(args.file).read_text)
    except OSError as exc:
        print(f"goald: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        print(f"goald: {args.file} is not a goald goal export (not JSON: {exc}); nothing was imported", file=sys.stderr)
        return 2
    done = await client.call("goal/import", {"document": doc})
    if args.json:
        print(json.dumps(done, indent=2, sort_keys=True))
    else:
        sessions, events = len(done["sessions"]), done["events"]
        print(f"imported {done['goalId']} ({done['status']}) with {sessions} session(s), {events} events")
    return 0
