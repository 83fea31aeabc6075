"""What only the OpenAI-compatible provider does, against a local server speaking chat completions.

What every provider does (the request, streamed text and tool calls, usage, the failure classes
and the driver's retries) is pinned once for both in ``test_provider_contract.py``. Here: the
output-limit parameter (``max_completion_tokens`` for the official API, ``max_tokens`` for
compatible servers), tool calls that finish with ``stop`` (older Ollama), ``length`` ->
max_tokens, ``content_filter`` and refusal deltas -> refusal, a Retry-After given as an HTTP
date, a server that sends no usage (charged an estimate), an ``{"error": ...}`` object inside a
200 stream (OpenRouter), an interrupt mid-stream, streamed deltas to control-protocol
subscribers, and that ``import agent`` imports neither SDK.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest
from harness import Daemon, rpc
from providers_server import (
    ProviderServer,
    Respond,
    oa_call,
    oa_chunk,
    oa_usage,
    openai_stream,
    openai_text,
    sse,
)

from agent import (
    ConvMessage,
    EventType,
    FinishReason,
    ModelError,
    ModelErrorKind,
    ModelRegistry,
    ModelRequest,
    Runtime,
    TextBlock,
    ToolSpec,
    ToolUseBlock,
)
from agent.models.openai import OpenAIModel
from daemon.client import Connection as Client
from daemon.client import RpcError

KEY = "sk-test-0123456789abcdef"
USER_HI = ConvMessage(role="user", content=[TextBlock(text="hi")])


@pytest.fixture
async def server() -> AsyncIterator[ProviderServer]:
    async with ProviderServer() as srv:
        yield srv
        srv.assert_done()


@pytest.fixture
async def model(server: ProviderServer) -> AsyncIterator[OpenAIModel]:
    m = OpenAIModel("gpt-test", base_url=server.url + "/v1", api_key=KEY, timeout=5.0, max_tokens=256)
    yield m
    await m.aclose()


def request(
    *messages: ConvMessage, system: str | None = "be brief", tools: list[ToolSpec] | None = None, max_tokens: int = 256
) -> ModelRequest:
    return ModelRequest(system, list(messages or [USER_HI]), list(tools or []), max_tokens)


async def fails(model: OpenAIModel, req: ModelRequest | None = None) -> ModelError:
    with pytest.raises(ModelError) as info:
        await model.complete(req or request())
    assert KEY not in str(info.value)
    return info.value


# -- success paths ---------------------------------------------------------------------------------


async def test_tool_calls_with_finish_stop_still_count_as_tool_use(server: ProviderServer, model: OpenAIModel) -> None:
    # Some compatible servers (older Ollama) say "stop" after tool calls.
    server.add(
        Respond.stream(
            openai_stream(
                [
                    oa_chunk(tool_calls=[oa_call(0, id="c1", name="weather", args='{"city": "Oslo"}')]),
                    oa_chunk(finish="stop"),
                    oa_chunk(no_choices=True, usage=oa_usage(5, 5)),
                ]
            )
        )
    )
    out = await model.complete(request())
    assert out.finish_reason is FinishReason.TOOL_USE
    assert out.content == [ToolUseBlock(id="c1", name="weather", input={"city": "Oslo"})]


async def test_length_finish_is_max_tokens(server: ProviderServer, model: OpenAIModel) -> None:
    server.add(Respond.stream(openai_text(["a long answer that was cu"], finish="length", usage=oa_usage(10, 16))))
    out = await model.complete(request(max_tokens=16))
    assert out.finish_reason is FinishReason.MAX_TOKENS
    assert out.content == [TextBlock(text="a long answer that was cu")]
    assert server.requests[0].body["max_tokens"] == 16


async def test_content_filter_and_refusal_deltas_are_refusals(server: ProviderServer, model: OpenAIModel) -> None:
    server.add(
        Respond.stream(openai_text(["I started but"], finish="content_filter")),
        Respond.stream(
            openai_stream(
                [
                    oa_chunk(role="assistant", refusal="I can't help "),
                    oa_chunk(refusal="with that."),
                    oa_chunk(finish="stop"),
                    oa_chunk(no_choices=True, usage=oa_usage(9, 4)),
                ]
            )
        ),
    )
    filtered = await model.complete(request())
    assert filtered.finish_reason is FinishReason.REFUSAL
    refused = await model.complete(request())
    assert refused.finish_reason is FinishReason.REFUSAL
    assert refused.content == [TextBlock(text="I can't help with that.")]


async def test_official_openai_defaults_to_max_completion_tokens() -> None:
    # No request is made: only how the output limit would be sent.
    assert OpenAIModel("gpt-5", api_key=KEY).max_tokens_param == "max_completion_tokens"
    assert OpenAIModel("llama3", base_url="http://127.0.0.1:1/v1").max_tokens_param == "max_tokens"


async def test_max_completion_tokens_is_sent_when_chosen(server: ProviderServer) -> None:
    model = OpenAIModel("o-test", base_url=server.url + "/v1", api_key=KEY, max_tokens_param="max_completion_tokens")
    server.add(Respond.stream(openai_text(["ok"])))
    try:
        await model.complete(request(max_tokens=99))
    finally:
        await model.aclose()
    body = server.requests[0].body
    assert body["max_completion_tokens"] == 99
    assert "max_tokens" not in body


async def test_a_server_without_usage_is_charged_an_estimate(server: ProviderServer, model: OpenAIModel) -> None:
    server.add(Respond.stream(openai_stream([oa_chunk(content="hello there"), oa_chunk(finish="stop")])))
    out = await model.complete(request())
    assert out.content == [TextBlock(text="hello there")]
    assert out.usage.input_tokens > 0
    assert out.usage.output_tokens > 0


# -- failures --------------------------------------------------------------------------------------


async def test_429_retry_after_as_an_http_date(server: ProviderServer, model: OpenAIModel) -> None:
    when = datetime.now(UTC) + timedelta(seconds=30)
    retry_at = format_datetime(when, usegmt=True)
    server.add(Respond.json(429, {"error": {"message": "slow down"}}, {"Retry-After": retry_at}))
    err = await fails(model)
    assert err.kind is ModelErrorKind.RATE_LIMIT
    assert err.retry_after is not None
    assert 20 <= err.retry_after <= 31


async def test_an_error_object_inside_the_stream_is_classified(server: ProviderServer, model: OpenAIModel) -> None:
    # OpenRouter reports upstream failures this way, after a 200.
    server.add(Respond.stream([sse(oa_chunk(content="x")), sse({"error": {"code": 502, "message": "upstream died"}})]))
    err = await fails(model)
    assert err.kind is ModelErrorKind.SERVER
    assert "upstream died" in err.message


def test_import_agent_does_not_import_the_sdks() -> None:
    code = (
        "import sys, agent, agent.models.openai, agent.models.anthropic, agent.models.health\n"
        "assert 'openai' not in sys.modules and 'anthropic' not in sys.modules, sorted(sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr


async def test_an_interrupt_mid_stream_cancels_the_call_and_keeps_the_partial_text(
    server: ProviderServer, model: OpenAIModel, db_path: Path
) -> None:
    server.add(Respond.stream([sse(oa_chunk(role="assistant", content="Partial answer"))], ending="stall"))
    registry = ModelRegistry({model.spec: model}, default=model.spec)
    async with Runtime.open(db_path, models=registry) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        streamed = asyncio.Event()
        agent.add_delta_listener(lambda turn_id, text: streamed.set())
        await agent.followup("go")
        async with asyncio.timeout(10):
            await streamed.wait()
            await agent.interrupt()
            await agent.when_idle()
        events = await rt.store.events_after(sid, 0)
    [end] = [e.data for e in events if e.type == EventType.TURN_END]
    assert end["reason"] == "cancelled"
    [partial] = [e.data for e in events if e.type == EventType.ASSISTANT_MESSAGE]
    assert partial["interrupted"] is True
    assert partial["content"] == [{"type": "text", "text": "Partial answer"}]


# -- streamed text on the control protocol -----------------------------------------------------------


async def until_idle(client: Client, after_seq: int) -> list[dict[str, Any]]:
    """One subscription's notifications up to the first idle status after ``after_seq``."""
    notes: list[dict[str, Any]] = []
    async with asyncio.timeout(30):
        while True:
            note = await client.next_notification()
            notes.append(note)
            params = note["params"]
            if note["method"] == "session.status" and params["status"] == "idle" and params["seq"] > after_seq:
                return notes


def deltas_and_answer(notes: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int, dict[str, Any]]:
    """The ``session.delta`` params, the index of the committed answer among ``notes``, and its event."""
    deltas = [n["params"] for n in notes if n["method"] == "session.delta"]
    [(at, answer)] = [
        (i, n["params"]["event"])
        for i, n in enumerate(notes)
        if n["method"] == "session.event" and n["params"]["event"]["type"] == EventType.ASSISTANT_MESSAGE
    ]
    return deltas, at, answer


async def test_subscribers_asking_for_deltas_get_the_streamed_text_before_the_committed_message(
    server: ProviderServer, tmp_path: Path
) -> None:
    first, second = ["Deltas ", "arrive ", "first."], ["Then ", "the ", "second ", "turn."]
    server.add(
        Respond.stream(openai_text(first, usage=oa_usage(20, 3))),
        Respond.stream(openai_text(second, usage=oa_usage(40, 4))),
    )
    provider = {"kind": "openai", "base_url": server.url + "/v1", "api_key_env": "DELTA_TEST_API_KEY"}
    d = Daemon(tmp_path / "state", config={"providers": {"local": provider}})
    try:
        d.start(extra_env={"DELTA_TEST_API_KEY": KEY})
        sid = (await rpc(d.socket_path, "session/new", {"model": "local:gpt-test"}))["sessionId"]
        async with await Client.connect(d.socket_path) as streaming, await Client.connect(d.socket_path) as plain:
            await streaming.call("session/subscribe", {"sessionId": sid, "afterSeq": 0, "deltas": True})
            await plain.call("session/subscribe", {"sessionId": sid, "afterSeq": 0})
            await rpc(d.socket_path, "session/prompt", {"sessionId": sid, "text": "hi"})
            with_deltas, without = await until_idle(streaming, 0), await until_idle(plain, 0)
            idle_seq = with_deltas[-1]["params"]["seq"]
            # A subscriber that comes later replays the stored events (no deltas: none are stored), then
            # is live and gets the next turn's deltas.
            async with await Client.connect(d.socket_path) as late:
                await late.call("session/subscribe", {"sessionId": sid, "afterSeq": 0, "deltas": True})
                replayed = await until_idle(late, 0)
                await rpc(d.socket_path, "session/prompt", {"sessionId": sid, "text": "again"})
                later = await until_idle(late, idle_seq)
            # Asking for deltas without a session is refused.
            with pytest.raises(RpcError) as refused:
                await plain.call("session/subscribe", {"deltas": True})
        assert d.terminate() == 0
    finally:
        d.close()

    deltas, at, answer = deltas_and_answer(with_deltas)
    assert [x["text"] for x in deltas] == first
    # Ephemeral: no sequence number; all of them before the committed message, which says the same.
    assert all(set(x) == {"sessionId", "turnId", "text"} and x["sessionId"] == sid for x in deltas)
    assert {x["turnId"] for x in deltas} == {answer["data"]["turnId"]}
    last_delta = max(i for i, n in enumerate(with_deltas) if n["method"] == "session.delta")
    assert last_delta < at
    assert answer["data"]["content"] == [{"type": "text", "text": "".join(x["text"] for x in deltas)}]
    # The same durable events for both subscribers; deltas only for the one that asked.
    assert not any(n["method"] == "session.delta" for n in without)
    assert [n for n in with_deltas if n["method"] != "session.delta"] == without
    assert replayed == without
    # The late subscriber: only the live turn's text, before that turn's committed message.
    deltas, at, answer = deltas_and_answer(later)
    assert [x["text"] for x in deltas] == second
    assert {x["turnId"] for x in deltas} == {answer["data"]["turnId"]}
    assert max(i for i, n in enumerate(later) if n["method"] == "session.delta") < at
    assert answer["data"]["content"] == [{"type": "text", "text": "".join(second)}]
    assert refused.value.code == -32602
