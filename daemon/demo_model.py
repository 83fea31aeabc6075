"""The demo goal's scripted model (``scripted:demo``): real file work over three rounds.

Round 1 writes the inputs, round 2 claims completion too early (the verification command refuses
the claim, and its output reaches the next round), round 3 fixes the report and completes. It is
its own module because the provider registry (:mod:`daemon.models`) always offers it, while the
demo command (:mod:`daemon.demo`) needs the host: neither imports the other.
"""

from __future__ import annotations

import re

from agent import ModelRequest, Reply, ScriptedModel, TextBlock, ToolCall

DEMO_OBJECTIVE = (
    "Keep the nightly report current: write report.md from the inputs in data.csv, "
    "ending with a line that starts with 'Summary:'."
)
DEMO_VERIFY = "test -s data.csv && grep -q '^Summary:' report.md"

_ROUND = re.compile(r"Round (\d+)")


def _round_and_step(request: ModelRequest) -> tuple[int, int]:
    last_user = max((i for i, m in enumerate(request.messages) if m.role == "user"), default=-1)
    round_no = 1
    if last_user >= 0:
        text = "".join(b.text for b in request.messages[last_user].content if isinstance(b, TextBlock))
        found = _ROUND.search(text)
        round_no = int(found.group(1)) if found else 1
    step = sum(1 for m in request.messages[last_user + 1 :] if m.role == "assistant")
    return round_no, step


_PLAN: dict[int, list[Reply]] = {
    1: [
        Reply(text="Looking at the work directory.", tool_calls=[ToolCall("list_dir", {"path": "."})]),
        Reply(
            text="Writing the inputs.",
            tool_calls=[
                ToolCall("write_file", {"path": "data.csv", "content": "source,rows\norders,1200\nrefunds,31\n"})
            ],
        ),
        Reply(tool_calls=[ToolCall("goal_progress", {"note": "inputs written to data.csv"})]),
        Reply.say("Inputs are in place; the report comes next."),
    ],
    2: [
        Reply(
            text="Drafting the report.",
            tool_calls=[
                ToolCall(
                    "write_file",
                    {"path": "report.md", "content": "# Nightly report\n\n- orders: 1200\n- refunds: 31\n"},
                )
            ],
        ),
        Reply(
            text="I believe the report is done.",
            tool_calls=[ToolCall("goal_complete", {"summary": "report.md written", "evidence": "report.md exists"})],
        ),
        Reply.say("Claimed completion."),
    ],
    3: [
        Reply(
            text="The check wants a Summary line; reading the report.",
            tool_calls=[ToolCall("read_file", {"path": "report.md"})],
        ),
        Reply(
            tool_calls=[
                ToolCall(
                    "edit_file",
                    {
                        "path": "report.md",
                        "old": "- refunds: 31\n",
                        "new": "- refunds: 31\n\nSummary: 1200 orders, 31 refunds.\n",
                    },
                )
            ]
        ),
        Reply(
            tool_calls=[
                ToolCall(
                    "goal_complete", {"summary": "report.md with a Summary line", "evidence": "grep finds Summary:"}
                )
            ]
        ),
        Reply.say("Report complete with its summary."),
    ],
}


def demo_goal_model() -> ScriptedModel:
    """The scripted model of the demo goal: real file work over three rounds."""

    def rule(request: ModelRequest) -> Reply:
        round_no, step = _round_and_step(request)
        replies = _PLAN.get(round_no, [])
        if step < len(replies):
            return replies[step]
        return Reply.say("Nothing more to do this round.")

    return ScriptedModel(rule, name="demo", record=False)
