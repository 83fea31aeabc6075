"""What only the Anthropic provider does, against a local server speaking the Messages API stream.

What every provider does (the request, streamed text and tool calls, usage with cache reads and
writes, the failure classes and the driver's retries) is pinned once for both in
``test_provider_contract.py``. Here: a ``tool_use`` block without input, the stop reasons
(``max_tokens``, ``end_turn``/``stop_sequence``, ``refusal``), 529 overloaded -> server, and an
``overloaded_error`` event in the middle of a 200 stream -> server with the usage seen.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from providers_server import (
    Call,
    ProviderServer,
    Respond,
    an_message_start,
    an_text,
    anthropic_answer,
    anthropic_text,
    sse,
)

from agent import (
    ConvMessage,
    FinishReason,
    ModelError,
    ModelErrorKind,
    ModelRequest,
    TextBlock,
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


# -- success paths ---------------------------------------------------------------------------------


async def test_a_tool_call_without_input_has_empty_arguments(server: ProviderServer, model: AnthropicModel) -> None:
    server.add(Respond.stream(anthropic_answer(calls=[Call("toolu_n", "noop")], usage=Usage(input_tokens=40))))
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
