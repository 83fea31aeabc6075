"""The shipped scripted model keeps its promises: it records every call, fails an unexpected call and
an unconsumed reply, and simulates usage, ``max_tokens`` ("length") finishes, errors and latency.

Most tests call the model directly with a hand-built request; the last ones run it behind a real
agent on a real SQLite file, where the same promises show up as turn ends and ``model_calls`` rows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

from agent import (
    ConvMessage,
    EventType,
    FinishReason,
    ModelError,
    ModelErrorKind,
    ModelRequest,
    Reply,
    Runtime,
    ScriptedModel,
    TextBlock,
    ToolCall,
    ToolUseBlock,
    Usage,
)

OpenRuntime = Callable[..., AbstractAsyncContextManager[Runtime]]
WAIT = 30.0


def request(text: str = "hello", *, max_tokens: int = 256) -> ModelRequest:
    """A one-message request whose prompt size is the text's size."""
    return ModelRequest(
        system=None,
        messages=[ConvMessage(role="user", content=[TextBlock(text=text)])],
        tools=[],
        max_tokens=max_tokens,
        prompt_bytes=len(text.encode()),
    )


def text_of(content: Any) -> str:
    return "".join(b.text for b in content if isinstance(b, TextBlock))


# -- unexpected calls and unconsumed replies --------------------------------------------------------


async def test_an_unconsumed_reply_fails_assert_done() -> None:
    model = ScriptedModel([Reply.say("first"), Reply.say("second")])
    out = await model.complete(request())
    assert text_of(out.content) == "first"
    assert model.remaining == 1
    with pytest.raises(AssertionError, match=r"1 scripted repl\(y/ies\) were never consumed"):
        model.assert_done()

    out = await model.complete(request())
    assert text_of(out.content) == "second"
    model.assert_done()  # every reply consumed, nothing unexpected


async def test_an_unexpected_call_fails_the_call_and_then_assert_done() -> None:
    model = ScriptedModel([Reply.say("only one")])
    await model.complete(request("first"))
    with pytest.raises(ModelError) as info:
        await model.complete(request("one too many"))
    assert info.value.kind is ModelErrorKind.UNEXPECTED_CALL and not info.value.retryable
    assert "no reply left" in str(info.value)
    # It is remembered: a test that swallowed the error still fails at the end.
    assert [text_of(r.messages[-1].content) for r in model.unexpected] == ["one too many"]
    with pytest.raises(AssertionError, match="1 unexpected call"):
        model.assert_done()
    # Every call is recorded, the unexpected one too.
    assert model.call_count == 2
    assert [c.last_text for c in model.calls] == ["first", "one too many"]


async def test_replies_can_be_added_and_a_rule_answers_any_number_of_calls() -> None:
    model = ScriptedModel([])
    model.add(Reply.say("added"))
    assert text_of((await model.complete(request())).content) == "added"
    model.assert_done()

    async def rule(req: ModelRequest) -> Reply:
        return Reply.say(f"echo: {text_of(req.messages[-1].content)}")

    ruled = ScriptedModel(rule, record=False)
    answers = [text_of((await ruled.complete(request(f"n{i}"))).content) for i in range(3)]
    assert answers == ["echo: n0", "echo: n1", "echo: n2"]
    assert ruled.call_count == 3 and ruled.calls == []  # counted, not recorded
    ruled.assert_done()


# -- what a reply can simulate ----------------------------------------------------------------------


async def test_tool_calls_and_finish_reasons() -> None:
    model = ScriptedModel(
        [
            Reply(text="let me look", tool_calls=[ToolCall("read_file", {"path": "a.txt"}, id="call_1")]),
            Reply.say("cut off mid-sent", finish=FinishReason.MAX_TOKENS),
            Reply.say("done"),
        ]
    )
    asked = await model.complete(request())
    assert asked.finish_reason is FinishReason.TOOL_USE
    (use,) = [b for b in asked.content if isinstance(b, ToolUseBlock)]
    assert (use.id, use.name, use.input) == ("call_1", "read_file", {"path": "a.txt"})
    assert text_of(asked.content) == "let me look"

    cut = await model.complete(request())
    assert cut.finish_reason is FinishReason.MAX_TOKENS  # a "length" finish
    assert text_of(cut.content) == "cut off mid-sent"
    assert (await model.complete(request())).finish_reason is FinishReason.END_TURN
    model.assert_done()


async def test_usage_is_reported_as_scripted_or_estimated_from_the_sizes() -> None:
    given = Usage(input_tokens=1234, output_tokens=56, cache_read_tokens=7, cache_write_tokens=8)
    model = ScriptedModel([Reply.say("x", usage=given), Reply.say("short"), Reply.say("short"), Reply.say("x" * 400)])
    assert (await model.complete(request())).usage == given

    small = (await model.complete(request("a" * 40))).usage
    large = (await model.complete(request("a" * 4000))).usage
    assert 0 < small.input_tokens < large.input_tokens  # grows with the prompt
    assert small.output_tokens == large.output_tokens > 0  # the same answer, the same output
    longer = (await model.complete(request("a" * 40))).usage
    assert longer.output_tokens > small.output_tokens  # grows with the answer
    assert longer.input_tokens == small.input_tokens
    model.assert_done()


@pytest.mark.parametrize("kind", list(ModelErrorKind))
async def test_errors_are_raised_as_model_errors_of_their_kind(kind: ModelErrorKind) -> None:
    spent = Usage(input_tokens=10, output_tokens=0)
    model = ScriptedModel([Reply.fail(kind, f"scripted {kind.value}", retry_after=2.5, usage=spent, status=503)])
    with pytest.raises(ModelError) as info:
        await model.complete(request())
    err = info.value
    assert (err.kind, err.message, err.retry_after, err.usage, err.status) == (
        kind,
        f"scripted {kind.value}",
        2.5,
        spent,
        503,
    )
    assert err.retryable is kind.retryable
    assert model.call_count == 1 and model.remaining == 0
    model.assert_done()  # a scripted failure is an expected call


async def test_latency_is_simulated_without_blocking_the_loop() -> None:
    model = ScriptedModel([Reply.say("slow", delay=0.2), Reply.say("forever", delay=3600)])
    loop = asyncio.get_running_loop()
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0)
            ticks += 1

    side = asyncio.create_task(ticker())
    try:
        started = loop.time()
        out = await model.complete(request())
        took = loop.time() - started
    finally:
        side.cancel()
    assert text_of(out.content) == "slow"
    assert took >= 0.2
    assert ticks > 0  # the loop ran other work while the model "thought"

    # A slow call is an ordinary await: a caller's timeout cancels it at once.
    started = loop.time()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await model.complete(request())
    assert loop.time() - started < 5
    model.assert_done()


async def test_text_is_streamed_in_the_scripted_number_of_chunks() -> None:
    model = ScriptedModel([Reply.say("abcdefghij", chunks=3)])
    deltas: list[str] = []
    out = await model.complete(request(), on_delta=deltas.append)
    assert len(deltas) == 3 and "".join(deltas) == "abcdefghij" == text_of(out.content)


# -- behind a real agent, on a real SQLite file -----------------------------------------------------


async def test_behind_an_agent_an_unexpected_call_ends_the_turn_error_and_is_recorded(
    open_runtime: OpenRuntime,
) -> None:
    model = ScriptedModel([Reply.say("the only answer")])
    async with open_runtime(model) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        for text in ("first", "second"):
            await agent.followup(text)
            async with asyncio.timeout(WAIT):
                await agent.when_idle()
        ends = [e.data for e in await rt.store.events_after(sid, 0, types=[EventType.TURN_END])]
        calls = await rt.store.read(
            lambda conn: [dict(r) for r in conn.execute("SELECT * FROM model_calls WHERE session_id=?", (sid,))]
        )
    assert [e["reason"] for e in ends] == ["end_turn", "error"]
    assert ends[1]["errorKind"] == ModelErrorKind.UNEXPECTED_CALL.value
    assert [c["error_class"] for c in calls] == [None, ModelErrorKind.UNEXPECTED_CALL.value]
    with pytest.raises(AssertionError, match="1 unexpected call"):
        model.assert_done()


async def test_behind_an_agent_a_length_finish_and_scripted_usage_reach_the_store(open_runtime: OpenRuntime) -> None:
    usage = Usage(input_tokens=321, output_tokens=77)
    model = ScriptedModel([Reply.say("cut", finish=FinishReason.MAX_TOKENS, usage=usage)])
    async with open_runtime(model) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        await agent.followup("write a lot")
        async with asyncio.timeout(WAIT):
            await agent.when_idle()
        (end,) = [e.data for e in await rt.store.events_after(sid, 0, types=[EventType.TURN_END])]
        (call,) = await rt.store.read(
            lambda conn: [dict(r) for r in conn.execute("SELECT * FROM model_calls WHERE session_id=?", (sid,))]
        )
    model.assert_done()
    assert end["reason"] == "max_tokens"
    assert (call["input_tokens"], call["output_tokens"]) == (usage.input_tokens, usage.output_tokens)
