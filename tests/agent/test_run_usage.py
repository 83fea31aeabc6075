"""A run's usage counts every call charged, the summary calls of compaction included (issue 25).

What ``Client.run()`` and ``goald run`` report (``RunResult.usage``, built by
:class:`daemon.client.interval.Interval` from the interval's events) and what a subagent's spend
charges its parent (:func:`agent.subagents.session_spend`) both count the ``context/compacted``
event's summary call, as the goal engine does (``goals.facts.charged``): tokens reported equal the
sum of the usage of every call the server answered, and the guard's charge.

A real runtime on a SQLite file drives the OpenAI-compatible provider against the local server
speaking its wire format: a first message, then a second that no longer fits the 2,048-token
window with the first, so the second turn begins with a summary call.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from providers_server import ProviderServer, Respond, oa_usage, openai_text

from agent import EventType, Limits, MessageId, ModelRegistry, Runtime, usage_of_guard
from agent.context import SUMMARY_INSTRUCTION
from agent.models.openai import OpenAIModel
from agent.subagents import session_spend
from daemon.client.interval import Interval, SessionEvent, find_receipt


@pytest.fixture
async def server() -> AsyncIterator[ProviderServer]:
    async with ProviderServer() as srv:
        yield srv
        srv.assert_done()


async def test_a_run_s_usage_includes_the_compaction_s_summary_call(server: ProviderServer, db_path: Path) -> None:
    # What the server reports for each call: the first turn, the summary, the second turn.
    first, summary, second = oa_usage(1100, 2), oa_usage(1150, 12), oa_usage(400, 1)
    server.add(
        Respond.stream(openai_text(["noted"], usage=first)),
        Respond.stream(openai_text(["Earlier: the user sent a long message A."], usage=summary)),
        Respond.stream(openai_text(["done"], usage=second)),
    )
    model = OpenAIModel(
        "run-usage", base_url=server.url + "/v1", api_key="", timeout=5.0, max_tokens=32, context_window=2048
    )
    registry = ModelRegistry({model.spec: model}, default=model.spec)
    mids = [str(MessageId.new()), str(MessageId.new())]
    try:
        async with Runtime.open(db_path, models=registry) as rt:
            gid = await rt.create_guard(Limits(max_tokens=10_000_000))
            sid = await rt.create_session(guard_id=gid, config={"agent": {"retry": {"base_delay": 0.001}}})
            agent = await rt.agent(sid)
            for mid, text in zip(mids, ("A " + "a" * 4000, "B " + "b" * 4000), strict=True):
                await agent.followup(text, message_id=mid)
                async with asyncio.timeout(30):
                    await agent.when_idle()
            events = [SessionEvent.from_event(e) for e in await rt.store.events_after(sid, 0)]
            guard_tokens, _ = await rt.store.transact(lambda tx: usage_of_guard(tx, gid))
            spend_tokens, _ = await rt.store.transact(lambda tx: session_spend(tx, sid))
    finally:
        await model.aclose()
    # The second turn did begin with a summary call (its request is the summary instruction).
    assert SUMMARY_INSTRUCTION[:40] in server.requests[1].raw.decode()
    [compacted] = [e for e in events if e.type == EventType.CONTEXT_COMPACTED]
    assert compacted.data["mode"] == "summary" and compacted.data["usage"]["input_tokens"] == 1150

    results = []
    for mid in mids:
        at = find_receipt(events, sid, mid)
        assert at is not None
        interval = Interval(events[at], events[:at])
        for ev in events[at + 1 :]:
            if interval.feed(ev):
                break
        assert interval.closed
        results.append(interval.result(mid))
    one, two = (r.usage for r in results)

    def total(u: dict[str, int]) -> int:
        return u["prompt_tokens"] + u["completion_tokens"]

    assert (one.model_calls, one.total_tokens) == (1, total(first))
    # The second run: the summary call and the answer, each as the server reported it.
    assert (two.model_calls, two.input_tokens, two.output_tokens) == (2, 1150 + 400, 12 + 1)
    assert two.total_tokens == total(summary) + total(second)
    # Tokens charged = the sum of every call: the runs together, the guard, a session's spend.
    assert (
        one.total_tokens + two.total_tokens == guard_tokens == spend_tokens == sum(map(total, (first, summary, second)))
    )
