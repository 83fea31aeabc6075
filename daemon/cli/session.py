"""``goald send``: a message to a session, or to a goal's session.

A message to an ended goal is refused by the daemon unless ``--reopen``; to a paused goal it runs
one turn and the goal stays paused unless ``--resume``: the CLI says so (on stderr, so that stdout
stays the message id alone).
"""

from __future__ import annotations

import argparse
import sys

from daemon.cli.goal import goal_session
from daemon.cli.parser import EXIT_OK, UsageError, print_json
from daemon.client import Connection


async def send(client: Connection, args: argparse.Namespace) -> int:
    if args.answer:
        if args.steer or args.context or args.reopen or args.resume:
            raise UsageError("send --answer: the message answers the goal's question; no other option goes with it")
        done = await client.call("goal/answer", {"goalId": args.target, "text": args.text})
        if args.json:
            print_json(done)
        else:
            print(f"answered {done['question']['id']}: {done['question']['answer']}")
        return EXIT_OK
    sid = await goal_session(client, args.target)
    delivery = "steer" if args.steer else "context" if args.context else "followup"
    params = {"sessionId": sid, "text": args.text, "delivery": delivery, "reopen": args.reopen, "resume": args.resume}
    result = await client.call("session/prompt", params)
    if args.json:
        print_json({"sessionId": sid, **result})
        return EXIT_OK
    print(result["messageId"])
    gid = result.get("goalId")
    if result.get("goalStatus") == "paused":
        # On stderr: stdout stays the message id alone, for scripts.
        print(
            f"goal {gid} is paused: this message runs one turn now, charged to the goal and not counted as a"
            f" round; the goal stays paused (--resume, or goald goal resume {gid}, resumes it)",
            file=sys.stderr,
        )
    elif result.get("goalStatus") == "waiting":
        print(
            f"goal {gid} waits for an answer to its question: this message runs one turn and does not answer"
            f" it (goald send --answer, or goald goal answer {gid}, does)",
            file=sys.stderr,
        )
    elif gid is not None and args.reopen:
        print(f"goal {gid} reopened: {result.get('goalStatus')}", file=sys.stderr)
    return EXIT_OK
