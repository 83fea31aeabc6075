"""The request bodies the providers put on the wire, and the work each step costs to build one.

Pins, for both HTTP providers against a local server speaking the real wire format:

* the body a server receives is byte for byte what the SDKs' typed ``create`` sent before the
  providers assembled their bodies themselves (recorded in ``tests/wire/``; headers too: the SDK
  still sends the request), over a conversation with every kind of block, escapes and non-ASCII;
* a body built incrementally (each message converted once, into the conversation's cache) is the
  body built from scratch, at every step, including Anthropic's merging of consecutive messages;
  and :meth:`Model.measure` is the body's exact size;
* flatness, counted, not timed: through the real driver, each request converts only the messages
  the step added (one assistant message and one tool result), while the history it carries grows.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from providers_server import (
    ProviderServer,
    Recorded,
    Respond,
    an_message_delta,
    an_message_start,
    an_message_stop,
    an_tool,
    anthropic_text,
    oa_call,
    oa_chunk,
    oa_usage,
    openai_stream,
    openai_text,
)
from pydantic import BaseModel

from agent import (
    ConvMessage,
    FunctionTool,
    ModelRegistry,
    ModelRequest,
    Runtime,
    TextBlock,
    ToolContext,
    ToolRegistry,
    ToolResultBlock,
    ToolUseBlock,
)
from agent.models._http import StreamingHTTPModel
from agent.models.anthropic import AnthropicModel
from agent.models.base import WireCache
from agent.models.openai import OpenAIModel

WIRE = Path(__file__).resolve().parents[1] / "wire"


class CityArgs(BaseModel):
    city: str
    days: int = 1


async def _weather(args: CityArgs, ctx: ToolContext) -> str:
    return f"sunny in {args.city}"


WEATHER = FunctionTool("weather", "the forecast for a city — «quoted»", CityArgs, _weather)

HISTORY = [
    ConvMessage(
        role="user",
        content=[TextBlock(text='weather in Oslo and Rome? "quotes" \\ and ünïcödé 東京 \u2028 tab\t nl\n')],
    ),
    ConvMessage(
        role="assistant",
        content=[
            TextBlock(text="Checking."),
            ToolUseBlock(
                id="call_a", name="weather", input={"city": "Oslo/Øst", "nested": {"a": [1, 2.5, None, True]}}
            ),
            ToolUseBlock(id="call_b", name="weather", input={"city": "Rome", "days": 2}),
        ],
    ),
    ConvMessage(role="tool", content=[ToolResultBlock(tool_use_id="call_a", content="rain 雨")]),
    ConvMessage(role="tool", content=[ToolResultBlock(tool_use_id="call_b", content="no such city", is_error=True)]),
    ConvMessage(role="user", content=[TextBlock(text="and tomorrow?"), TextBlock(text="second block")]),
    ConvMessage(role="assistant", content=[TextBlock(text="")]),
    ConvMessage(role="assistant", content=[ToolUseBlock(id="call_c", name="weather", input={})]),
    ConvMessage(role="tool", content=[ToolResultBlock(tool_use_id="call_c", content="")]),
    ConvMessage(role="user", content=[TextBlock(text="thanks")]),
]


def same_headers(got: dict[str, str], name: str) -> None:
    """The recorded headers, by name; by value too except where it names the machine, the SDK's
    version or the server's port (recorded as ``null``)."""
    want: dict[str, str | None] = json.loads((WIRE / f"{name}.headers.json").read_text())
    assert sorted(got) == sorted(want)
    assert {k: v for k, v in got.items() if want[k] is not None} == {k: v for k, v in want.items() if v is not None}


async def test_openai_bodies_are_byte_for_byte_the_sdk_create_bodies() -> None:
    async with ProviderServer() as server:
        server.add(Respond.stream(openai_text(["ok"])), Respond.stream(openai_text(["ok"])))
        chat = OpenAIModel("gpt-test", base_url=server.url + "/v1", api_key="k")
        newer = OpenAIModel(
            "o-test", base_url=server.url + "/v1", api_key="k", max_tokens_param="max_completion_tokens"
        )
        try:
            await chat.complete(ModelRequest("sys ✓", HISTORY, [WEATHER.spec()], 256))
            await newer.complete(ModelRequest(None, HISTORY[:1], [], 99))
        finally:
            await chat.aclose()
            await newer.aclose()
        server.assert_done()
    assert server.requests[0].raw == (WIRE / "openai_tools.json").read_bytes()
    assert server.requests[1].raw == (WIRE / "openai_completion_tokens.json").read_bytes()
    same_headers(server.requests[0].headers, "openai_tools")


async def test_anthropic_bodies_are_byte_for_byte_the_sdk_create_bodies() -> None:
    async with ProviderServer() as server:
        server.add(Respond.stream(anthropic_text(["ok"])), Respond.stream(anthropic_text(["ok"])))
        model = AnthropicModel("claude-test", base_url=server.url, api_key="k")
        try:
            await model.complete(ModelRequest("sys ✓", HISTORY, [WEATHER.spec()], 256))
            await model.complete(ModelRequest(None, HISTORY[:1], [], 99))
        finally:
            await model.aclose()
        server.assert_done()
    assert server.requests[0].raw == (WIRE / "anthropic_tools.json").read_bytes()
    assert server.requests[1].raw == (WIRE / "anthropic_plain.json").read_bytes()
    same_headers(server.requests[0].headers, "anthropic_tools")


def _openai(url: str) -> StreamingHTTPModel[Any]:
    return OpenAIModel("gpt-test", base_url=url + "/v1", api_key="k")


def _anthropic(url: str) -> StreamingHTTPModel[Any]:
    return AnthropicModel("claude-test", base_url=url, api_key="k")


def _answer(make: Callable[[str], StreamingHTTPModel[Any]]) -> Respond:
    return Respond.stream(openai_text(["ok"]) if make is _openai else anthropic_text(["ok"]))


@pytest.mark.parametrize("make", [_openai, _anthropic], ids=["openai", "anthropic"])
async def test_an_incremental_body_is_the_body_built_from_scratch_at_every_step(
    make: Callable[[str], StreamingHTTPModel[Any]],
) -> None:
    # Every prefix of a conversation that ends in each kind of message, twice over (so a
    # merged Anthropic message is reopened and closed again).
    conversation = HISTORY + HISTORY[1:]
    cache = WireCache()
    tools = [WEATHER.spec()]
    async with ProviderServer() as server:
        model = make(server.url)
        try:
            for n in range(1, len(conversation) + 1):
                server.add(_answer(make), _answer(make))
                messages = tuple(conversation[:n])
                cached = ModelRequest("sys", messages, tools, 100, cache=cache)
                size = model.measure(cached)
                await model.complete(cached)
                await model.complete(ModelRequest("sys", list(messages), tools, 100))
                incremental, scratch = server.requests[-2].raw, server.requests[-1].raw
                assert incremental == scratch, f"bodies differ after {n} messages"
                assert size == len(incremental)
        finally:
            await model.aclose()
        server.assert_done()
    # Each message was converted once, however many requests carried it.
    assert cache.converted == len(conversation)


@pytest.mark.parametrize("make", [_openai, _anthropic], ids=["openai", "anthropic"])
async def test_a_conversation_that_is_not_an_extension_is_converted_afresh(
    make: Callable[[str], StreamingHTTPModel[Any]],
) -> None:
    cache = WireCache()
    async with ProviderServer() as server:
        model = make(server.url)
        try:
            server.add(_answer(make), _answer(make), _answer(make))
            await model.complete(ModelRequest(None, HISTORY[:4], [], 100, cache=cache))
            # A replaced history (a reload, a compaction): new message objects, another order.
            replaced = [HISTORY[4], HISTORY[0]]
            await model.complete(ModelRequest(None, replaced, [], 100, cache=cache))
            await model.complete(ModelRequest(None, replaced, [], 100))
        finally:
            await model.aclose()
        server.assert_done()
    assert server.requests[1].raw == server.requests[2].raw
    assert cache.converted == 4 + 2


# -- flatness, counted ---------------------------------------------------------------------------

STEPS = 40


def _tool_call_answer(make: Callable[[str], StreamingHTTPModel[Any]], n: int) -> Respond:
    if make is _openai:
        return Respond.stream(
            openai_stream(
                [
                    oa_chunk(tool_calls=[oa_call(0, id=f"call_{n}", name="weather", args='{"city": "Oslo"}')]),
                    oa_chunk(finish="tool_calls"),
                    oa_chunk(no_choices=True, usage=oa_usage(30, 10)),
                ]
            )
        )
    return Respond.stream(
        [
            an_message_start(30),
            *an_tool(0, f"toolu_{n}", "weather", ['{"city": "Oslo"}']),
            an_message_delta("tool_use", 10),
            an_message_stop(),
        ]
    )


@pytest.mark.parametrize("make", [_openai, _anthropic], ids=["openai", "anthropic"])
async def test_each_step_converts_only_what_it_added_however_long_the_history(
    make: Callable[[str], StreamingHTTPModel[Any]], db_path: Path
) -> None:
    async with ProviderServer() as server:
        model = make(server.url)
        server.add(*(_tool_call_answer(make, n) for n in range(STEPS)), _answer(make))
        registry = ModelRegistry({model.spec: model}, default=model.spec)
        try:
            async with Runtime.open(db_path, models=registry, tools=lambda row: ToolRegistry([WEATHER])) as rt:
                sid = await rt.create_session(config={"agent": {"max_steps": STEPS + 5}})
                agent = await rt.agent(sid)
                seen: list[tuple[int, int, int]] = []

                def on_request(request: Recorded) -> None:
                    # The client waits for this answer: its cache holds what this request cost.
                    seen.append((agent.wire.converted, agent.wire.serialized_bytes, len(request.raw)))

                server.on_request = on_request
                await agent.followup("weather in Oslo, again and again")
                await agent.when_idle()
        finally:
            await model.aclose()
        server.assert_done()
    assert len(seen) == STEPS + 1
    converted = [b[0] - a[0] for a, b in itertools.pairwise(seen)]
    serialized = [b[1] - a[1] for a, b in itertools.pairwise(seen)]
    # One assistant message and one tool result per step, at step 2 as at step 40 ...
    assert converted == [2] * STEPS
    # ... and the same bytes serialized for them (the call ids differ by a digit at most) ...
    assert max(serialized) - min(serialized) <= 2
    # ... while the body grows with the history, step after step.
    sizes = [s[2] for s in seen]
    assert sizes == sorted(sizes)
    assert sizes[-1] > 10 * sizes[0]
    assert seen[-1][0] == 1 + 2 * STEPS  # every message of the history converted exactly once
