"""The CLI's ``goald notify test [SINK]``: a test message to one sink (or all), and each one's outcome."""

from __future__ import annotations

import argparse
import json

from daemon.cli.parser import EXIT_FAILURE, EXIT_OK, UsageError
from daemon.client import Connection


async def notify_command(client: Connection, args: argparse.Namespace) -> int:
    """Run ``notify test``; exit 1 when a sink failed (or none is configured)."""
    if args.notify_command != "test":
        raise UsageError("usage: goald notify test [SINK]")
    answer = await client.call("notify/test", {"sink": args.sink} if args.sink else {})
    if args.json:
        print(json.dumps(answer, indent=2))
    results = answer["results"]
    if not results:
        if not args.json:
            print("no notification sinks are configured ([[notify.sinks]] in the config)")
        return EXIT_FAILURE
    if not args.json:
        for r in results:
            if r["ok"]:
                print(f"{r['sink']}: delivered ({r['status']}, {r['seconds']:.2f}s) id {answer['id']}")
            else:
                print(f"{r['sink']}: FAILED: {r['error']}")
    return EXIT_OK if all(r["ok"] for r in results) else EXIT_FAILURE
