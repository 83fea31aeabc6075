"""The driver: interrupts, turn end reasons, model retries and tool execution, on a real SQLite file.

Pins the runtime-core "must show" items about one turn: ``interrupt()`` mid-model-call ends the
turn ``cancelled`` and keeps the streamed text marked interrupted; queued messages stay queued
unless discarded; interrupting an idle agent does nothing; a follow-up sent while an interrupt
settles runs afterwards; ``max_steps``, ``max_tokens`` and ``error`` endings; retryable model
errors are retried, each attempt a ``model_calls`` row; the tool calls of one step run
concurrently; the assistant message asking for tools is durable before any tool starts.

The test waits for the model to be mid-stream through a delta listener, and a long
``chunk_delay`` keeps the stream open until the interrupt cuts it, so nothing depends on timing.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable
from contextlib import closing
from typing import Any, TypeVar

import pytest
import storekit
from pydantic import BaseModel
from storekit import Location

from agent import (
    AgentStatus,
    Event,
    EventType,
    FinishReason,
    FunctionTool,
    MessageId,
    ModelErrorKind,
    ModelRequest,
    Reply,
    Runtime,
    ScriptedModel,
    TextBlock,
    ToolCall,
    ToolContext,
    ToolOutput,
)
from agent.db import Conn
from agent.turns import CANCELLED_TOOL_TEXT

#: The store contract: every test here runs on SQLite and on PostgreSQL.
pytestmark = pytest.mark.both_stores

T = TypeVar("T")
WAIT = 10.0
LONG_ANSWER = "The answer streams in four chunks and is cut after the first one."


# -- helpers --------------------------------------------------------------------------------


async def within(aw: Awaitable[T], seconds: float = WAIT) -> T:
    """Await ``aw`` with a time limit."""
    async with asyncio.timeout(seconds):
        return await aw


async def events_of(rt: Runtime, sid: str, *types: str) -> list[Event]:
    """Stored events of a session, optionally only of some types."""
    return await rt.store.events_after(sid, 0, types=list(types) or None)


async def inbox_row(rt: Runtime, message_id: str) -> dict[str, Any]:
    """One inbox row as a dict."""

    def run(conn: Conn) -> dict[str, Any]:
        row = conn.execute("SELECT * FROM inbox WHERE id=?", (message_id,)).fetchone()
        assert row is not None, f"no inbox row {message_id}"
        return dict(row)

    return await rt.store.read(run)


async def model_calls(rt: Runtime, sid: str) -> list[dict[str, Any]]:
    """The session's ``model_calls`` rows in attempt order."""

    def run(conn: Conn) -> list[dict[str, Any]]:
        rows = conn.execute(
            "SELECT * FROM model_calls WHERE session_id=? ORDER BY started_at, attempt", (sid,)
        ).fetchall()
        return [dict(r) for r in rows]

    return await rt.store.read(run)


def total_events(db_path: Location) -> int:
    """Rows in ``events`` across every session, through a second connection."""
    with closing(storekit.connect(db_path)) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM events").fetchone()[0])


def streaming_reply() -> Reply:
    """A reply that streams its first chunk, then stalls (the model is slow) until cancelled."""
    return Reply.say(LONG_ANSWER, chunks=4, chunk_delay=60.0)


def first_chunk() -> str:
    return LONG_ANSWER[: math.ceil(len(LONG_ANSWER) / 4)]


def texts(request: ModelRequest, role: str) -> list[str]:
    """The text of every message of ``role`` in a prompt."""
    return ["".join(b.text for b in m.content if isinstance(b, TextBlock)) for m in request.messages if m.role == role]


class NoArgs(BaseModel):
    """No arguments."""


def tool(name: str, fn: Any, *, timeout: float = 60.0, in_store: bool = False) -> FunctionTool[NoArgs]:
    """A no-argument tool from an async function of the context."""

    async def run(args: NoArgs, ctx: ToolContext) -> ToolOutput | str:
        result: ToolOutput | str = await fn(ctx)
        return result

    return FunctionTool(name, f"test tool {name}", NoArgs, run, timeout=timeout, effects_in_store=in_store)


# -- interrupt -------------------------------------------------------------------------------


async def start_streaming_turn(rt: Runtime, agent: Any) -> None:
    """Send a follow-up and return once the model has streamed its first chunk."""
    streaming = asyncio.Event()
    remove = agent.add_delta_listener(lambda turn_id, text: streaming.set())
    await agent.followup("tell me something long")
    await within(streaming.wait())
    remove()


async def test_interrupt_mid_model_call_keeps_partial_text_and_queued_messages(open_runtime) -> None:
    model = ScriptedModel([streaming_reply(), Reply.say("picked up the queued work")])
    async with open_runtime(model) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        await start_streaming_turn(rt, agent)
        queued, context = MessageId.new(), MessageId.new()
        await agent.followup("queued during the turn", message_id=queued)
        await agent.inject("context during the turn", message_id=context)

        assert await within(agent.interrupt()) is None
        # interrupt() returns once the turn's end is durable.
        ends = await events_of(rt, sid, EventType.TURN_END)
        assert [e.data["reason"] for e in ends] == ["cancelled"]
        first_turn = ends[0].data["turnId"]

        await within(agent.when_idle())
        starts = [e.data["turnId"] for e in await events_of(rt, sid, EventType.TURN_START)]
        replies = await events_of(rt, sid, EventType.ASSISTANT_MESSAGE)
        cancelled = await events_of(rt, sid, EventType.MESSAGE_CANCELLED)
        rows = {mid: await inbox_row(rt, mid) for mid in (queued, context)}
        calls = await model_calls(rt, sid)
    model.assert_done()

    partial_reply = replies[0]
    assert partial_reply.data["turnId"] == first_turn
    assert partial_reply.data["interrupted"] is True
    assert partial_reply.data["content"] == [{"type": "text", "text": first_chunk()}]
    # The messages queued during the interrupted turn were never cancelled: the next turn took them.
    assert cancelled == []
    assert len(starts) == 2 and starts[0] == first_turn
    assert {r["fate"] for r in rows.values()} == {"admitted"}
    assert {r["turn_id"] for r in rows.values()} == {starts[1]}
    # The interrupted call's reservation was charged in full; the next call settled normally.
    assert [c["state"] for c in calls] == ["charged_in_full", "settled"]
    # The kept partial text is part of the conversation the next call sees.
    second = model.calls[1].request
    assert texts(second, "assistant") == [first_chunk()]
    assert texts(second, "user") == ["tell me something long", "queued during the turn", "context during the turn"]


async def test_interrupt_with_discard_cancels_queued_messages(open_runtime) -> None:
    model = ScriptedModel([streaming_reply()])
    async with open_runtime(model) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        await start_streaming_turn(rt, agent)
        queued, steer, context = MessageId.new(), MessageId.new(), MessageId.new()
        await agent.followup("queued", message_id=queued)
        await agent.steer("steer", message_id=steer)
        await agent.inject("context", message_id=context)

        await within(agent.interrupt(discard_queued=True))
        snap = await within(agent.when_idle())
        cancelled = await events_of(rt, sid, EventType.MESSAGE_CANCELLED)
        ends = await events_of(rt, sid, EventType.TURN_END)
        rows = [await inbox_row(rt, mid) for mid in (queued, steer, context)]
        last = (await events_of(rt, sid))[-1]
    model.assert_done()
    assert [(e.data["messageId"], e.data["reason"]) for e in cancelled] == [
        (queued, "discarded"),
        (steer, "discarded"),
        (context, "discarded"),
    ]
    assert [(r["fate"], r["cancel_reason"]) for r in rows] == [("cancelled", "discarded")] * 3
    assert [e.data["reason"] for e in ends] == ["cancelled"]
    assert snap.status is AgentStatus.IDLE and last.seq == snap.seq


@pytest.mark.parametrize("in_store", [False, True], ids=["durable answer", "deferred answer"])
async def test_interrupt_cancels_tool_calls_in_flight(open_runtime, in_store: bool) -> None:
    # A call that changes nothing but through the driver runs before its answer is durable
    # (agent.step): the interrupt's cleanup
    # commits the answer first, then the call's cancelled result, as for any other call.
    started = asyncio.Event()

    async def hang(ctx: ToolContext) -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    model = ScriptedModel([Reply.call("hang")])
    async with open_runtime(model, tools=[tool("hang", hang, in_store=in_store)]) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        await agent.followup("run the tool")
        await within(started.wait())
        await within(agent.interrupt())
        await within(agent.when_idle())
        answers = await events_of(rt, sid, EventType.ASSISTANT_MESSAGE)
        results = await events_of(rt, sid, EventType.TOOL_RESULT)
        ends = await events_of(rt, sid, EventType.TURN_END)
    model.assert_done()
    uses = [b["id"] for a in answers for b in a.data["content"] if b["type"] == "tool_use"]
    assert [(r.data["toolUseId"], r.data["content"], r.data["isError"]) for r in results] == [
        (uses[0], CANCELLED_TOOL_TEXT, True)
    ]
    assert len(uses) == 1 and answers[0].seq < results[0].seq
    assert [e.data["reason"] for e in ends] == ["cancelled"]


async def test_interrupting_an_idle_agent_does_nothing(open_runtime, db_path) -> None:
    model = ScriptedModel([Reply.say("done")])
    async with open_runtime(model) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        before = total_events(db_path)
        await within(agent.interrupt())
        assert total_events(db_path) == before

        await agent.followup("go")
        idle = await within(agent.when_idle())
        context = MessageId.new()
        await agent.inject("context that waits for the next turn", message_id=context)
        before = total_events(db_path)
        await within(agent.interrupt())
        await within(agent.interrupt(discard_queued=True))
        assert total_events(db_path) == before
        assert (agent.status, agent.status_seq) == (AgentStatus.IDLE, idle.seq)
        assert (await inbox_row(rt, context))["fate"] == "queued"
    model.assert_done()


@pytest.mark.parametrize("when", ["with_the_interrupt", "between_cleanup_and_turn_end"])
async def test_followup_sent_while_an_interrupt_settles_runs_afterwards(open_runtime, when) -> None:
    model = ScriptedModel([streaming_reply(), Reply.say("answered the late follow-up")])
    async with open_runtime(model) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        await start_streaming_turn(rt, agent)
        late = MessageId.new()
        sent: list[asyncio.Task[None]] = []
        if when == "with_the_interrupt":
            await within(asyncio.gather(agent.interrupt(), agent.followup("late", message_id=late)))
        else:
            # Sent from the commit of the interrupted turn's cleanup, before its turn/end is written.
            def on_event(event: Event) -> None:
                if event.type == EventType.ASSISTANT_MESSAGE and event.data.get("interrupted"):
                    sent.append(asyncio.create_task(agent.followup("late", message_id=late)))

            remove = rt.store.hub.add_listener(on_event)
            await within(agent.interrupt())
            remove()
            await within(asyncio.gather(*sent))
            assert len(sent) == 1
        await within(agent.when_idle())
        starts = [e.data["turnId"] for e in await events_of(rt, sid, EventType.TURN_START)]
        ends = await events_of(rt, sid, EventType.TURN_END)
        row = await inbox_row(rt, late)
    model.assert_done()
    assert [e.data["reason"] for e in ends] == ["cancelled", "end_turn"]
    assert len(starts) == 2
    assert (row["fate"], row["turn_id"]) == ("admitted", starts[1])
    assert texts(model.calls[1].request, "user")[-1] == "late"


# -- end reasons -----------------------------------------------------------------------------


async def test_max_steps_ends_the_turn(open_runtime) -> None:
    model = ScriptedModel([Reply.call("noop"), Reply.call("noop")])
    async with open_runtime(model) as rt:
        sid = await rt.create_session(config={"agent": {"max_steps": 2}})
        agent = await rt.agent(sid)
        await agent.followup("loop forever")
        await within(agent.when_idle())
        ends = await events_of(rt, sid, EventType.TURN_END)
        results = await events_of(rt, sid, EventType.TOOL_RESULT)
    model.assert_done()
    assert [(e.data["reason"], e.data["steps"]) for e in ends] == [("max_steps", 2)]
    assert len(results) == 2


async def test_max_tokens_reply_ends_the_turn_and_never_runs_cut_off_tool_calls(open_runtime) -> None:
    ran: list[str] = []

    async def record(ctx: ToolContext) -> str:
        ran.append(ctx.call_id)
        return "ran"

    cut = Reply("a long answer that was cut", tool_calls=[ToolCall("record")], finish=FinishReason.MAX_TOKENS)
    model = ScriptedModel([cut])
    async with open_runtime(model, tools=[tool("record", record)]) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        await agent.followup("write a lot")
        await within(agent.when_idle())
        ends = await events_of(rt, sid, EventType.TURN_END)
        replies = await events_of(rt, sid, EventType.ASSISTANT_MESSAGE)
        results = await events_of(rt, sid, EventType.TOOL_RESULT)
    model.assert_done()
    assert [(e.data["reason"], e.data["modelFinish"], e.data["steps"]) for e in ends] == [
        ("max_tokens", "max_tokens", 1)
    ]
    text, note = replies[0].data["content"]
    assert text == {"type": "text", "text": "a long answer that was cut"}
    # The cut call is recorded as a note (the model reads it next time), never run.
    assert note["text"].startswith("\n[tool call record was cut off by the output limit (max_tokens)")
    assert results == [] and ran == []


async def test_retryable_errors_are_retried_and_each_attempt_is_recorded(open_runtime) -> None:
    model = ScriptedModel(
        [
            Reply.fail(ModelErrorKind.SERVER, "502 from upstream"),
            Reply.fail(ModelErrorKind.RATE_LIMIT, "slow down"),
            Reply.say("third time lucky"),
        ]
    )
    async with open_runtime(model) as rt:
        sid = await rt.create_session(config={"agent": {"retry": {"base_delay": 0.001}}})
        agent = await rt.agent(sid)
        await agent.followup("try hard")
        await within(agent.when_idle())
        calls = await model_calls(rt, sid)
        errors = await events_of(rt, sid, EventType.MODEL_ERROR)
        ends = await events_of(rt, sid, EventType.TURN_END)
    model.assert_done()
    assert [(c["attempt"], c["state"], c["error_class"]) for c in calls] == [
        (1, "settled", "server"),
        (2, "settled", "rate_limit"),
        (3, "settled", None),
    ]
    assert len({c["id"] for c in calls}) == 3
    assert len({c["turn_id"] for c in calls}) == 1
    assert [(e.data["attempt"], e.data["kind"], e.data["retrying"]) for e in errors] == [
        (1, "server", True),
        (2, "rate_limit", True),
    ]
    assert [(e.data["reason"], e.data["steps"]) for e in ends] == [("end_turn", 1)]


async def test_a_retry_after_longer_than_the_cap_ends_the_turn_instead_of_holding_it(open_runtime) -> None:
    # A day-long Retry-After must not keep a turn (and its concurrency slot) asleep: the attempt is
    # not retried, the turn ends error, and whoever owns the session (a goal) backs off durably.
    model = ScriptedModel([Reply.fail(ModelErrorKind.RATE_LIMIT, "quota used up", retry_after=86_400.0)])
    async with open_runtime(model) as rt:
        sid = await rt.create_session(config={"agent": {"retry": {"max_retry_after": 60}}})
        agent = await rt.agent(sid)
        await agent.followup("try")
        await within(agent.when_idle())
        calls = await model_calls(rt, sid)
        errors = await events_of(rt, sid, EventType.MODEL_ERROR)
        ends = await events_of(rt, sid, EventType.TURN_END)
    model.assert_done()
    assert [(c["attempt"], c["error_class"]) for c in calls] == [(1, "rate_limit")]
    assert [(e.data["kind"], e.data["retrying"]) for e in errors] == [("rate_limit", False)]
    assert [(e.data["reason"], e.data["errorKind"]) for e in ends] == [("error", "rate_limit")]


async def test_retries_stop_after_max_attempts_and_the_turn_ends_error(open_runtime) -> None:
    model = ScriptedModel([Reply.fail(ModelErrorKind.TIMEOUT, "took too long")] * 2)
    async with open_runtime(model) as rt:
        sid = await rt.create_session(config={"agent": {"retry": {"base_delay": 0.001, "max_attempts": 2}}})
        agent = await rt.agent(sid)
        await agent.followup("try")
        await within(agent.when_idle())
        calls = await model_calls(rt, sid)
        errors = await events_of(rt, sid, EventType.MODEL_ERROR)
        ends = await events_of(rt, sid, EventType.TURN_END)
    model.assert_done()
    assert [c["attempt"] for c in calls] == [1, 2]
    assert [e.data["retrying"] for e in errors] == [True, False]
    assert [(e.data["reason"], e.data["errorKind"]) for e in ends] == [("error", "timeout")]
    assert "took too long" in ends[0].data["error"]


@pytest.mark.parametrize("kind", [ModelErrorKind.AUTH, ModelErrorKind.BAD_REQUEST])
async def test_non_retryable_error_ends_the_turn_error_after_one_attempt(open_runtime, kind) -> None:
    model = ScriptedModel([Reply.fail(kind, "no good")])
    async with open_runtime(model) as rt:
        sid = await rt.create_session(config={"agent": {"retry": {"base_delay": 0.001}}})
        agent = await rt.agent(sid)
        await agent.followup("try")
        snap = await within(agent.when_idle())
        calls = await model_calls(rt, sid)
        errors = await events_of(rt, sid, EventType.MODEL_ERROR)
        ends = await events_of(rt, sid, EventType.TURN_END)
    model.assert_done()
    assert [(c["attempt"], c["error_class"]) for c in calls] == [(1, kind.value)]
    assert [(e.data["kind"], e.data["retrying"]) for e in errors] == [(kind.value, False)]
    assert [(e.data["reason"], e.data["errorKind"], e.data["steps"]) for e in ends] == [("error", kind.value, 0)]
    assert "no good" in ends[0].data["error"]
    assert snap.status is AgentStatus.IDLE


# -- tools -----------------------------------------------------------------------------------


async def test_tool_calls_of_one_step_run_concurrently(open_runtime) -> None:
    # Each tool waits for the other to start: run one after the other, both would time out.
    a_started, b_started = asyncio.Event(), asyncio.Event()

    async def tool_a(ctx: ToolContext) -> str:
        a_started.set()
        await b_started.wait()
        return "a saw b"

    async def tool_b(ctx: ToolContext) -> str:
        b_started.set()
        await a_started.wait()
        return "b saw a"

    step = Reply("running both", tool_calls=[ToolCall("tool_a", id="call_a"), ToolCall("tool_b", id="call_b")])
    model = ScriptedModel([step, Reply.say("both done")])
    tools = [tool("tool_a", tool_a, timeout=5.0), tool("tool_b", tool_b, timeout=5.0)]
    async with open_runtime(model, tools=tools) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        await agent.followup("run both")
        await within(agent.when_idle())
        results = await events_of(rt, sid, EventType.TOOL_RESULT)
        ends = await events_of(rt, sid, EventType.TURN_END)
    model.assert_done()
    assert sorted((r.data["toolUseId"], r.data["content"], r.data["isError"]) for r in results) == [
        ("call_a", "a saw b", False),
        ("call_b", "b saw a", False),
    ]
    assert [e.data["reason"] for e in ends] == ["end_turn"]


async def test_assistant_message_asking_for_tools_is_committed_before_the_tool_starts(open_runtime, db_path) -> None:
    async def look(ctx: ToolContext) -> str:
        # A second connection, as another process would read the store.
        with closing(storekit.connect(db_path)) as conn:
            rows = conn.execute(
                "SELECT data FROM events WHERE session_id=? AND type=?",
                (ctx.session_id, EventType.ASSISTANT_MESSAGE.value),
            ).fetchall()
        uses = [b["id"] for (data,) in rows for b in json.loads(data)["content"] if b["type"] == "tool_use"]
        return "committed" if ctx.call_id in uses else "not committed"

    model = ScriptedModel([Reply.call("look"), Reply.say("done")])
    async with open_runtime(model, tools=[tool("look", look)]) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        await agent.followup("look at the store")
        await within(agent.when_idle())
        results = await events_of(rt, sid, EventType.TOOL_RESULT)
    model.assert_done()
    assert [(r.data["content"], r.data["isError"]) for r in results] == [("committed", False)]
