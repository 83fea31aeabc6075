"""``goald send``: a message to a session, or to a goal's session."""

from __future__ import annotations

import argparse

from daemon.cli.goal import goal_session, print_json
from daemon.cli.parser import EXIT_OK
from daemon.client import Connection


async def send(client: Connection, args: argparse.Namespace) -> int:
    sid = await goal_session(client, args.target)
    delivery = "steer" if args.steer else "context" if args.context else "followup"
    result = await client.call("session/prompt", {"sessionId": sid, "text": args.text, "delivery": delivery})
    if args.json:
        print_json({"sessionId": sid, **result})
    else:
        print(result["messageId"])
    return EXIT_OK
