"""A session's view against a small context window (issue 25): what is never sent, and the notes.

With the shipped scripted model (tokens = bytes / 4, a prompt over its window refused as Anthropic
words it):

* a request estimated not to fit even after compaction is never sent: the turn ends ``error`` with
  ``errorKind`` ``context_too_small`` and the figures (the request's size, the window, its source);
* when no summary can be made, every compaction's fallback leaves ONE note of the messages it
  dropped, counted, however many compactions there are (it used to append a note to the last one:
  96, 194, 292 ... bytes);
* the output limit of a call never takes more than a quarter of the window.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from agent import ContextCompacted, EventType, ModelErrorKind, ModelRequest, Reply, Runtime, ScriptedModel
from agent.context import DROPPED_NOTE
from agent.step import output_limit

Opener = Callable[..., AbstractAsyncContextManager[Runtime]]


def answers(summaries: bool = False) -> Callable[[ModelRequest], Reply]:
    """A rule: a summary request fails (unless ``summaries``); a turn gets a short answer."""

    def rule(request: ModelRequest) -> Reply:
        if request.purpose == "summary":
            return Reply.say("Earlier: big messages.") if summaries else Reply.fail(ModelErrorKind.SERVER, "down")
        return Reply.say("ok")

    return rule


async def test_a_request_that_cannot_be_made_to_fit_is_never_sent(open_runtime: Opener) -> None:
    model = ScriptedModel(answers(), name="tiny", max_tokens=256, context_window=1000)
    async with open_runtime(model) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        # One message of about 2,000 tokens (8,000 bytes) in a 1,000-token window: nothing older to drop.
        await agent.followup("x" * 8000)
        async with asyncio.timeout(30):
            await agent.when_idle()
        events = await rt.store.events_after(sid, 0)
    [end] = [e.data for e in events if e.type == EventType.TURN_END]
    assert (end["reason"], end["errorKind"]) == ("error", "context_too_small")
    assert "does not fit the model's context window of 1000 tokens (default)" in end["error"]
    assert "for the answer" in end["error"]
    assert not [c for c in model.calls if c.request.purpose == "turn"], "a request that does not fit was sent"


async def test_dropped_message_notes_stay_one_bounded_note(open_runtime: Opener) -> None:
    model = ScriptedModel(answers(), name="forgetful", max_tokens=256, context_window=1500)
    async with open_runtime(model) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        for i in range(26):
            # About 600 tokens each in a 1,500-token window: every turn from the second one compacts.
            await agent.followup(f"message {i}: " + "y" * 2400)
            async with asyncio.timeout(30):
                await agent.when_idle()
        events = await rt.store.events_after(sid, 0, limit=100_000)
    compactions = [e.payload for e in events if isinstance(e.payload, ContextCompacted)]
    dropped = [c for c in compactions if c.mode == "dropped"]
    assert len(dropped) >= 20
    note_bytes = len(DROPPED_NOTE.format(n=999))
    sizes = [len(c.summary or "") for c in dropped]
    assert max(sizes) <= note_bytes, sizes
    # One note, counting every message dropped so far.
    last = dropped[-1].summary or ""
    assert last.count("earlier message(s) were left out") == 1
    assert last == DROPPED_NOTE.format(n=sum(c.messages for c in dropped))
    ends = [e.data for e in events if e.type == EventType.TURN_END]
    assert len(ends) == 26 and all(e["reason"] == "end_turn" for e in ends)
    # Every request sent fit the window.
    turns = [c for c in model.calls if c.request.purpose == "turn"]
    assert turns and all(model.prompt_tokens(c.request) <= 1500 for c in turns)


def test_an_answer_takes_at_most_a_quarter_of_the_window() -> None:
    assert output_limit(4096, 2048) == 512
    assert output_limit(4096, 128_000) == 4096
    assert output_limit(256, 1000) == 250
