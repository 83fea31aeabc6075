"""Scripted models and checks for the context-compaction tests (``tests/test_context*.py``).

The model is a pure function of the request, so a restarted process answers the same way. It reads
the round from the newest ``Round N`` continuation and the step from the assistant messages after it.
Below the target round, step 0 asks for two tool calls at once (``write_file rN.txt`` and ``dump``,
whose output is large), step 1 says the round is done; at the target round it claims completion.
A summary request (``purpose == "summary"``) gets a short summary, or fails when the model is built
with ``summaries="fail"``.

Token rule of every test here: tokens = measured prompt bytes / 4 (the scripted model's rule).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel

from agent import (
    ConvMessage,
    FunctionTool,
    ModelErrorKind,
    ModelRequest,
    Reply,
    ScriptedModel,
    TextBlock,
    ToolCall,
    ToolContext,
    ToolResultBlock,
    ToolUseBlock,
)

_ROUND = re.compile(r"\bRound (\d+)\b")
_TARGET = re.compile(r"\btarget round (\d+)\b")
#: Characters of output each ``dump`` call returns.
DUMP_CHARS = 2500


def objective(target: int) -> str:
    """The objective of a compaction test goal (the model reads its target from it)."""
    return f"Write one file per round and finish at target round {target}; keep the reports."


class DumpArgs(BaseModel):
    """Arguments of ``dump``."""

    round: int


async def _dump(args: DumpArgs, ctx: ToolContext) -> str:
    line = f"round {args.round} report line: " + "x" * 60 + "\n"
    return (line * (DUMP_CHARS // len(line) + 1))[:DUMP_CHARS]


def dump_tool() -> FunctionTool[DumpArgs]:
    """A tool whose output is large (a build log, a test report)."""
    return FunctionTool("dump", "prints a long report", DumpArgs, _dump, repeat_safe=True)


def _text(msg: ConvMessage) -> str:
    return "".join(b.text for b in msg.content if isinstance(b, TextBlock))


def where(request: ModelRequest) -> tuple[int, int, int]:
    """(round, steps taken in it, target round) from a turn's request."""
    msgs = list(request.messages)
    for i in range(len(msgs) - 1, -1, -1):
        if msgs[i].role != "user":
            continue
        text = _text(msgs[i])
        found = _ROUND.search(text)
        if found:
            target = _TARGET.search(text)
            steps = sum(1 for m in msgs[i + 1 :] if m.role == "assistant")
            return int(found.group(1)), steps, int(target.group(1)) if target else 10**9
    raise AssertionError("no continuation in the request")


def rule_for(summaries: Literal["ok", "fail"] = "ok") -> Any:
    """The model's rule (see the module docstring)."""

    def rule(request: ModelRequest) -> Reply:
        if request.purpose == "summary":
            if summaries == "fail":
                return Reply.fail(ModelErrorKind.SERVER, "the summarizer is down")
            return Reply.say(f"Earlier: {len(request.messages) - 1} messages of file writing and reports.")
        n, step, target = where(request)
        if n >= target:
            if step == 0:
                return Reply(tool_calls=[ToolCall("goal_complete", {"summary": "all written", "evidence": "files"})])
            return Reply.say("complete")
        if step == 0:
            return Reply(
                tool_calls=[
                    ToolCall("write_file", {"path": f"r{n}.txt", "content": f"round {n}\n"}),
                    ToolCall("dump", {"round": n}),
                ]
            )
        return Reply.say(f"round {n} done")

    return rule


def small_model(window: int = 4000, summaries: Literal["ok", "fail"] = "ok", name: str = "small") -> ScriptedModel:
    """A scripted model with a small context window (tokens = bytes / 4)."""
    return ScriptedModel(rule_for(summaries), name=name, max_tokens=256, context_window=window)


def pairing_errors(messages: list[ConvMessage]) -> list[str]:
    """Tool results without their call and calls without their result, in one prompt."""
    errors: list[str] = []
    open_calls: set[str] = set()
    for i, msg in enumerate(messages):
        if msg.role != "tool" and open_calls:
            errors.extend(f"message {i}: call {c} without its result" for c in sorted(open_calls))
            open_calls.clear()
        for b in msg.content:
            if isinstance(b, ToolUseBlock):
                open_calls.add(b.id)
            elif isinstance(b, ToolResultBlock):
                if b.tool_use_id not in open_calls:
                    errors.append(f"message {i}: result of {b.tool_use_id} without its call")
                open_calls.discard(b.tool_use_id)
    errors.extend(f"end: call {c} without its result" for c in sorted(open_calls))
    return errors
