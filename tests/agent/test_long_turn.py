"""A turn that outgrows the window (issue 25, "compaction inside a long turn").

One user message, then hundreds of tool calls in the same turn, through a 4,000-token window (the
shipped scripted model: tokens = bytes / 4, a prompt over its window refused). Once nothing before
the turn's user message is left to drop, the turn's own oldest steps are left out, so:

* every request sent, with its output limit, fits the window, and the turn ends ``end_turn``;
* a tool call and its result are never split, and the user message that opened the turn is in
  every request verbatim, with ONE bounded note of the steps left out after it;
* every compaction is a ``context/compacted`` event, and a restart's view is the driver's;
* the number of compaction attempts is bounded (not one per step), even when a compaction cannot
  free enough (a huge opening message), and no warning is logged for it;
* the work per step stays flat: the messages a compaction builds from the stored events are bounded
  by the view, not by the turn's length (counted, not timed);
* a second long turn leaves the first one, and its note, behind: one note, of its own steps.

The same at 2,000 steps carries the ``soak`` marker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from typing import Any

import pytest
from loguru import logger
from pydantic import BaseModel

from agent import ContextCompacted, EventType, FunctionTool, ModelRequest, Reply, Runtime, ScriptedModel, ToolContext
from agent import context as context_module
from agent import step as step_module
from agent.compaction import compact_view
from agent.context import STEPS_NOTE, load_view
from agent.messages import TextBlock, ToolResultBlock, ToolUseBlock
from agent.step import output_limit

Opener = Callable[..., AbstractAsyncContextManager[Runtime]]
WINDOW = 4000
OPENING = "Work through the list, one call at a time. " + "u" * 100


class _NoArgs(BaseModel):
    pass


def big_tool(size: int) -> FunctionTool[_NoArgs]:
    async def run(args: _NoArgs, ctx: ToolContext) -> str:
        return "r" * size

    return FunctionTool("big", "answers a large result", _NoArgs, run, repeat_safe=True)


def loop(steps: int) -> Callable[[ModelRequest], Reply]:
    """A tool call for the first ``steps`` turn requests, then a text answer; summaries fail."""
    done = 0

    def rule(request: ModelRequest) -> Reply:
        nonlocal done
        if request.purpose == "summary":
            return Reply.say("summary")
        done += 1
        return Reply.call("big") if done <= steps else Reply.say("done")

    return rule


@contextmanager
def counting() -> Iterator[dict[str, Any]]:
    """Counts compaction attempts, the messages each builds from stored events, and warnings."""
    counts: dict[str, Any] = {"attempts": 0, "built": [], "warnings": []}
    real_compact, real_message = compact_view, context_module.history_message
    patch = pytest.MonkeyPatch()
    built = [0]

    async def compact(*args: Any, **kw: Any) -> Any:
        counts["attempts"] += 1
        built[0] = 0
        try:
            return await real_compact(*args, **kw)
        finally:
            counts["built"].append(built[0])

    def message(event: Any) -> Any:
        built[0] += 1
        return real_message(event)

    sink = logger.add(lambda m: counts["warnings"].append(str(m)), level="WARNING")
    patch.setattr(step_module, "compact_view", compact)
    patch.setattr(context_module, "history_message", message)
    try:
        yield counts
    finally:
        patch.undo()
        logger.remove(sink)


def check_request(request: ModelRequest, opening: str) -> None:
    """The opening message is in the request verbatim; no call is without its result, or a result
    without its call; at most one note of left-out steps."""
    texts = [b.text for m in request.messages for b in m.content if isinstance(b, TextBlock)]
    assert opening in texts, "the user message that opened the turn is not in the request"
    assert sum(1 for t in texts if STEPS_NOTE.split("{n}")[1][:40] in t) <= 1
    asked: set[str] = set()
    for i, msg in enumerate(request.messages):
        uses = {b.id for b in msg.content if isinstance(b, ToolUseBlock)}
        if uses:
            following = request.messages[i + 1 : i + 1 + len(uses)]
            answered = {b.tool_use_id for m in following for b in m.content if isinstance(b, ToolResultBlock)}
            assert uses <= answered, "a call is in the request without its result"
        asked |= uses
        for b in msg.content:
            if isinstance(b, ToolResultBlock):
                assert b.tool_use_id in asked, "a result is in the request without its call"


async def run_long_turn(open_runtime: Opener, steps: int, result_size: int, opening: str) -> dict[str, Any]:
    model = ScriptedModel(loop(steps), name=f"long-{steps}-{result_size}", max_tokens=256, context_window=WINDOW)
    with counting() as counts:
        async with open_runtime(model, tools=[big_tool(result_size)]) as rt:
            sid = await rt.create_session(config={"agent": {"max_steps": steps + 10}})
            agent = await rt.agent(sid)
            await agent.followup(opening)
            async with asyncio.timeout(120):
                await agent.when_idle()
            events = await rt.store.events_after(sid, 0, limit=1_000_000)
            _, view = await load_view(rt.store, sid)
    turns = [c.request for c in model.calls if c.request.purpose == "turn"]
    return {**counts, "model": model, "events": events, "turns": turns, "view": view}


async def check_long_turn(open_runtime: Opener, steps: int) -> None:
    seen = await run_long_turn(open_runtime, steps, 300, OPENING)
    model, events, turns = seen["model"], seen["events"], seen["turns"]
    [end] = [e.data for e in events if e.type == EventType.TURN_END]
    assert (end["reason"], end["steps"]) == ("end_turn", steps + 1), end
    assert len(turns) == steps + 1
    limit = output_limit(256, WINDOW)
    assert max(model.prompt_tokens(r) for r in turns) + limit <= WINDOW
    for request in turns:
        check_request(request, OPENING)
    compactions = [e.payload for e in events if isinstance(e.payload, ContextCompacted)]
    assert compactions, "the turn outgrew the window without a compaction recorded"
    assert all(c.steps_dropped > 0 for c in compactions)
    # One note, counting every message left out so far; and a bounded list of elided results.
    assert [c.steps_dropped for c in compactions] == sorted(c.steps_dropped for c in compactions)
    assert compactions[-1].steps_dropped == sum(c.messages for c in compactions)
    assert max(len(c.elided) for c in compactions) <= 20
    # Attempts: each one a stored compaction, and far fewer than the steps.
    assert seen["attempts"] == len(compactions) <= steps // 5
    # Flat work: a compaction builds at most the view's messages from stored events (the steps left
    # out are not read again), and a request carries a bounded number of messages.
    most = max(len(r.messages) for r in turns)
    assert most <= 80  # the window holds about 35 steps
    # (read once to plan, once more as a restart would after the commit)
    assert max(seen["built"]) <= 2 * most + 2, seen["built"]
    assert not seen["warnings"], seen["warnings"]
    # The view a restart rebuilds is the one the last request was built from, plus its answer.
    last = turns[-1].messages
    assert [e.msg for e in seen["view"]][: len(last)] == list(last)


async def test_a_turn_of_200_steps_stays_under_a_4k_window(open_runtime: Opener) -> None:
    await check_long_turn(open_runtime, 200)


@pytest.mark.soak
async def test_a_turn_of_2000_steps_stays_under_a_4k_window(open_runtime: Opener) -> None:
    await check_long_turn(open_runtime, 2000)


async def test_a_compaction_that_cannot_free_enough_is_not_tried_at_every_step(open_runtime: Opener) -> None:
    # The opening message and a few steps are past the trigger (80%) but fit: nothing brings them under.
    opening = "Keep going. " + "h" * 11_988  # 3,000 tokens of a 4,000-token window
    steps = 150
    seen = await run_long_turn(open_runtime, steps, 8, opening)
    model, events, turns = seen["model"], seen["events"], seen["turns"]
    ends = [e.data for e in events if e.type == EventType.TURN_END]
    assert len(turns) >= 10
    for request in turns:
        check_request(request, opening)
        assert model.prompt_tokens(request) + output_limit(256, WINDOW) <= WINDOW
    # Tried again only once the view grew by 5% of the window (~200 tokens, ~10 steps here).
    assert 2 <= seen["attempts"] <= len(turns) // 5 + 1, (seen["attempts"], len(turns))
    assert not seen["warnings"] or all("does not fit" in w for w in seen["warnings"]), seen["warnings"]
    assert [e["reason"] for e in ends] == ["end_turn"], ends


async def test_a_second_long_turn_leaves_the_first_one_and_its_note_behind(open_runtime: Opener) -> None:
    done = 0

    def rule(request: ModelRequest) -> Reply:
        nonlocal done
        done += 1
        return Reply.say("done") if done in (120, 240) else Reply.call("big")

    model = ScriptedModel(rule, name="two-long-turns", max_tokens=256, context_window=WINDOW)
    second = "Now the second list. " + "v" * 100
    async with open_runtime(model, tools=[big_tool(300)]) as rt:
        sid = await rt.create_session(config={"agent": {"max_steps": 500}})
        agent = await rt.agent(sid)
        for opening in (OPENING, second):
            await agent.followup(opening)
            async with asyncio.timeout(120):
                await agent.when_idle()
        events = await rt.store.events_after(sid, 0, limit=1_000_000)
        _, view = await load_view(rt.store, sid)
    ends = [e.data for e in events if e.type == EventType.TURN_END]
    assert [e["reason"] for e in ends] == ["end_turn", "end_turn"]
    turns = [c.request for c in model.calls if c.request.purpose == "turn"]
    assert max(model.prompt_tokens(r) for r in turns) + output_limit(256, WINDOW) <= WINDOW
    for request in turns[:120]:
        check_request(request, OPENING)
    for request in turns[120:]:
        check_request(request, second)
    # The second turn's note counts its own steps; the first turn's steps and note are gone from the view.
    compactions = [e.payload for e in events if isinstance(e.payload, ContextCompacted)]
    opened = {c.steps_from_seq for c in compactions if c.steps_through_seq}
    assert len(opened) == 2
    texts = [b.text for e in view for b in e.msg.content if isinstance(b, TextBlock)]
    assert OPENING not in texts and second in texts
    assert sum(1 for t in texts if STEPS_NOTE.split("{n}")[1][:40] in t) == 1
