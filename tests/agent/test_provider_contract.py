"""The provider contract: what every provider does, run against each one's real wire format.

One suite, parametrized over the OpenAI-compatible and the Anthropic provider (the ``provider``
fixture). Each scenario is written once in neutral terms (text parts, tool calls with their
argument fragments, a :class:`~agent.Usage`, an error status) and a small adapter per provider
scripts it in that provider's own stream format on the local server of ``providers_server``,
knows its request path and reads its request body. What differs between the providers by
design is the adapter's answer to a question, never a branch in a test: which usage a stream
has reported before it broke (Anthropic reports the input at ``message_start``; chat
completions only in its last chunk), what an unfinished stream's error names, how a
conversation looks on the wire. What only one provider has (OpenAI's refusal deltas and token
parameter, Anthropic's 529 and stop reasons...) stays in ``test_provider_openai.py`` and
``test_provider_anthropic.py``.

Pins, for each provider: the request (path, the key header, the SDK's own retries off, the
body), streamed text as deltas, tool calls assembled from arguments split mid-JSON, usage mapped
with cache reads (and writes where the API has them), and the failure classes the driver and
the goal engine act on: 429 + Retry-After -> rate_limit (waited out by the driver), 5xx ->
server (retried: a ``model_calls`` row per attempt, usage charged), timeouts, a stream dropped
or ending unfinished -> connection (a failed attempt, its partial text discarded), a malformed
chunk or event -> malformed (retried within the turn; the turn ends ``error`` if it never
parses), 401 -> auth (one attempt). No message ever carries the API key. An attempt whose stream
broke after it started is charged what it reported, or, having reported nothing (chat
completions), its prompt's estimate, so it is never charged less than the prompt's input tokens;
one that failed before any answer is charged nothing.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

import pytest
from providers_server import (
    Call,
    ProviderServer,
    Respond,
    an_message_start,
    anthropic_answer,
    anthropic_started,
    oa_usage,
    openai_answer,
    openai_started,
    run_turn,
    sse,
)
from pydantic import BaseModel

from agent import (
    ConvMessage,
    EventType,
    FinishReason,
    FunctionTool,
    Model,
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
from agent.models.health import GuardedModel, ProviderHealth
from agent.models.openai import OpenAIModel
from agent.models.openai_messages import TOOL_ERROR_PREFIX

#: The models under contract (``Model`` itself has no ``aclose``).
WireModel = OpenAIModel | AnthropicModel

USER_HI = ConvMessage(role="user", content=[TextBlock(text="hi")])
#: The output limit of the models under contract.
MAX_TOKENS = 256


class CityArgs(BaseModel):
    city: str
    days: int = 1


async def _weather(args: CityArgs, ctx: ToolContext) -> str:
    return f"sunny in {args.city} for {args.days} day(s)"


WEATHER = FunctionTool("weather", "the forecast for a city", CityArgs, _weather)

#: A conversation with every shape the providers translate: text with tool calls, a call alone,
#: results (one an error) in separate messages, an empty answer, user messages in a row.
HISTORY = [
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
    ConvMessage(role="tool", content=[ToolResultBlock(tool_use_id="call_b", content="no such city", is_error=True)]),
    ConvMessage(role="assistant", content=[ToolUseBlock(id="call_c", name="weather", input={"city": "Roma"})]),
    ConvMessage(role="tool", content=[ToolResultBlock(tool_use_id="call_c", content="sunny")]),
    ConvMessage(role="user", content=[TextBlock(text="and tomorrow?")]),
    ConvMessage(role="assistant", content=[TextBlock(text="")]),
    ConvMessage(role="user", content=[TextBlock(text="hello?")]),
]


# -- the adapters ----------------------------------------------------------------------------------


class Provider(ABC):
    """One provider as the contract suite drives it: its model, its wire format, its request."""

    name: ClassVar[str]
    key: ClassVar[str]
    #: The path every request goes to.
    path: ClassVar[str]
    #: The model's spec, as answers record it.
    spec: ClassVar[str]
    #: What the model's stream is made of, as its malformed-stream errors count them.
    unit: ClassVar[str]
    #: What the error of a stream that ends cleanly but unfinished names as missing.
    unfinished_says: ClassVar[str]
    #: What the error of a well-formed item of the wrong shape names.
    wrong_shape_says: ClassVar[str]
    #: Headers every request must carry (with a value), besides the key.
    required_headers: ClassVar[tuple[str, ...]] = ()
    #: The same conversation, :data:`HISTORY`, on the wire (no system prompt).
    conversation: ClassVar[list[dict[str, Any]]]

    @abstractmethod
    def model(self, url: str, *, name: str | None = None, **kw: Any) -> WireModel:
        """The provider's model against the local server at ``url`` (a 5 s timeout, 256 output tokens);
        ``name`` gives a model of its own (its own prompt estimator), named after :attr:`spec` if not given."""

    #: The finish (stop) reason of an answer cut off by the output limit, on the wire.
    cut_finish: ClassVar[str]

    @abstractmethod
    def answer(
        self, text: list[str] | None = None, calls: list[Call] | None = None, *, usage: Usage, finish: str | None = None
    ) -> list[bytes]:
        """A whole streamed answer (``finish``: its finish reason on the wire, if not the natural one)."""

    @abstractmethod
    def started(self, text: list[str], *, input_tokens: int, text_done: bool = False) -> list[bytes]:
        """The first frames of an answer that never finishes (no finish reason, no end of message)."""

    @abstractmethod
    def garbled(self, payload: str) -> bytes:
        """A frame whose data is ``payload``, which is not JSON."""

    @abstractmethod
    def wrong_shape(self) -> list[bytes]:
        """A stream whose item is valid JSON of the wrong shape."""

    @abstractmethod
    def error(self, status: int, message: str, headers: dict[str, str] | None = None) -> Respond:
        """An error status with the provider's JSON error body."""

    @abstractmethod
    def carries_key(self, headers: dict[str, str]) -> bool:
        """Whether a request's headers carry the key, the way the provider's SDK sends it."""

    @abstractmethod
    def plain_body(self) -> dict[str, Any]:
        """The whole body of ``complete(request())``."""

    @abstractmethod
    def wire_tool(self, name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
        """A tool as the request carries it."""

    @abstractmethod
    def tool_exchange(self, call: ToolUseBlock, result: str) -> list[dict[str, Any]]:
        """The last two messages of the request after one tool call and its result."""

    @abstractmethod
    def reports(self, usage: Usage) -> Usage:
        """``usage`` as far as the API can report it."""

    @abstractmethod
    def usage_seen(self, input_tokens: int) -> Usage | None:
        """What a stream begun with ``input_tokens`` has reported when it breaks before its end."""

    @abstractmethod
    def items_in(self, frames: list[bytes]) -> int:
        """How many stream items ``frames`` hold, as the model counts them (keep-alives are not items)."""

    @abstractmethod
    def total_on_wire(self, usage: Usage) -> int | None:
        """The total tokens the server itself states for ``usage``, if its usage has a total."""


class OpenAIWire(Provider):
    name = "openai"
    key = "sk-test-0123456789abcdef"
    path = "/v1/chat/completions"
    spec = "openai:gpt-test"
    unit = "chunk"
    unfinished_says = "finish_reason"
    wrong_shape_says = "choices"
    cut_finish = "length"
    conversation: ClassVar[list[dict[str, Any]]] = [
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
        {"role": "user", "content": "and tomorrow?"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "hello?"},
    ]
    _error_fields: ClassVar[dict[int, dict[str, str]]] = {
        429: {"type": "requests", "code": "rate_limit"},
        401: {"type": "invalid_request_error", "code": "invalid_api_key"},
    }

    def model(self, url: str, *, name: str | None = None, **kw: Any) -> WireModel:
        return OpenAIModel(
            name or "gpt-test",
            base_url=url + "/v1",
            api_key=self.key,
            **{"timeout": 5.0, "max_tokens": MAX_TOKENS, **kw},
        )

    def answer(
        self, text: list[str] | None = None, calls: list[Call] | None = None, *, usage: Usage, finish: str | None = None
    ) -> list[bytes]:
        return openai_answer(text, calls, usage=usage, finish=finish)

    def started(self, text: list[str], *, input_tokens: int, text_done: bool = False) -> list[bytes]:
        return openai_started(text, input_tokens=input_tokens, text_done=text_done)

    def garbled(self, payload: str) -> bytes:
        return f"data: {payload}\n\n".encode()

    def wrong_shape(self) -> list[bytes]:
        return [sse({"id": "x", "object": "chat.completion.chunk", "choices": "nope"})]

    def error(self, status: int, message: str, headers: dict[str, str] | None = None) -> Respond:
        return Respond.json(status, {"error": {"message": message, **self._error_fields.get(status, {})}}, headers)

    def carries_key(self, headers: dict[str, str]) -> bool:
        return headers.get("authorization") == f"Bearer {self.key}"

    def plain_body(self) -> dict[str, Any]:
        return {
            "model": "gpt-test",
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": 256,
            "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        }

    def wire_tool(self, name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
        return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}

    def tool_exchange(self, call: ToolUseBlock, result: str) -> list[dict[str, Any]]:
        function = {"name": call.name, "arguments": json.dumps(call.input)}
        return [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": call.id, "type": "function", "function": function}],
            },
            {"role": "tool", "tool_call_id": call.id, "content": result},
        ]

    def reports(self, usage: Usage) -> Usage:
        return usage.model_copy(update={"cache_write_tokens": 0})

    def usage_seen(self, input_tokens: int) -> Usage | None:
        return None  # the usage comes in the last chunk only

    def items_in(self, frames: list[bytes]) -> int:
        return len(frames)

    def total_on_wire(self, usage: Usage) -> int | None:
        prompt = usage.input_tokens + usage.cache_read_tokens
        return int(oa_usage(prompt, usage.output_tokens, usage.cache_read_tokens)["total_tokens"])


class AnthropicWire(Provider):
    name = "anthropic"
    key = "sk-ant-test-0123456789abcdef"
    path = "/v1/messages"
    spec = "anthropic:claude-test"
    unit = "event"
    required_headers = ("anthropic-version",)
    unfinished_says = "message_stop"
    wrong_shape_says = "content_block"
    cut_finish = "max_tokens"
    conversation: ClassVar[list[dict[str, Any]]] = [
        {"role": "user", "content": [{"type": "text", "text": "weather in Oslo and Rome?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "call_a", "name": "weather", "input": {"city": "Oslo"}},
                {"type": "tool_use", "id": "call_b", "name": "weather", "input": {"city": "Rome", "days": 2}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_a", "content": "rain"},
                {"type": "tool_result", "tool_use_id": "call_b", "content": "no such city", "is_error": True},
            ],
        },
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "call_c", "name": "weather", "input": {"city": "Roma"}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_c", "content": "sunny"},
                {"type": "text", "text": "and tomorrow?"},
                # The empty answer is left out (the API refuses empty text): the user messages merge.
                {"type": "text", "text": "hello?"},
            ],
        },
    ]
    _error_types: ClassVar[dict[int, str]] = {
        429: "rate_limit_error",
        500: "api_error",
        401: "authentication_error",
    }

    def model(self, url: str, *, name: str | None = None, **kw: Any) -> WireModel:
        return AnthropicModel(
            name or "claude-test", base_url=url, api_key=self.key, **{"timeout": 5.0, "max_tokens": MAX_TOKENS, **kw}
        )

    def answer(
        self, text: list[str] | None = None, calls: list[Call] | None = None, *, usage: Usage, finish: str | None = None
    ) -> list[bytes]:
        return anthropic_answer(text, calls, usage=usage, finish=finish)

    def started(self, text: list[str], *, input_tokens: int, text_done: bool = False) -> list[bytes]:
        return anthropic_started(text, input_tokens=input_tokens, text_done=text_done)

    def garbled(self, payload: str) -> bytes:
        return f"event: content_block_delta\ndata: {payload}\n\n".encode()

    def wrong_shape(self) -> list[bytes]:
        return [
            an_message_start(5),
            sse({"type": "content_block_start", "index": 0, "content_block": "text"}, "content_block_start"),
        ]

    def error(self, status: int, message: str, headers: dict[str, str] | None = None) -> Respond:
        kind = self._error_types.get(status, "some_error")
        return Respond.json(status, {"type": "error", "error": {"type": kind, "message": message}}, headers)

    def carries_key(self, headers: dict[str, str]) -> bool:
        # The SDK sends the key as ``x-api-key`` or as a bearer token, depending on its version.
        return headers.get("x-api-key") == self.key or headers.get("authorization") == f"Bearer {self.key}"

    def plain_body(self) -> dict[str, Any]:
        return {
            "model": "claude-test",
            "max_tokens": 256,
            "stream": True,
            "system": "be brief",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        }

    def wire_tool(self, name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "description": description, "input_schema": schema}

    def tool_exchange(self, call: ToolUseBlock, result: str) -> list[dict[str, Any]]:
        return [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": call.id, "name": call.name, "input": call.input}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": result}]},
        ]

    def reports(self, usage: Usage) -> Usage:
        return usage

    def usage_seen(self, input_tokens: int) -> Usage | None:
        return Usage(input_tokens=input_tokens, output_tokens=1)  # message_start's usage

    def items_in(self, frames: list[bytes]) -> int:
        return sum(not frame.startswith(b"event: ping") for frame in frames)

    def total_on_wire(self, usage: Usage) -> int | None:
        return None  # the Messages API states no total


@pytest.fixture(params=[OpenAIWire, AnthropicWire], ids=lambda cls: cls.name)
def provider(request: pytest.FixtureRequest) -> Provider:
    wire: Provider = request.param()
    return wire


@pytest.fixture
async def server() -> AsyncIterator[ProviderServer]:
    async with ProviderServer() as srv:
        yield srv
        srv.assert_done()


@pytest.fixture
async def model(provider: Provider, server: ProviderServer) -> AsyncIterator[WireModel]:
    m = provider.model(server.url)
    yield m
    await m.aclose()


def request(
    *messages: ConvMessage, system: str | None = "be brief", tools: list[ToolSpec] | None = None, max_tokens: int = 256
) -> ModelRequest:
    return ModelRequest(system, list(messages or [USER_HI]), list(tools or []), max_tokens)


async def fails(provider: Provider, model: Model, req: ModelRequest | None = None) -> ModelError:
    with pytest.raises(ModelError) as info:
        await model.complete(req or request())
    assert provider.key not in str(info.value)
    return info.value


def waited(before: dict[str, Any], after: dict[str, Any]) -> float:
    """Seconds between one attempt's settlement and the next attempt's reservation (``model_calls``)."""
    return (datetime.fromisoformat(after["started_at"]) - datetime.fromisoformat(before["ended_at"])).total_seconds()


def charged_for_a_break(provider: Provider, call: dict[str, Any], input_tokens: int) -> Usage:
    """What an attempt whose stream broke after it began with ``input_tokens`` is charged: the usage
    it reported, else its prompt's estimate (its likely size: some input tokens, none of output,
    never more than the reservation's prompt part, the upper bound)."""
    seen = provider.usage_seen(input_tokens)
    if seen is not None:
        return seen
    charged = usage_of_row(call)
    assert 0 < charged.input_tokens <= call["reserved_tokens"] - MAX_TOKENS
    assert charged == Usage(input_tokens=charged.input_tokens)
    assert "charged the prompt's estimate" in call["error"]
    return charged


def usage_of_row(call: dict[str, Any]) -> Usage:
    """The usage a ``model_calls`` row recorded."""
    return Usage(
        input_tokens=call["input_tokens"],
        output_tokens=call["output_tokens"],
        cache_read_tokens=call["cache_read_tokens"],
        cache_write_tokens=call["cache_write_tokens"],
    )


# -- success paths ---------------------------------------------------------------------------------


async def test_plain_text_streams_deltas_and_maps_usage(
    provider: Provider, server: ProviderServer, model: Model
) -> None:
    usage = provider.reports(Usage(input_tokens=20, output_tokens=7, cache_read_tokens=100, cache_write_tokens=30))
    server.add(Respond.stream(provider.answer(["Hel", "lo, ", "world"], usage=usage)))
    deltas: list[str] = []
    out = await model.complete(request(), deltas.append)
    assert deltas == ["Hel", "lo, ", "world"]
    assert out.content == [TextBlock(text="Hello, world")]
    assert out.finish_reason is FinishReason.END_TURN
    assert out.usage == usage

    [sent] = server.requests
    assert (sent.method, sent.path) == ("POST", provider.path)
    assert provider.carries_key(sent.headers)
    assert sent.headers["x-stainless-retry-count"] == "0"
    for header in provider.required_headers:
        assert sent.headers[header]
    assert sent.body == provider.plain_body()


async def test_conversation_and_tools_are_serialized(provider: Provider, server: ProviderServer, model: Model) -> None:
    server.add(Respond.stream(provider.answer(["ok"], usage=Usage(input_tokens=10, output_tokens=1))))
    await model.complete(request(*HISTORY, system=None, tools=[WEATHER.spec()]))
    body = server.requests[0].body
    assert "system" not in body
    assert body["messages"] == provider.conversation
    assert body["tools"] == [provider.wire_tool("weather", "the forecast for a city", CityArgs.model_json_schema())]


async def test_one_tool_call_with_arguments_split_mid_json(
    provider: Provider, server: ProviderServer, model: Model
) -> None:
    usage = Usage(input_tokens=50, output_tokens=12)
    call = Call("call_1", "weather", ("", '{"ci', 'ty": "Zür', 'ich", "da', 'ys": 3}'))
    server.add(Respond.stream(provider.answer(calls=[call], usage=usage)))
    out = await model.complete(request(tools=[WEATHER.spec()]))
    assert out.content == [ToolUseBlock(id="call_1", name="weather", input={"city": "Zürich", "days": 3})]
    assert out.finish_reason is FinishReason.TOOL_USE
    assert out.usage == usage


async def test_text_and_several_tool_calls_in_one_step(
    provider: Provider, server: ProviderServer, model: Model
) -> None:
    # Text first, then two calls (their fragments interleave where the wire allows it; one starts empty).
    calls = [
        Call("call_a", "weather", ('{"city"', ': "Oslo"}')),
        Call("call_b", "weather", ("", '{"ci', 'ty": "Rome", ', '"days": 2}')),
    ]
    server.add(
        Respond.stream(
            provider.answer(["Let me check ", "both."], calls, usage=Usage(input_tokens=80, output_tokens=30))
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


async def test_a_tool_turn_runs_through_the_runtime(
    provider: Provider, server: ProviderServer, model: Model, db_path: Path
) -> None:
    server.add(
        Respond.stream(
            provider.answer(
                calls=[Call("call_w", "weather", ('{"city": ', '"Oslo"}'))],
                usage=Usage(input_tokens=30, output_tokens=10),
            )
        ),
        Respond.stream(provider.answer(["Sunny in Oslo."], usage=Usage(input_tokens=60, output_tokens=5))),
    )
    record = await run_turn(db_path, model, "weather in Oslo?", tools=[WEATHER])
    assert record.turn_end["reason"] == "end_turn"
    [result] = record.of(EventType.TOOL_RESULT)
    assert result.data["content"] == "sunny in Oslo for 1 day(s)"
    second = server.requests[1].body["messages"]
    call = ToolUseBlock(id="call_w", name="weather", input={"city": "Oslo"})
    assert second[-2:] == provider.tool_exchange(call, "sunny in Oslo for 1 day(s)")
    assert record.charged_tokens == 40 + 65


# -- failures --------------------------------------------------------------------------------------


async def test_429_is_rate_limit_with_retry_after_seconds(
    provider: Provider, server: ProviderServer, model: Model
) -> None:
    server.add(provider.error(429, f"Rate limit reached for key {provider.key}", {"Retry-After": "7"}))
    err = await fails(provider, model)
    assert err.kind is ModelErrorKind.RATE_LIMIT
    assert err.retryable
    assert err.retry_after == 7.0
    assert err.status == 429
    assert "Rate limit reached" in err.message
    assert len(server.requests) == 1  # the SDK did not retry by itself


async def test_500_then_success_through_a_runtime_turn(
    provider: Provider, server: ProviderServer, model: Model, db_path: Path
) -> None:
    usage = provider.reports(Usage(input_tokens=30, output_tokens=4, cache_read_tokens=10, cache_write_tokens=6))
    server.add(
        provider.error(500, "Internal server error"),
        Respond.stream(provider.answer(["recovered"], usage=usage)),
    )
    record = await run_turn(db_path, model)
    assert record.turn_end["reason"] == "end_turn"
    first, second = record.calls
    assert (first["attempt"], first["error_class"], first["input_tokens"]) == (1, "server", 0)
    assert "HTTP 500" in first["error"] and "Internal server error" in first["error"]
    assert (second["attempt"], second["error_class"], second["state"]) == (2, None, "settled")
    assert usage_of_row(second) == usage
    assert record.charged_tokens == usage.total
    [error] = record.of(EventType.MODEL_ERROR)
    assert error.data["kind"] == "server" and error.data["retrying"] is True
    [answer] = record.of(EventType.ASSISTANT_MESSAGE)
    assert answer.data["content"] == [{"type": "text", "text": "recovered"}]
    assert answer.data["model"] == provider.spec
    assert len(server.requests) == 2


async def test_429_with_retry_after_then_500_then_success_through_a_runtime_turn(
    provider: Provider, server: ProviderServer, db_path: Path
) -> None:
    price = Price(input=3.0, output=15.0, cache_read=0.3, cache_write=3.75)
    model = provider.model(server.url, price=price)
    expected = provider.reports(Usage(input_tokens=30, output_tokens=4, cache_read_tokens=10, cache_write_tokens=6))
    server.add(
        provider.error(429, "Rate limit reached", {"Retry-After": "1"}),
        provider.error(500, "Internal server error"),
        Respond.stream(provider.answer(["at last"], usage=expected)),
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
    assert [r.path for r in server.requests] == [provider.path] * 3
    errors = record.of(EventType.MODEL_ERROR)
    assert [(e.data["attempt"], e.data["kind"], e.data["retrying"]) for e in errors] == [
        (1, "rate_limit", True),
        (2, "server", True),
    ]
    # Usage: what the server reported, on the answered attempt (the failed ones reported none), and
    # the session's guard is charged exactly the rows' sum, tokens and cost.
    assert [usage_of_row(c) for c in record.calls] == [Usage(), Usage(), expected]
    assert answered["cost"] == pytest.approx(price.cost(expected))
    assert record.charged_tokens == expected.total
    stated = provider.total_on_wire(expected)
    if stated is not None:
        assert record.charged_tokens == stated
    assert record.charged_cost == pytest.approx(price.cost(expected))
    [answer] = record.of(EventType.ASSISTANT_MESSAGE)
    assert answer.data["usage"] == expected.model_dump()


async def test_a_slow_server_times_out(provider: Provider, server: ProviderServer) -> None:
    model = provider.model(server.url, timeout=0.3)
    server.add(
        Respond.stream(provider.answer(["late"], usage=Usage(input_tokens=9, output_tokens=1)), delay=30),
        Respond.stream(provider.started(["part"], input_tokens=9), ending="stall"),
    )
    try:
        before_headers = await fails(provider, model)
        mid_stream = await fails(provider, model)
    finally:
        await model.aclose()
    assert before_headers.kind is ModelErrorKind.TIMEOUT
    assert mid_stream.kind is ModelErrorKind.TIMEOUT
    assert before_headers.retryable
    assert mid_stream.usage == provider.usage_seen(9)


async def test_a_stream_dropped_mid_way_is_a_connection_failure_with_the_usage_seen(
    provider: Provider, server: ProviderServer, model: Model
) -> None:
    server.add(Respond.stream(provider.started(["Hel", "lo"], input_tokens=33), ending="drop"))
    deltas: list[str] = []
    with pytest.raises(ModelError) as info:
        await model.complete(request(), deltas.append)
    err = info.value
    assert err.kind is ModelErrorKind.CONNECTION
    assert err.retryable
    assert err.usage == provider.usage_seen(33)
    assert deltas == ["Hel", "lo"]  # streamed, but the attempt failed: nothing is returned


async def test_a_stream_that_ends_unfinished_is_a_failed_attempt(
    provider: Provider, server: ProviderServer, model: Model
) -> None:
    # The HTTP body ends cleanly, but the answer never finished: not a short answer.
    server.add(Respond.stream(provider.started(["Half an ans"], input_tokens=5, text_done=True)))
    err = await fails(provider, model)
    assert err.kind is ModelErrorKind.CONNECTION
    assert provider.unfinished_says in err.message


async def test_a_dropped_stream_is_retried_by_the_driver_its_text_discarded_and_charged(
    provider: Provider, server: ProviderServer, model: Model, db_path: Path
) -> None:
    usage = Usage(input_tokens=20, output_tokens=3)
    server.add(
        Respond.stream(provider.started(["Half an ans"], input_tokens=20), ending="drop"),
        Respond.stream(provider.answer(["Whole answer."], usage=usage)),
    )
    record = await run_turn(db_path, model)
    assert record.turn_end["reason"] == "end_turn"
    assert [c["error_class"] for c in record.calls] == ["connection", None]
    # The failed attempt is charged the usage it reported before the drop, else its prompt's estimate.
    seen = charged_for_a_break(provider, record.calls[0], 20)
    assert usage_of_row(record.calls[0]) == seen
    assert record.charged_tokens == seen.total + usage.total
    [error] = record.of(EventType.MODEL_ERROR)
    assert error.data["discardedChars"] == len("Half an ans")
    [answer] = record.of(EventType.ASSISTANT_MESSAGE)
    assert answer.data["content"] == [{"type": "text", "text": "Whole answer."}]


@pytest.mark.parametrize("how", ["dropped", "timed_out", "malformed"])
async def test_a_stream_broken_after_it_started_is_charged_at_least_the_prompts_input_tokens(
    provider: Provider, server: ProviderServer, db_path: Path, how: str
) -> None:
    # A prompt of about a thousand tokens (plain text runs about four bytes a token), which the
    # provider bills once it has started answering, whether or not its stream reports so.
    prompt = "the quick brown fox jumps over the lazy dog " * 90
    tokens = len(prompt) // 4
    # A model of its own, so its prompt estimator is calibrated by nothing but this test.
    model = provider.model(server.url, name=f"contract-{how}", timeout=0.5)
    begun = provider.started(["Half an ans"], input_tokens=tokens)
    broken = {
        "dropped": Respond.stream(begun, ending="drop"),
        "timed_out": Respond.stream(begun, ending="stall"),
        "malformed": Respond.stream([*begun, provider.garbled("{not json")]),
    }[how]
    answer = Usage(input_tokens=tokens, output_tokens=3)
    server.add(broken, Respond.stream(provider.answer(["Whole answer."], usage=answer)))
    try:
        record = await run_turn(db_path, model, prompt)
    finally:
        await model.aclose()
    assert record.turn_end["reason"] == "end_turn"
    failed, answered = record.calls
    assert failed["error_class"] == {"dropped": "connection", "timed_out": "timeout", "malformed": "malformed"}[how]
    charged = usage_of_row(failed)
    assert charged.input_tokens >= tokens
    # Never more than the reservation's prompt part (an upper bound of the prompt).
    assert charged.total <= failed["reserved_tokens"] - MAX_TOKENS
    assert charged == charged_for_a_break(provider, failed, tokens)
    assert usage_of_row(answered) == answer
    assert record.charged_tokens == charged.total + answer.total
    # An estimate says so, on the event and in the row; a reported usage does not.
    estimated = provider.usage_seen(tokens) is None
    [error] = record.of(EventType.MODEL_ERROR)
    assert Usage.model_validate(error.data["usage"]) == charged
    assert error.data.get("estimated", False) is estimated
    assert ("charged the prompt's estimate" in failed["error"]) is estimated


async def test_an_attempt_that_failed_before_any_answer_is_charged_nothing(
    provider: Provider, server: ProviderServer, db_path: Path
) -> None:
    # An error status: the provider answered, but began no answer.
    attempts = RetryPolicy().max_attempts
    server.add(*[provider.error(503, "overloaded")] * attempts)
    model = provider.model(server.url, name="contract-status")
    try:
        by_status = await run_turn(db_path, model)
    finally:
        await model.aclose()
    # A refused connection (a port bound, then closed).
    async with ProviderServer() as srv:
        url = srv.url
    model = provider.model(url, name="contract-refused", timeout=2)
    try:
        refused = await run_turn(db_path.with_name("refused.db"), model)
    finally:
        await model.aclose()
    for record, kind in ((by_status, "server"), (refused, "connection")):
        assert (record.turn_end["reason"], record.turn_end["errorKind"]) == ("error", kind)
        assert [c["error_class"] for c in record.calls] == [kind] * attempts
        assert [usage_of_row(c) for c in record.calls] == [Usage()] * attempts
        assert record.charged_tokens == 0
        assert not any(e.data.get("estimated") for e in record.of(EventType.MODEL_ERROR))


async def test_a_malformed_item_is_malformed(provider: Provider, server: ProviderServer, model: Model) -> None:
    server.add(
        Respond.stream([*provider.started(["ok"], input_tokens=5), provider.garbled('{"delta": ')]),
        Respond.stream(provider.wrong_shape()),
    )
    not_json = await fails(provider, model)
    assert not_json.kind is ModelErrorKind.MALFORMED
    assert "not valid JSON" in not_json.message
    wrong_shape = await fails(provider, model)
    assert wrong_shape.kind is ModelErrorKind.MALFORMED
    assert provider.wrong_shape_says in wrong_shape.message
    assert not wrong_shape.retryable


async def test_a_malformed_item_is_retried_within_the_turn(
    provider: Provider, server: ProviderServer, model: Model, db_path: Path
) -> None:
    # A proxy's glitch: one chunk or event that is not JSON, then a good answer on the retry.
    server.add(
        Respond.stream([*provider.started(["Half"], input_tokens=7), provider.garbled("{not json")]),
        Respond.stream(provider.answer(["Whole answer."], usage=Usage(input_tokens=7, output_tokens=3))),
    )
    record = await run_turn(db_path, model)
    assert record.turn_end["reason"] == "end_turn"
    # Both attempts are recorded: the malformed one settled with its error (and the usage it
    # reported, else its prompt's estimate), then the answer.
    assert [(c["attempt"], c["state"], c["error_class"]) for c in record.calls] == [
        (1, "settled", "malformed"),
        (2, "settled", None),
    ]
    assert usage_of_row(record.calls[0]) == charged_for_a_break(provider, record.calls[0], 7)
    [error] = record.of(EventType.MODEL_ERROR)
    assert error.data["kind"] == "malformed" and error.data["retrying"] is True
    assert error.data["discardedChars"] == len("Half")
    [answer] = record.of(EventType.ASSISTANT_MESSAGE)
    assert answer.data["content"] == [{"type": "text", "text": "Whole answer."}]
    assert len(server.requests) == 2
    server.assert_done()


async def test_an_item_malformed_on_every_attempt_ends_the_turn_with_error(
    provider: Provider, server: ProviderServer, model: Model, db_path: Path
) -> None:
    attempts = RetryPolicy().max_attempts
    frames = [*provider.started(["ok"], input_tokens=5), provider.garbled("not json at all")]
    server.add(*[Respond.stream(frames)] * attempts)
    record = await run_turn(db_path, model)
    end = record.turn_end
    assert (end["reason"], end["errorKind"]) == ("error", "malformed")
    assert f"malformed stream {provider.unit} #{provider.items_in(frames)}" in end["error"]
    assert "not valid JSON" in end["error"]
    assert [c["error_class"] for c in record.calls] == ["malformed"] * attempts
    assert [e.data["retrying"] for e in record.of(EventType.MODEL_ERROR)] == [True] * (attempts - 1) + [False]
    server.assert_done()


async def test_tool_arguments_that_are_not_json_are_malformed(
    provider: Provider, server: ProviderServer, model: Model
) -> None:
    usage = Usage(input_tokens=5, output_tokens=5)
    server.add(Respond.stream(provider.answer(calls=[Call("c1", "weather", ('{"city": "Os',))], usage=usage)))
    err = await fails(provider, model)
    assert err.kind is ModelErrorKind.MALFORMED
    assert "weather" in err.message and "not valid JSON" in err.message
    assert err.usage == usage  # tool calls are assembled when the answer has ended


async def test_a_tool_call_cut_by_the_output_limit_is_a_note_the_turn_ends_max_tokens_after_one_request(
    provider: Provider, server: ProviderServer, model: Model, db_path: Path
) -> None:
    # The finish reason comes first: arguments cut mid-JSON by the output limit are no malformed answer.
    usage = Usage(input_tokens=5, output_tokens=MAX_TOKENS)
    cut = Call("c1", "weather", ('{"city": "Os',))
    server.add(Respond.stream(provider.answer(["Let me look."], calls=[cut], usage=usage, finish=provider.cut_finish)))
    record = await run_turn(db_path, model, tools=[WEATHER])
    assert (record.turn_end["reason"], record.turn_end["modelFinish"]) == ("max_tokens", "max_tokens")
    assert len(server.requests) == 1
    assert [c["error_class"] for c in record.calls] == [None]
    assert not record.of(EventType.MODEL_ERROR) and not record.of(EventType.TOOL_RESULT)
    [answer] = record.of(EventType.ASSISTANT_MESSAGE)
    assert {b["type"] for b in answer.data["content"]} == {"text"}
    text = "".join(b["text"] for b in answer.data["content"])
    assert text.startswith("Let me look.\n[tool call weather was cut off by the output limit")
    assert '{"city": "Os' in text


async def test_an_empty_200_stream_is_an_empty_answer_charged_nothing_and_retried_as_malformed(
    provider: Provider, server: ProviderServer, db_path: Path
) -> None:
    # A successful status, then a stream that ends before any item: the server answered (no dropped
    # connection), began nothing (charged nothing). Far from the window it is retried as malformed.
    attempts = RetryPolicy().max_attempts
    server.add(*[Respond.stream([])] * (attempts + 1))
    model = provider.model(server.url, name="contract-empty")
    try:
        err = await fails(provider, model)
        record = await run_turn(db_path, model)
    finally:
        await model.aclose()
    assert (err.kind, err.empty, err.response_started, err.retryable) == (ModelErrorKind.MALFORMED, True, False, False)
    assert "empty stream" in err.message
    assert (record.turn_end["reason"], record.turn_end["errorKind"]) == ("error", "malformed")
    assert [c["error_class"] for c in record.calls] == ["malformed"] * attempts
    assert [usage_of_row(c) for c in record.calls] == [Usage()] * attempts
    assert record.charged_tokens == 0
    assert not any(e.data.get("estimated") for e in record.of(EventType.MODEL_ERROR))


async def test_a_keep_alive_connection_the_server_closed_is_retried_at_once_and_not_counted(
    provider: Provider, server: ProviderServer
) -> None:
    # The first answer keeps its connection; the server then closes it when the next request comes
    # on it, without a byte ("Server disconnected without sending a response"): sent again at once,
    # on a new connection, within the same attempt; the breaker (opening at 1 failure) sees nothing.
    usage = Usage(input_tokens=5, output_tokens=1)
    server.add(
        Respond.stream(provider.answer(["one"], usage=usage), keep_alive=True),
        Respond.stream(provider.answer(["two"], usage=usage)),
    )
    health = ProviderHealth(provider.name, failure_threshold=1)
    model = GuardedModel(provider.model(server.url, name="contract-keepalive"), health)
    try:
        first = await model.complete(request())
        second = await model.complete(request())
    finally:
        await model.aclose()
    assert [first.content, second.content] == [[TextBlock(text="one")], [TextBlock(text="two")]]
    assert len(server.hung_up) == 1 and len(server.requests) == 2
    assert server.hung_up[0].body == server.requests[1].body
    assert (health.breaker.state.value, health.breaker.consecutive_failures, health.failures) == ("closed", 0, 0)


async def test_401_is_auth_and_is_not_retried(
    provider: Provider, server: ProviderServer, model: Model, db_path: Path
) -> None:
    server.add(provider.error(401, f"Incorrect API key provided: {provider.key}."))
    record = await run_turn(db_path, model)
    end = record.turn_end
    assert (end["reason"], end["errorKind"]) == ("error", "auth")
    assert provider.key not in end["error"] and "[redacted]" in end["error"]
    [call] = record.calls
    assert call["error_class"] == "auth"
    assert provider.key not in call["error"]
    assert not any(provider.key in str(e.data) for e in record.events)
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, ModelErrorKind.BAD_REQUEST),
        (403, ModelErrorKind.AUTH),
        (404, ModelErrorKind.BAD_REQUEST),
        (413, ModelErrorKind.BAD_REQUEST),
        (503, ModelErrorKind.SERVER),
    ],
)
async def test_other_statuses_are_classified(
    provider: Provider, server: ProviderServer, model: Model, status: int, kind: ModelErrorKind
) -> None:
    server.add(provider.error(status, "nope"))
    err = await fails(provider, model)
    assert (err.kind, err.status) == (kind, status)


async def test_a_refused_connection_is_a_connection_failure(provider: Provider) -> None:
    # A port nobody listens on (bound, then closed).
    async with ProviderServer() as srv:
        url = srv.url
    model = provider.model(url, timeout=2)
    try:
        err = await fails(provider, model)
    finally:
        await model.aclose()
    assert err.kind is ModelErrorKind.CONNECTION
