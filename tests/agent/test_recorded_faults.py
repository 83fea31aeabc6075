"""Faults of real servers, replayed from recordings in ``tests/wire/`` (its README says which).

Each recording is served by the local server of ``providers_server`` to the real provider class,
through a real runtime turn where the driver's reaction matters. Pins (issue 25):

* a tool call cut off by the output limit (llama-server: the arguments end mid-string, then
  ``finish_reason: "length"``) ends the turn ``max_tokens`` after one request: the call is recorded
  as a note, never run, never called malformed, never retried.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from providers_server import ProviderServer, Respond, recorded_frames, run_turn
from pydantic import BaseModel

from agent import EventType, FunctionTool, ToolContext
from agent.models.openai import OpenAIModel


class WriteArgs(BaseModel):
    path: str
    content: str


@pytest.fixture
async def server() -> AsyncIterator[ProviderServer]:
    async with ProviderServer() as srv:
        yield srv
        srv.assert_done()


def llama_server(server: ProviderServer, name: str = "SmolLM2-135M-Instruct", **kw: Any) -> OpenAIModel:
    """The OpenAI-compatible provider pointed at the local server, as at a llama-server."""
    return OpenAIModel(name, base_url=server.url + "/v1", api_key="", **{"timeout": 5.0, "max_tokens": 32, **kw})


async def test_a_tool_call_cut_by_the_output_limit_ends_max_tokens_with_one_request(
    server: ProviderServer, db_path: Path
) -> None:
    ran: list[WriteArgs] = []

    async def write(args: WriteArgs, ctx: ToolContext) -> str:
        ran.append(args)
        return "written"

    server.add(Respond.stream(recorded_frames("llama_server_cut_tool_call.sse")))
    model = llama_server(server, "cut-call")
    try:
        record = await run_turn(
            db_path, model, "write a.txt", tools=[FunctionTool("write_file", "write", WriteArgs, write)]
        )
    finally:
        await model.aclose()
    end = record.turn_end
    assert (end["reason"], end.get("modelFinish")) == ("max_tokens", "max_tokens")
    assert len(server.requests) == 1
    assert ran == []
    assert not record.of(EventType.MODEL_ERROR)
    assert [c["error_class"] for c in record.calls] == [None]
    # The usage the server reported is what is charged.
    assert record.charged_tokens == 1250
    [answer] = record.of(EventType.ASSISTANT_MESSAGE)
    assert answer.data["finishReason"] == "max_tokens"
    [note] = answer.data["content"]
    assert note["type"] == "text"
    assert "write_file" in note["text"] and "cut off by the output limit" in note["text"]
    assert '{"path":"a.txt","content":"txt' in note["text"]
    assert not record.of(EventType.TOOL_RESULT)
