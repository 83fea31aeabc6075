"""The OpenAI-compatible provider against a local server speaking the real chat-completions wire format.

Pins: what goes on the wire (system first, assistant tool calls, one ``tool`` message per result,
function tools, ``stream_options.include_usage``, the key in ``Authorization``, the SDK's own
retries off); streamed text as deltas; tool calls assembled by index from arguments split
mid-JSON; usage from the last chunk with cached tokens as cache reads; finish reasons
(``length`` -> max_tokens, ``content_filter``/refusal -> refusal); and the failure classes the
driver and the goal engine act on: 429 + Retry-After -> rate_limit with the delay (waited out by
the driver), 5xx -> server (retried by the driver: a ``model_calls`` row per attempt, usage
charged), timeouts, a stream dropped mid-way or ending without a finish reason -> connection (a
failed attempt, its partial text discarded), a malformed chunk -> malformed (the turn ends
``error``), 401 -> auth (one attempt). No message ever carries the API key.
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
    ModelRegistry,
    ModelRequest,
    Price,
    RetryPolicy,
    Runtime,
    TextBlock,
    ToolContext,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
    Usage,
)
from agent.models.openai import TOOL_ERROR_PREFIX, OpenAIModel
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


class CityArgs(BaseModel):
    city: str
    days: int = 1


async def _weather(args: CityArgs, ctx: ToolContext) -> str:
    return f"sunny in {args.city} for {args.days} day(s)"


WEATHER = FunctionTool("weather", "the forecast for a city", CityArgs, _weather)


# -- success paths ---------------------------------------------------------------------------------


async def test_plain_text_streams_deltas_and_maps_usage(server: ProviderServer, model: OpenAIModel) -> None:
    server.add(Respond.stream(openai_text(["Hel", "lo, ", "world"], usage=oa_usage(120, 7, cached=100))))
    deltas: list[str] = []
    out = await model.complete(request(), deltas.append)
    assert deltas == ["Hel", "lo, ", "world"]
    assert out.content == [TextBlock(text="Hello, world")]
    assert out.finish_reason is FinishReason.END_TURN
    assert out.usage == Usage(input_tokens=20, output_tokens=7, cache_read_tokens=100)

    [sent] = server.requests
    assert (sent.method, sent.path) == ("POST", "/v1/chat/completions")
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert sent.headers["x-stainless-retry-count"] == "0"
    body = sent.body
    assert body["model"] == "gpt-test"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 256
    assert body["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert "tools" not in body


async def test_conversation_and_tools_are_serialized_as_chat_messages(
    server: ProviderServer, model: OpenAIModel
) -> None:
    server.add(Respond.stream(openai_text(["ok"])))
    history = [
        ConvMessage(role="user", content=[TextBlock(text="weather in Oslo and Rome?")]),
        ConvMessage(
            role="assistant",
            content=[
                TextBlock(text="Checking."),
                ToolUseBlock(id="call_a", name="weather", input={"city": "Oslo"}),
                ToolUseBlock(id="call_b", name="weather", input={"city": "Rome", "days": 2}),
            ],
        ),
        ConvMessage(role="tool", content=[ToolResultBlock(tool_use_id="call_a", content="rain")]),
        ConvMessage(
            role="tool", content=[ToolResultBlock(tool_use_id="call_b", content="no such city", is_error=True)]
        ),
        ConvMessage(role="assistant", content=[ToolUseBlock(id="call_c", name="weather", input={"city": "Roma"})]),
        ConvMessage(role="tool", content=[ToolResultBlock(tool_use_id="call_c", content="sunny")]),
        ConvMessage(role="user", content=[TextBlock(text="thanks")]),
    ]
    await model.complete(request(*history, system="sys", tools=[WEATHER.spec()]))
    body = server.requests[0].body
    assert body["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "weather in Oslo and Rome?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}},
                {
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Rome", "days": 2}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "rain"},
        {"role": "tool", "tool_call_id": "call_b", "content": TOOL_ERROR_PREFIX + "no such city"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_c", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Roma"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_c", "content": "sunny"},
        {"role": "user", "content": "thanks"},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "the forecast for a city",
                "parameters": CityArgs.model_json_schema(),
            },
        }
    ]


async def test_one_tool_call_with_arguments_split_mid_json(server: ProviderServer, model: OpenAIModel) -> None:
    server.add(
        Respond.stream(
            openai_stream(
                [
                    oa_chunk(role="assistant", content=None),
                    oa_chunk(tool_calls=[oa_call(0, id="call_1", name="weather", args="")]),
                    oa_chunk(tool_calls=[oa_call(0, args='{"ci')]),
                    oa_chunk(tool_calls=[oa_call(0, args='ty": "Zür')]),
                    oa_chunk(tool_calls=[oa_call(0, args='ich", "da')]),
                    oa_chunk(tool_calls=[oa_call(0, args='ys": 3}')]),
                    oa_chunk(finish="tool_calls"),
                    oa_chunk(no_choices=True, usage=oa_usage(50, 12)),
                ]
            )
        )
    )
    out = await model.complete(request(tools=[WEATHER.spec()]))
    assert out.content == [ToolUseBlock(id="call_1", name="weather", input={"city": "Zürich", "days": 3})]
    assert out.finish_reason is FinishReason.TOOL_USE
    assert out.usage == Usage(input_tokens=50, output_tokens=12)


async def test_several_tool_calls_in_one_step_are_assembled_by_index(
    server: ProviderServer, model: OpenAIModel
) -> None:
    # Text first, then two calls whose argument fragments interleave.
    server.add(
        Respond.stream(
            openai_stream(
                [
                    oa_chunk(role="assistant", content="Let me check "),
                    oa_chunk(content="both."),
                    oa_chunk(tool_calls=[oa_call(0, id="call_a", name="weather", args='{"city"')]),
                    oa_chunk(tool_calls=[oa_call(1, id="call_b", name="weather", args='{"ci')]),
                    oa_chunk(tool_calls=[oa_call(0, args=': "Oslo"}')]),
                    oa_chunk(tool_calls=[oa_call(1, args='ty": "Rome", "days": 2}')]),
                    oa_chunk(finish="tool_calls"),
                    oa_chunk(no_choices=True, usage=oa_usage(80, 30)),
                ]
            )
        )
    )
    deltas: list[str] = []
    out = await model.complete(request(tools=[WEATHER.spec()]), deltas.append)
    assert deltas == ["Let me check ", "both."]
    assert out.content == [
        TextBlock(text="Let me check both."),
        ToolUseBlock(id="call_a", name="weather", input={"city": "Oslo"}),
        ToolUseBlock(id="call_b", name="weather", input={"city": "Rome", "days": 2}),
    ]
    assert out.finish_reason is FinishReason.TOOL_USE


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


async def test_429_is_rate_limit_with_retry_after_seconds(server: ProviderServer, model: OpenAIModel) -> None:
    server.add(
        Respond.json(
            429,
            {"error": {"message": f"Rate limit reached for key {KEY}", "type": "requests", "code": "rate_limit"}},
            {"Retry-After": "7"},
        )
    )
    err = await fails(model)
    assert err.kind is ModelErrorKind.RATE_LIMIT
    assert err.retryable
    assert err.retry_after == 7.0
    assert err.status == 429
    assert "Rate limit reached" in err.message
    assert len(server.requests) == 1  # the SDK did not retry by itself


async def test_429_retry_after_as_an_http_date(server: ProviderServer, model: OpenAIModel) -> None:
    when = datetime.now(UTC) + timedelta(seconds=30)
    retry_at = format_datetime(when, usegmt=True)
    server.add(Respond.json(429, {"error": {"message": "slow down"}}, {"Retry-After": retry_at}))
    err = await fails(model)
    assert err.kind is ModelErrorKind.RATE_LIMIT
    assert err.retry_after is not None
    assert 20 <= err.retry_after <= 31


async def test_500_then_success_through_a_runtime_turn(
    server: ProviderServer, model: OpenAIModel, db_path: Path
) -> None:
    server.add(
        Respond.json(500, {"error": {"message": "The server had an error while processing your request."}}),
        Respond.stream(openai_text(["recovered"], usage=oa_usage(40, 3, cached=8))),
    )
    record = await run_turn(db_path, model)
    assert record.turn_end["reason"] == "end_turn"
    first, second = record.calls
    assert (first["attempt"], first["error_class"], first["input_tokens"]) == (1, "server", 0)
    assert "HTTP 500" in first["error"]
    assert (second["attempt"], second["error_class"], second["state"]) == (2, None, "settled")
    assert (second["input_tokens"], second["cache_read_tokens"], second["output_tokens"]) == (32, 8, 3)
    assert record.charged_tokens == 43
    [error] = record.of(EventType.MODEL_ERROR)
    assert error.data["kind"] == "server" and error.data["retrying"] is True
    [answer] = record.of(EventType.ASSISTANT_MESSAGE)
    assert answer.data["content"] == [{"type": "text", "text": "recovered"}]
    assert answer.data["model"] == "openai:gpt-test"
    assert len(server.requests) == 2


def waited(before: dict[str, Any], after: dict[str, Any]) -> float:
    """Seconds between one attempt's settlement and the next attempt's reservation (``model_calls``)."""
    return (datetime.fromisoformat(after["started_at"]) - datetime.fromisoformat(before["ended_at"])).total_seconds()


async def test_429_with_retry_after_then_500_then_success_through_a_runtime_turn(
    server: ProviderServer, db_path: Path
) -> None:
    price = Price(input=2.0, output=8.0, cache_read=0.5)
    model = OpenAIModel("gpt-test", base_url=server.url + "/v1", api_key=KEY, timeout=5.0, max_tokens=256, price=price)
    usage = oa_usage(40, 3, cached=8)
    server.add(
        Respond.json(429, {"error": {"message": "Rate limit reached", "type": "requests"}}, {"Retry-After": "1"}),
        Respond.json(500, {"error": {"message": "The server had an error while processing your request."}}),
        Respond.stream(openai_text(["at last"], usage=usage)),
    )
    try:
        record = await run_turn(db_path, model)
    finally:
        await model.aclose()
    assert record.turn_end["reason"] == "end_turn"
    # Every attempt is a row, settled, with its error class.
    rate_limited, server_error, answered = record.calls
    assert [(c["attempt"], c["state"], c["error_class"]) for c in record.calls] == [
        (1, "settled", "rate_limit"),
        (2, "settled", "server"),
        (3, "settled", None),
    ]
    assert "HTTP 429" in rate_limited["error"] and "HTTP 500" in server_error["error"]
    # The driver waited as long as Retry-After said after the 429; after the 500 (no header) it
    # backed off by its own policy (``base_delay`` is 1 ms in ``run_turn``).
    assert waited(rate_limited, server_error) >= 1.0
    assert waited(server_error, answered) < 1.0
    assert [r.path for r in server.requests] == ["/v1/chat/completions"] * 3
    errors = record.of(EventType.MODEL_ERROR)
    assert [(e.data["attempt"], e.data["kind"], e.data["retrying"]) for e in errors] == [
        (1, "rate_limit", True),
        (2, "server", True),
    ]
    # Usage: what the server reported, on the answered attempt (the failed ones reported none), and
    # the session's guard is charged exactly the rows' sum, tokens and cost.
    expected = Usage(
        input_tokens=usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"],
        output_tokens=usage["completion_tokens"],
        cache_read_tokens=usage["prompt_tokens_details"]["cached_tokens"],
    )
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
    assert answered["cost"] == pytest.approx(price.cost(expected))
    assert record.charged_tokens == expected.total == usage["total_tokens"]
    assert record.charged_cost == pytest.approx(price.cost(expected))
    [answer] = record.of(EventType.ASSISTANT_MESSAGE)
    assert answer.data["usage"] == expected.model_dump()


async def test_a_slow_server_times_out(server: ProviderServer) -> None:
    model = OpenAIModel("gpt-test", base_url=server.url + "/v1", api_key=KEY, timeout=0.3)
    server.add(
        Respond.stream(openai_text(["late"]), delay=30),
        Respond.stream([sse(oa_chunk(content="part"))], ending="stall"),
    )
    try:
        before_headers = await fails(model)
        mid_stream = await fails(model)
    finally:
        await model.aclose()
    assert before_headers.kind is ModelErrorKind.TIMEOUT
    assert mid_stream.kind is ModelErrorKind.TIMEOUT
    assert before_headers.retryable


async def test_a_stream_dropped_mid_way_is_a_connection_failure(server: ProviderServer, model: OpenAIModel) -> None:
    server.add(
        Respond.stream([sse(oa_chunk(role="assistant", content="Hel")), sse(oa_chunk(content="lo"))], ending="drop")
    )
    deltas: list[str] = []
    with pytest.raises(ModelError) as info:
        await model.complete(request(), deltas.append)
    assert info.value.kind is ModelErrorKind.CONNECTION
    assert info.value.retryable
    assert deltas == ["Hel", "lo"]  # streamed, but the attempt failed: nothing is returned


async def test_a_stream_that_ends_without_finish_reason_or_done_is_a_failed_attempt(
    server: ProviderServer, model: OpenAIModel
) -> None:
    # The HTTP body ends cleanly, but the answer never finished: not a short answer.
    server.add(Respond.stream(openai_stream([oa_chunk(content="Half an ans")], done=False)))
    err = await fails(model)
    assert err.kind is ModelErrorKind.CONNECTION
    assert "finish_reason" in err.message


async def test_a_dropped_stream_is_retried_by_the_driver_and_its_text_discarded(
    server: ProviderServer, model: OpenAIModel, db_path: Path
) -> None:
    server.add(
        Respond.stream([sse(oa_chunk(role="assistant", content="Half an ans"))], ending="drop"),
        Respond.stream(openai_text(["Whole answer."])),
    )
    record = await run_turn(db_path, model)
    assert record.turn_end["reason"] == "end_turn"
    assert [c["error_class"] for c in record.calls] == ["connection", None]
    [error] = record.of(EventType.MODEL_ERROR)
    assert error.data["discardedChars"] == len("Half an ans")
    [answer] = record.of(EventType.ASSISTANT_MESSAGE)
    assert answer.data["content"] == [{"type": "text", "text": "Whole answer."}]


async def test_a_malformed_chunk_is_malformed(server: ProviderServer, model: OpenAIModel) -> None:
    server.add(
        Respond.stream([sse(oa_chunk(content="ok")), b'data: {"choices": [{"delta": \n\n']),
        Respond.stream([sse({"id": "x", "object": "chat.completion.chunk", "choices": "nope"})]),
    )
    not_json = await fails(model)
    assert not_json.kind is ModelErrorKind.MALFORMED
    assert "not valid JSON" in not_json.message
    wrong_shape = await fails(model)
    assert wrong_shape.kind is ModelErrorKind.MALFORMED
    assert "choices" in wrong_shape.message
    assert not wrong_shape.retryable


async def test_a_malformed_chunk_is_retried_within_the_turn(
    server: ProviderServer, model: OpenAIModel, db_path: Path
) -> None:
    # A proxy's glitch: one chunk that is not JSON, then a good answer on the retry.
    server.add(
        Respond.stream([sse(oa_chunk(role="assistant", content="Half")), b"data: {not json\n\n"]),
        Respond.stream(openai_text(["Whole answer."])),
    )
    record = await run_turn(db_path, model)
    assert record.turn_end["reason"] == "end_turn"
    # Both attempts are recorded: the malformed one settled with its error, then the answer.
    assert [(c["attempt"], c["state"], c["error_class"]) for c in record.calls] == [
        (1, "settled", "malformed"),
        (2, "settled", None),
    ]
    [error] = record.of(EventType.MODEL_ERROR)
    assert error.data["kind"] == "malformed" and error.data["retrying"] is True
    assert error.data["discardedChars"] == len("Half")
    [answer] = record.of(EventType.ASSISTANT_MESSAGE)
    assert answer.data["content"] == [{"type": "text", "text": "Whole answer."}]
    assert len(server.requests) == 2
    server.assert_done()


async def test_a_chunk_malformed_on_every_attempt_ends_the_turn_with_error(
    server: ProviderServer, model: OpenAIModel, db_path: Path
) -> None:
    attempts = RetryPolicy().max_attempts
    server.add(*[Respond.stream([sse(oa_chunk(content="ok")), b"data: not json at all\n\n"])] * attempts)
    record = await run_turn(db_path, model)
    end = record.turn_end
    assert end["reason"] == "error"
    assert end["errorKind"] == "malformed"
    assert "malformed stream chunk #2" in end["error"] and "not valid JSON" in end["error"]
    assert [c["error_class"] for c in record.calls] == ["malformed"] * attempts
    assert [e.data["retrying"] for e in record.of(EventType.MODEL_ERROR)] == [True] * (attempts - 1) + [False]
    server.assert_done()


async def test_tool_arguments_that_are_not_json_are_malformed(server: ProviderServer, model: OpenAIModel) -> None:
    server.add(
        Respond.stream(
            openai_stream(
                [
                    oa_chunk(tool_calls=[oa_call(0, id="c1", name="weather", args='{"city": "Oslo"')]),
                    oa_chunk(finish="tool_calls"),
                    oa_chunk(no_choices=True, usage=oa_usage(5, 5)),
                ]
            )
        )
    )
    err = await fails(model)
    assert err.kind is ModelErrorKind.MALFORMED
    assert "weather" in err.message and "not valid JSON" in err.message
    assert err.usage == Usage(input_tokens=5, output_tokens=5)


async def test_an_error_object_inside_the_stream_is_classified(server: ProviderServer, model: OpenAIModel) -> None:
    # OpenRouter reports upstream failures this way, after a 200.
    server.add(Respond.stream([sse(oa_chunk(content="x")), sse({"error": {"code": 502, "message": "upstream died"}})]))
    err = await fails(model)
    assert err.kind is ModelErrorKind.SERVER
    assert "upstream died" in err.message


async def test_401_is_auth_and_is_not_retried(server: ProviderServer, model: OpenAIModel, db_path: Path) -> None:
    server.add(
        Respond.json(
            401,
            {
                "error": {
                    "message": f"Incorrect API key provided: {KEY}.",
                    "type": "invalid_request_error",
                    "code": "invalid_api_key",
                }
            },
        )
    )
    record = await run_turn(db_path, model)
    end = record.turn_end
    assert (end["reason"], end["errorKind"]) == ("error", "auth")
    assert KEY not in end["error"] and "[redacted]" in end["error"]
    [call] = record.calls
    assert call["error_class"] == "auth"
    assert KEY not in call["error"]
    assert not any(KEY in str(e.data) for e in record.events)
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, ModelErrorKind.BAD_REQUEST),
        (403, ModelErrorKind.AUTH),
        (404, ModelErrorKind.BAD_REQUEST),
        (503, ModelErrorKind.SERVER),
    ],
)
async def test_other_statuses_are_classified(
    server: ProviderServer, model: OpenAIModel, status: int, kind: ModelErrorKind
) -> None:
    server.add(Respond.json(status, {"error": {"message": "nope"}}))
    err = await fails(model)
    assert (err.kind, err.status) == (kind, status)


async def test_a_refused_connection_is_a_connection_failure() -> None:
    # A port nobody listens on (bound, then closed).
    async with ProviderServer() as srv:
        url = srv.url
    model = OpenAIModel("gpt-test", base_url=url + "/v1", api_key=KEY, timeout=2)
    try:
        err = await fails(model)
    finally:
        await model.aclose()
    assert err.kind is ModelErrorKind.CONNECTION


async def test_a_tool_turn_runs_through_the_runtime(server: ProviderServer, model: OpenAIModel, db_path: Path) -> None:
    server.add(
        Respond.stream(
            openai_stream(
                [
                    oa_chunk(tool_calls=[oa_call(0, id="call_w", name="weather", args='{"city": ')]),
                    oa_chunk(tool_calls=[oa_call(0, args='"Oslo"}')]),
                    oa_chunk(finish="tool_calls"),
                    oa_chunk(no_choices=True, usage=oa_usage(30, 10)),
                ]
            )
        ),
        Respond.stream(openai_text(["Sunny in Oslo."], usage=oa_usage(60, 5))),
    )
    record = await run_turn(db_path, model, "weather in Oslo?", tools=[WEATHER])
    assert record.turn_end["reason"] == "end_turn"
    [result] = record.of(EventType.TOOL_RESULT)
    assert result.data["content"] == "sunny in Oslo for 1 day(s)"
    second = server.requests[1].body["messages"]
    assert second[-1] == {"role": "tool", "tool_call_id": "call_w", "content": "sunny in Oslo for 1 day(s)"}
    assert second[-2]["tool_calls"][0]["function"] == {"name": "weather", "arguments": '{"city": "Oslo"}'}
    assert record.charged_tokens == 40 + 65


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
        cwd=Path(__file__).resolve().parent.parent,
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
