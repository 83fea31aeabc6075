"""The Anthropic provider against a local server speaking the real Messages API stream format.

Pins: what goes on the wire (the system prompt as its own parameter, ``tool_use`` blocks on the
assistant message, consecutive tool results merged into one user message with ``is_error``,
tools with their JSON schema, the key and ``anthropic-version`` headers, the SDK's own retries
off); streamed text as deltas; tool input assembled from ``input_json_delta`` fragments split
mid-JSON; usage from ``message_start`` and ``message_delta`` with cache writes and reads; stop
reasons (``max_tokens``, ``tool_use``, ``end_turn``/``stop_sequence``, ``refusal``); and the
failure classes: 429 + Retry-After -> rate_limit, 5xx and an ``overloaded_error`` event ->
server (retried by the driver: a ``model_calls`` row per attempt, usage charged; a Retry-After
is waited out), timeouts, a stream cut
before ``message_stop`` -> connection (a failed attempt that still reports the input usage seen),
a malformed event -> malformed (the turn ends ``error``), 401 -> auth (one attempt). No message
ever carries the API key.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from providers_server import (
    ProviderServer,
    Respond,
    an_message_delta,
    an_message_start,
    an_message_stop,
    an_ping,
    an_text,
    an_tool,
    anthropic_text,
    run_turn,
    sse,
)
from pydantic import BaseModel

from agent import (
    ConvMessage,
    EventType,
    FinishReason,
    FunctionTool,
    ModelError,
    ModelErrorKind,
    ModelRequest,
    Price,
    RetryPolicy,
    TextBlock,
    ToolContext,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
    Usage,
)
from agent.models.anthropic import AnthropicModel

KEY = "sk-ant-test-0123456789abcdef"
USER_HI = ConvMessage(role="user", content=[TextBlock(text="hi")])


@pytest.fixture
async def server() -> AsyncIterator[ProviderServer]:
    async with ProviderServer() as srv:
        yield srv
        srv.assert_done()


@pytest.fixture
async def model(server: ProviderServer) -> AsyncIterator[AnthropicModel]:
    m = AnthropicModel("claude-test", base_url=server.url, api_key=KEY, timeout=5.0, max_tokens=256)
    yield m
    await m.aclose()


def request(
    *messages: ConvMessage, system: str | None = "be brief", tools: list[ToolSpec] | None = None, max_tokens: int = 256
) -> ModelRequest:
    return ModelRequest(system, list(messages or [USER_HI]), list(tools or []), max_tokens)


async def fails(model: AnthropicModel, req: ModelRequest | None = None) -> ModelError:
    with pytest.raises(ModelError) as info:
        await model.complete(req or request())
    assert KEY not in str(info.value)
    return info.value


def carries_key(headers: dict[str, str]) -> bool:
    """The SDK sends the key as ``x-api-key`` or as a bearer token, depending on its version."""
    return headers.get("x-api-key") == KEY or headers.get("authorization") == f"Bearer {KEY}"


class CityArgs(BaseModel):
    city: str
    days: int = 1


async def _weather(args: CityArgs, ctx: ToolContext) -> str:
    return f"sunny in {args.city} for {args.days} day(s)"


WEATHER = FunctionTool("weather", "the forecast for a city", CityArgs, _weather)


def tool_answer(
    *blocks: list[bytes], stop: str = "tool_use", input_tokens: int = 40, output_tokens: int = 20, **usage: int
) -> list[bytes]:
    frames = [an_message_start(input_tokens, **usage)]
    for block in blocks:
        frames += block
    return [*frames, an_message_delta(stop, output_tokens), an_message_stop()]


# -- success paths ---------------------------------------------------------------------------------


async def test_plain_text_streams_deltas_and_maps_usage(server: ProviderServer, model: AnthropicModel) -> None:
    server.add(
        Respond.stream(
            anthropic_text(["Hel", "lo, ", "world"], input_tokens=12, output_tokens=7, cache_read=100, cache_write=30)
        )
    )
    deltas: list[str] = []
    out = await model.complete(request(), deltas.append)
    assert deltas == ["Hel", "lo, ", "world"]
    assert out.content == [TextBlock(text="Hello, world")]
    assert out.finish_reason is FinishReason.END_TURN
    assert out.usage == Usage(input_tokens=12, output_tokens=7, cache_read_tokens=100, cache_write_tokens=30)

    [sent] = server.requests
    assert (sent.method, sent.path) == ("POST", "/v1/messages")
    assert carries_key(sent.headers)
    assert sent.headers["anthropic-version"]
    assert sent.headers["x-stainless-retry-count"] == "0"
    assert sent.body == {
        "model": "claude-test",
        "max_tokens": 256,
        "stream": True,
        "system": "be brief",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }


async def test_conversation_and_tools_are_serialized_as_messages(server: ProviderServer, model: AnthropicModel) -> None:
    server.add(Respond.stream(anthropic_text(["ok"])))
    history = [
        ConvMessage(role="user", content=[TextBlock(text="weather in Oslo and Rome?")]),
        ConvMessage(
            role="assistant",
            content=[
                TextBlock(text="Checking."),
                ToolUseBlock(id="toolu_a", name="weather", input={"city": "Oslo"}),
                ToolUseBlock(id="toolu_b", name="weather", input={"city": "Rome", "days": 2}),
            ],
        ),
        ConvMessage(role="tool", content=[ToolResultBlock(tool_use_id="toolu_a", content="rain")]),
        ConvMessage(
            role="tool", content=[ToolResultBlock(tool_use_id="toolu_b", content="no such city", is_error=True)]
        ),
        ConvMessage(role="user", content=[TextBlock(text="and tomorrow?")]),
        ConvMessage(role="assistant", content=[TextBlock(text="")]),  # an empty answer: the API refuses empty text
        ConvMessage(role="user", content=[TextBlock(text="hello?")]),
    ]
    await model.complete(request(*history, system=None, tools=[WEATHER.spec()]))
    body = server.requests[0].body
    assert "system" not in body
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "weather in Oslo and Rome?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_a", "name": "weather", "input": {"city": "Oslo"}},
                {"type": "tool_use", "id": "toolu_b", "name": "weather", "input": {"city": "Rome", "days": 2}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_a", "content": "rain"},
                {"type": "tool_result", "tool_use_id": "toolu_b", "content": "no such city", "is_error": True},
                {"type": "text", "text": "and tomorrow?"},
                {"type": "text", "text": "hello?"},
            ],
        },
    ]
    assert body["tools"] == [
        {"name": "weather", "description": "the forecast for a city", "input_schema": CityArgs.model_json_schema()}
    ]


async def test_one_tool_call_with_input_split_mid_json(server: ProviderServer, model: AnthropicModel) -> None:
    server.add(
        Respond.stream(tool_answer(an_tool(0, "toolu_1", "weather", ['{"ci', 'ty": "Zür', 'ich", "da', 'ys": 3}'])))
    )
    out = await model.complete(request(tools=[WEATHER.spec()]))
    assert out.content == [ToolUseBlock(id="toolu_1", name="weather", input={"city": "Zürich", "days": 3})]
    assert out.finish_reason is FinishReason.TOOL_USE
    assert out.usage == Usage(input_tokens=40, output_tokens=20)


async def test_text_and_several_tool_calls_in_one_message(server: ProviderServer, model: AnthropicModel) -> None:
    server.add(
        Respond.stream(
            tool_answer(
                an_text(0, ["Let me check ", "both."]),
                an_tool(1, "toolu_a", "weather", ['{"city"', ': "Oslo"}']),
                an_tool(2, "toolu_b", "weather", ["", '{"city": "Rome", ', '"days": 2}']),
            )
        )
    )
    deltas: list[str] = []
    out = await model.complete(request(tools=[WEATHER.spec()]), deltas.append)
    assert deltas == ["Let me check ", "both."]
    assert out.content == [
        TextBlock(text="Let me check both."),
        ToolUseBlock(id="toolu_a", name="weather", input={"city": "Oslo"}),
        ToolUseBlock(id="toolu_b", name="weather", input={"city": "Rome", "days": 2}),
    ]


async def test_a_tool_call_without_input_has_empty_arguments(server: ProviderServer, model: AnthropicModel) -> None:
    server.add(Respond.stream(tool_answer(an_tool(0, "toolu_n", "noop", []))))
    out = await model.complete(request())
    assert out.content == [ToolUseBlock(id="toolu_n", name="noop", input={})]


@pytest.mark.parametrize(
    ("stop_reason", "finish"),
    [
        ("max_tokens", FinishReason.MAX_TOKENS),
        ("end_turn", FinishReason.END_TURN),
        ("stop_sequence", FinishReason.END_TURN),
        ("refusal", FinishReason.REFUSAL),
    ],
)
async def test_stop_reasons(
    server: ProviderServer, model: AnthropicModel, stop_reason: str, finish: FinishReason
) -> None:
    server.add(Respond.stream(anthropic_text(["some text"], stop_reason=stop_reason)))
    out = await model.complete(request(max_tokens=16))
    assert out.finish_reason is finish
    assert out.content == [TextBlock(text="some text")]


# -- failures --------------------------------------------------------------------------------------


async def test_429_is_rate_limit_with_retry_after(server: ProviderServer, model: AnthropicModel) -> None:
    server.add(
        Respond.json(
            429,
            {"type": "error", "error": {"type": "rate_limit_error", "message": "Number of requests exceeded"}},
            {"retry-after": "12"},
        )
    )
    err = await fails(model)
    assert (err.kind, err.retry_after, err.status) == (ModelErrorKind.RATE_LIMIT, 12.0, 429)
    assert "Number of requests exceeded" in err.message
    assert len(server.requests) == 1  # the SDK did not retry by itself


async def test_529_overloaded_is_a_server_error(server: ProviderServer, model: AnthropicModel) -> None:
    server.add(Respond.json(529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}))
    err = await fails(model)
    assert (err.kind, err.status) == (ModelErrorKind.SERVER, 529)
    assert err.retryable


async def test_an_overloaded_error_event_mid_stream_is_a_server_error(
    server: ProviderServer, model: AnthropicModel
) -> None:
    server.add(
        Respond.stream(
            [
                an_message_start(25),
                *an_text(0, ["Hel"]),
                sse({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}, "error"),
            ]
        )
    )
    err = await fails(model)
    assert err.kind is ModelErrorKind.SERVER
    assert "overloaded_error" in err.message
    assert err.usage is not None and err.usage.input_tokens == 25


async def test_500_then_success_through_a_runtime_turn(
    server: ProviderServer, model: AnthropicModel, db_path: Path
) -> None:
    server.add(
        Respond.json(500, {"type": "error", "error": {"type": "api_error", "message": "Internal server error"}}),
        Respond.stream(anthropic_text(["recovered"], input_tokens=30, output_tokens=4, cache_read=10, cache_write=6)),
    )
    record = await run_turn(db_path, model)
    assert record.turn_end["reason"] == "end_turn"
    first, second = record.calls
    assert (first["attempt"], first["error_class"], first["input_tokens"]) == (1, "server", 0)
    assert "HTTP 500" in first["error"] and "Internal server error" in first["error"]
    assert (second["attempt"], second["error_class"], second["state"]) == (2, None, "settled")
    assert (
        second["input_tokens"],
        second["output_tokens"],
        second["cache_read_tokens"],
        second["cache_write_tokens"],
    ) == (30, 4, 10, 6)
    assert record.charged_tokens == 50
    [answer] = record.of(EventType.ASSISTANT_MESSAGE)
    assert answer.data["content"] == [{"type": "text", "text": "recovered"}]
    assert answer.data["model"] == "anthropic:claude-test"


async def test_429_with_retry_after_then_500_then_success_through_a_runtime_turn(
    server: ProviderServer, db_path: Path
) -> None:
    price = Price(input=3.0, output=15.0, cache_read=0.3, cache_write=3.75)
    model = AnthropicModel("claude-test", base_url=server.url, api_key=KEY, timeout=5.0, max_tokens=256, price=price)
    expected = Usage(input_tokens=30, output_tokens=4, cache_read_tokens=10, cache_write_tokens=6)
    server.add(
        Respond.json(
            429,
            {"type": "error", "error": {"type": "rate_limit_error", "message": "Number of requests exceeded"}},
            {"retry-after": "1"},
        ),
        Respond.json(500, {"type": "error", "error": {"type": "api_error", "message": "Internal server error"}}),
        Respond.stream(
            anthropic_text(
                ["at last"],
                input_tokens=expected.input_tokens,
                output_tokens=expected.output_tokens,
                cache_read=expected.cache_read_tokens,
                cache_write=expected.cache_write_tokens,
            )
        ),
    )
    try:
        record = await run_turn(db_path, model)
    finally:
        await model.aclose()
    assert record.turn_end["reason"] == "end_turn"
    rate_limited, server_error, answered = record.calls
    assert [(c["attempt"], c["state"], c["error_class"]) for c in record.calls] == [
        (1, "settled", "rate_limit"),
        (2, "settled", "server"),
        (3, "settled", None),
    ]
    # Retry-After honoured after the 429; the driver's own short backoff after the 500.
    assert waited(rate_limited, server_error) >= 1.0
    assert waited(server_error, answered) < 1.0
    assert len(server.requests) == 3
    row_usage = [
        Usage(
            input_tokens=c["input_tokens"],
            output_tokens=c["output_tokens"],
            cache_read_tokens=c["cache_read_tokens"],
            cache_write_tokens=c["cache_write_tokens"],
        )
        for c in record.calls
    ]
    assert row_usage == [Usage(), Usage(), expected]
    assert record.charged_tokens == expected.total
    assert record.charged_cost == pytest.approx(price.cost(expected))
    assert [(e.data["kind"], e.data["retrying"]) for e in record.of(EventType.MODEL_ERROR)] == [
        ("rate_limit", True),
        ("server", True),
    ]


def waited(before: dict[str, Any], after: dict[str, Any]) -> float:
    """Seconds between one attempt's settlement and the next attempt's reservation (``model_calls``)."""
    return (datetime.fromisoformat(after["started_at"]) - datetime.fromisoformat(before["ended_at"])).total_seconds()


async def test_a_slow_server_times_out(server: ProviderServer) -> None:
    model = AnthropicModel("claude-test", base_url=server.url, api_key=KEY, timeout=0.3)
    server.add(
        Respond.stream(anthropic_text(["late"]), delay=30),
        Respond.stream([an_message_start(9), *an_text(0, ["part"])[:2]], ending="stall"),
    )
    try:
        before_headers = await fails(model)
        mid_stream = await fails(model)
    finally:
        await model.aclose()
    assert before_headers.kind is ModelErrorKind.TIMEOUT
    assert mid_stream.kind is ModelErrorKind.TIMEOUT
    assert mid_stream.usage == Usage(input_tokens=9, output_tokens=1)


async def test_a_stream_dropped_mid_way_is_a_connection_failure_with_the_usage_seen(
    server: ProviderServer, model: AnthropicModel
) -> None:
    server.add(Respond.stream([an_message_start(33), an_ping(), *an_text(0, ["Hel", "lo"])[:3]], ending="drop"))
    deltas: list[str] = []
    with pytest.raises(ModelError) as info:
        await model.complete(request(), deltas.append)
    err = info.value
    assert err.kind is ModelErrorKind.CONNECTION and err.retryable
    assert err.usage == Usage(input_tokens=33, output_tokens=1)
    assert deltas == ["Hel", "lo"]


async def test_a_stream_that_ends_before_message_stop_is_a_failed_attempt(
    server: ProviderServer, model: AnthropicModel
) -> None:
    # The HTTP body ends cleanly after the text, but without message_delta / message_stop.
    server.add(Respond.stream([an_message_start(5), *an_text(0, ["Half an ans"])]))
    err = await fails(model)
    assert err.kind is ModelErrorKind.CONNECTION
    assert "message_stop" in err.message


async def test_a_dropped_stream_is_retried_by_the_driver_and_charged(
    server: ProviderServer, model: AnthropicModel, db_path: Path
) -> None:
    server.add(
        Respond.stream([an_message_start(20), *an_text(0, ["Half an ans"])[:2]], ending="drop"),
        Respond.stream(anthropic_text(["Whole answer."], input_tokens=20, output_tokens=3)),
    )
    record = await run_turn(db_path, model)
    assert record.turn_end["reason"] == "end_turn"
    assert [c["error_class"] for c in record.calls] == ["connection", None]
    # The failed attempt is charged the input it reported before the drop.
    assert record.calls[0]["input_tokens"] == 20
    assert record.charged_tokens == (20 + 1) + (20 + 3)
    [error] = record.of(EventType.MODEL_ERROR)
    assert error.data["discardedChars"] == len("Half an ans")


async def test_a_malformed_event_is_malformed(server: ProviderServer, model: AnthropicModel) -> None:
    server.add(
        Respond.stream([an_message_start(5), b'event: content_block_delta\ndata: {"type": "content_b\n\n']),
        Respond.stream(
            [
                an_message_start(5),
                sse({"type": "content_block_start", "index": 0, "content_block": "text"}, "content_block_start"),
            ]
        ),
    )
    not_json = await fails(model)
    assert not_json.kind is ModelErrorKind.MALFORMED
    assert "not valid JSON" in not_json.message
    wrong_shape = await fails(model)
    assert wrong_shape.kind is ModelErrorKind.MALFORMED
    assert not wrong_shape.retryable


async def test_a_malformed_event_is_retried_within_the_turn(
    server: ProviderServer, model: AnthropicModel, db_path: Path
) -> None:
    # A proxy's glitch: one event whose data is not JSON, then a good answer on the retry.
    server.add(
        Respond.stream(
            [an_message_start(7), *an_text(0, ["Half"])[:2], b"event: content_block_delta\ndata: {oops\n\n"]
        ),
        Respond.stream(anthropic_text(["Whole answer."], input_tokens=7, output_tokens=3)),
    )
    record = await run_turn(db_path, model)
    assert record.turn_end["reason"] == "end_turn"
    # Both attempts are recorded: the malformed one settled to the usage it reported, then the answer.
    assert [(c["attempt"], c["state"], c["error_class"]) for c in record.calls] == [
        (1, "settled", "malformed"),
        (2, "settled", None),
    ]
    assert record.calls[0]["input_tokens"] == 7
    [error] = record.of(EventType.MODEL_ERROR)
    assert error.data["kind"] == "malformed" and error.data["retrying"] is True
    assert error.data["discardedChars"] == len("Half")
    [answer] = record.of(EventType.ASSISTANT_MESSAGE)
    assert answer.data["content"] == [{"type": "text", "text": "Whole answer."}]
    server.assert_done()


async def test_an_event_malformed_on_every_attempt_ends_the_turn_with_error(
    server: ProviderServer, model: AnthropicModel, db_path: Path
) -> None:
    attempts = RetryPolicy().max_attempts
    server.add(*[Respond.stream([an_message_start(5), b"event: message_delta\ndata: {oops\n\n"])] * attempts)
    record = await run_turn(db_path, model)
    end = record.turn_end
    assert (end["reason"], end["errorKind"]) == ("error", "malformed")
    assert "malformed stream event" in end["error"] and "not valid JSON" in end["error"]
    assert [c["error_class"] for c in record.calls] == ["malformed"] * attempts
    server.assert_done()


async def test_tool_input_that_is_not_json_is_malformed(server: ProviderServer, model: AnthropicModel) -> None:
    server.add(Respond.stream(tool_answer(an_tool(0, "toolu_x", "weather", ['{"city": "Os']))))
    err = await fails(model)
    assert err.kind is ModelErrorKind.MALFORMED
    assert "weather" in err.message and "not valid JSON" in err.message


async def test_401_is_auth_and_is_not_retried(server: ProviderServer, model: AnthropicModel, db_path: Path) -> None:
    server.add(
        Respond.json(
            401,
            {"type": "error", "error": {"type": "authentication_error", "message": f"invalid x-api-key {KEY}"}},
        )
    )
    record = await run_turn(db_path, model)
    end = record.turn_end
    assert (end["reason"], end["errorKind"]) == ("error", "auth")
    assert KEY not in end["error"] and "[redacted]" in end["error"]
    [call] = record.calls
    assert call["error_class"] == "auth"
    assert not any(KEY in str(e.data) for e in record.events)
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, ModelErrorKind.BAD_REQUEST),
        (403, ModelErrorKind.AUTH),
        (413, ModelErrorKind.BAD_REQUEST),
        (503, ModelErrorKind.SERVER),
    ],
)
async def test_other_statuses_are_classified(
    server: ProviderServer, model: AnthropicModel, status: int, kind: ModelErrorKind
) -> None:
    server.add(Respond.json(status, {"type": "error", "error": {"type": "some_error", "message": "nope"}}))
    err = await fails(model)
    assert (err.kind, err.status) == (kind, status)


async def test_a_tool_turn_runs_through_the_runtime(
    server: ProviderServer, model: AnthropicModel, db_path: Path
) -> None:
    server.add(
        Respond.stream(tool_answer(an_tool(0, "toolu_w", "weather", ['{"city": ', '"Oslo"}']))),
        Respond.stream(anthropic_text(["Sunny in Oslo."], input_tokens=70, output_tokens=5)),
    )
    record = await run_turn(db_path, model, "weather in Oslo?", tools=[WEATHER])
    assert record.turn_end["reason"] == "end_turn"
    [result] = record.of(EventType.TOOL_RESULT)
    assert result.data["content"] == "sunny in Oslo for 1 day(s)"
    messages = server.requests[1].body["messages"]
    assert messages[-2]["content"] == [
        {"type": "tool_use", "id": "toolu_w", "name": "weather", "input": {"city": "Oslo"}}
    ]
    assert messages[-1] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_w", "content": "sunny in Oslo for 1 day(s)"}],
    }
    assert record.charged_tokens == 60 + 75
