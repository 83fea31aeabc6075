"""The generic tool registry: typed arguments, a timeout, an output cap, clear errors.

Every tool here is a real async function behind :class:`agent.FunctionTool`; the registry is the
one every session uses. A tool's argument model is what the model is shown (its JSON schema) and
what a call is validated against before the tool runs; a call that runs past its timeout is
cancelled and answered with an error; longer output is cut with a marker that says how much.
"""

from __future__ import annotations

import asyncio
import re
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from agent import FunctionTool, InvalidInput, ToolContext, ToolOutput, ToolRegistry

CTX = ToolContext(session_id="ses_test", turn_id="turn_test", call_id="call_1")


class SearchArgs(BaseModel):
    """Search the notes."""

    query: str = Field(description="what to look for", min_length=1)
    limit: int = Field(default=10, ge=1, le=100, description="how many hits at most")
    mode: Literal["exact", "fuzzy"] = "exact"


class NoArgs(BaseModel):
    """No arguments."""


def search_tool(ran: list[SearchArgs]) -> FunctionTool[SearchArgs]:
    async def search(args: SearchArgs, ctx: ToolContext) -> str:
        ran.append(args)
        return f"{args.limit} hits for {args.query!r} ({args.mode})"

    return FunctionTool("search", "searches the notes", SearchArgs, search, repeat_safe=True)


# -- the argument model is the schema the model sees --------------------------------------------------


def test_the_argument_model_becomes_the_json_schema_in_the_specs() -> None:
    async def noop(args: NoArgs, ctx: ToolContext) -> str:
        return "ok"

    registry = ToolRegistry([search_tool([]), FunctionTool("noop", "does nothing", NoArgs, noop)])
    specs = {s.name: s for s in registry.specs()}
    assert set(specs) == {"search", "noop"}
    assert specs["search"].description == "searches the notes"
    schema = specs["search"].input_schema
    assert schema == SearchArgs.model_json_schema()
    assert schema["type"] == "object" and schema["required"] == ["query"]
    props = schema["properties"]
    assert props["query"]["type"] == "string" and props["query"]["description"] == "what to look for"
    assert (props["limit"]["minimum"], props["limit"]["maximum"], props["limit"]["default"]) == (1, 100, 10)
    assert props["mode"]["enum"] == ["exact", "fuzzy"]
    assert specs["noop"].input_schema["properties"] == {}
    # The specs' size is what the prompt estimate counts.
    assert registry.specs_bytes() > len("searches the notes")


def test_a_tool_declares_whether_repeating_it_is_safe_and_names_are_unique() -> None:
    tool = search_tool([])
    assert tool.repeat_safe is True

    async def send(args: NoArgs, ctx: ToolContext) -> str:
        return "sent"

    assert FunctionTool("send_mail", "sends", NoArgs, send).repeat_safe is False  # not safe unless declared
    registry = ToolRegistry([tool])
    with pytest.raises(InvalidInput, match="'search' is already registered"):
        registry.add(search_tool([]))
    assert registry.names == ["search"]


# -- validation before the tool runs -------------------------------------------------------------------


async def test_valid_arguments_are_parsed_with_their_defaults() -> None:
    ran: list[SearchArgs] = []
    registry = ToolRegistry([search_tool(ran)])
    out = await registry.call("search", {"query": "totals"}, CTX)
    assert out == ToolOutput("10 hits for 'totals' (exact)")
    assert ran == [SearchArgs(query="totals", limit=10, mode="exact")]


@pytest.mark.parametrize(
    ("raw", "fields"),
    [
        ({}, ["query"]),
        ({"query": ""}, ["query"]),
        ({"query": "x", "limit": "many"}, ["limit"]),
        ({"query": "x", "limit": 0}, ["limit"]),
        ({"query": "x", "mode": "regex"}, ["mode"]),
        ({"limit": 1000, "mode": 3}, ["query", "limit", "mode"]),
    ],
    ids=["missing", "too short", "wrong type", "out of range", "not one of the choices", "three at once"],
)
async def test_invalid_arguments_are_refused_naming_each_field_without_running_the_tool(
    raw: dict[str, object], fields: list[str]
) -> None:
    ran: list[SearchArgs] = []
    registry = ToolRegistry([search_tool(ran)])
    out = await registry.call("search", raw, CTX)
    assert out.is_error and out.denied is None
    assert out.content.startswith("invalid arguments for search: ")
    named = re.findall(r"(?:^invalid arguments for search: |; )(\w+): ", out.content)
    assert named == fields
    assert ran == []


async def test_an_unknown_tool_and_a_failing_tool_are_error_results_not_exceptions() -> None:
    async def broken(args: NoArgs, ctx: ToolContext) -> str:
        raise ValueError("the disk is full")

    registry = ToolRegistry([FunctionTool("broken", "fails", NoArgs, broken)])
    unknown = await registry.call("nope", {}, CTX)
    assert unknown.is_error and unknown.content == "unknown tool 'nope'; available: broken"
    failed = await registry.call("broken", {}, CTX)
    assert failed.is_error and failed.content == "broken failed: ValueError: the disk is full"


# -- the timeout --------------------------------------------------------------------------------------


async def test_a_tool_past_its_timeout_is_cancelled_and_answered_with_a_clear_error() -> None:
    started, cancelled, never = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def hang(args: NoArgs, ctx: ToolContext) -> str:
        started.set()
        try:
            await never.wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "unreachable"

    registry = ToolRegistry([FunctionTool("hang", "never returns", NoArgs, hang, timeout=0.05)])
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    async with asyncio.timeout(10):
        out = await registry.call("hang", {}, CTX)
    took = loop.time() - t0
    assert out.is_error and out.content == "hang timed out after 0.05s"
    assert started.is_set() and cancelled.is_set()  # the tool itself was cancelled, not left running
    assert 0.05 <= took < 5


async def test_a_tool_within_its_timeout_is_not_disturbed() -> None:
    started, gate = asyncio.Event(), asyncio.Event()

    async def waits(args: NoArgs, ctx: ToolContext) -> str:
        started.set()
        await gate.wait()
        return "finished"

    registry = ToolRegistry([FunctionTool("waits", "waits for a gate", NoArgs, waits, timeout=30)])
    call = asyncio.create_task(registry.call("waits", {}, CTX))
    async with asyncio.timeout(10):
        await started.wait()
    assert not call.done()
    gate.set()
    async with asyncio.timeout(10):
        assert await call == ToolOutput("finished")


# -- the output cap -----------------------------------------------------------------------------------


@pytest.mark.parametrize("as_output", [False, True], ids=["str", "ToolOutput"])
async def test_output_over_the_cap_is_cut_with_a_marker_saying_how_much(as_output: bool) -> None:
    cap, total = 500, 5_000
    body = "".join(f"{i % 10}" for i in range(total))

    async def loud(args: NoArgs, ctx: ToolContext) -> ToolOutput | str:
        return ToolOutput(body, is_error=True) if as_output else body

    async def quiet(args: NoArgs, ctx: ToolContext) -> str:
        return body[:cap]

    registry = ToolRegistry(
        [
            FunctionTool("loud", "prints a lot", NoArgs, loud, output_cap=cap),
            FunctionTool("quiet", "prints exactly the cap", NoArgs, quiet, output_cap=cap),
        ]
    )
    out = await registry.call("loud", {}, CTX)
    assert len(out.content) <= cap
    marker = re.search(r"\n\[\.\.\. output truncated: (\d+) of (\d+) characters not shown \.\.\.\]$", out.content)
    assert marker is not None, out.content[-120:]
    shown = out.content[: marker.start()]
    assert body.startswith(shown) and len(shown) > 0
    assert (int(marker.group(1)), int(marker.group(2))) == (total - len(shown), total)
    assert out.is_error is as_output  # an error result stays one when cut

    exact = await registry.call("quiet", {}, CTX)
    assert exact == ToolOutput(body[:cap])  # at the cap: untouched, no marker
