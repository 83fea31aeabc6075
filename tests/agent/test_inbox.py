"""The inbox and whole-agent idle, on each store (a real SQLite file, a real PostgreSQL database).

Pins the runtime-core "must show" items about input messages: ``followup()`` only enqueues and the
message is durable as queued before it returns (seen through a second connection while the agent
is busy); a caller-supplied ``MessageId`` is idempotent within its session and conflicts across
sessions; every message ends exactly once (admitted by a recorded turn, or cancelled with a
reason); ``pending_key`` admits one queued message under concurrent enqueues; a waking follow-up
supersedes a yielding message in its own transaction; steering joins the running turn while
injected context never wakes; ``when_idle()`` observes the whole agent; bad input is refused with a
clear error and writes nothing.

Where a test needs the agent busy, the scripted model's reply waits on a :class:`Gate` the test
opens, so nothing depends on timing.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Coroutine
from contextlib import closing
from functools import partial
from typing import Any, TypeVar

import pytest
import storekit
from storekit import Location

from agent import (
    MAX_MESSAGE_BYTES,
    AgentStatus,
    Conflict,
    Delivery,
    Enqueued,
    EventType,
    Fate,
    InvalidInput,
    InvalidTransition,
    MessageId,
    ModelErrorKind,
    ModelRequest,
    NotFound,
    Reply,
    Runtime,
    ScriptedModel,
    Source,
    SourceKind,
    StatusSnapshot,
    TextBlock,
    enqueue,
    parse_content,
    transition_fate,
)
from agent.db import Conn
from agent.messages import content_json

#: The store contract: every test here runs on SQLite and on PostgreSQL.
pytestmark = pytest.mark.both_stores

T = TypeVar("T")
WAIT = 10.0


# -- helpers --------------------------------------------------------------------------------


class Gate:
    """A scripted reply that is held until the test releases it (the model is "thinking")."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.entered = asyncio.Event()
        self.released = asyncio.Event()

    def release(self) -> None:
        """Let the model answer."""
        self.released.set()


class Script:
    """A scripted model whose steps are plain replies or gated ones, consumed in order."""

    def __init__(self, *steps: Reply | Gate) -> None:
        self.steps = list(steps)
        self.extra: list[ModelRequest] = []
        self.model = ScriptedModel(self._rule)

    async def _rule(self, request: ModelRequest) -> Reply:
        if not self.steps:
            self.extra.append(request)
            return Reply.fail(ModelErrorKind.UNEXPECTED_CALL, "the script has no step left")
        step = self.steps.pop(0)
        if isinstance(step, Gate):
            step.entered.set()
            await step.released.wait()
            return step.reply
        return step

    def assert_done(self) -> None:
        """Every step was consumed and no call came that the script did not expect."""
        assert not self.steps, f"{len(self.steps)} scripted step(s) never consumed"
        assert not self.extra, f"{len(self.extra)} unexpected model call(s)"


async def within(aw: Awaitable[T], seconds: float = WAIT) -> T:
    """Await ``aw`` with a time limit."""
    async with asyncio.timeout(seconds):
        return await aw


def user_texts(request: ModelRequest) -> list[str]:
    """The text of every user message of a prompt, in order."""
    return [
        "".join(b.text for b in m.content if isinstance(b, TextBlock)) for m in request.messages if m.role == "user"
    ]


def counts(db_path: Location) -> tuple[int, int]:
    """Rows in ``inbox`` and ``events``, read through a second connection."""
    with closing(storekit.connect(db_path)) as conn:
        inbox = conn.execute("SELECT COUNT(*) FROM inbox").fetchone()[0]
        events = conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    return int(inbox), int(events)


async def inbox_row(rt: Runtime, message_id: str) -> dict[str, Any]:
    """One inbox row as a dict."""

    def run(conn: Conn) -> dict[str, Any]:
        row = conn.execute("SELECT * FROM inbox WHERE id=?", (message_id,)).fetchone()
        assert row is not None, f"no inbox row {message_id}"
        return dict(row)

    return await rt.store.read(run)


async def events_of(rt: Runtime, sid: str, *types: str) -> list[Any]:
    """Stored events of a session, optionally only of some types."""
    return await rt.store.events_after(sid, 0, types=list(types) or None)


def resolve_now(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` one step and return its result; fail if it would have to wait."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    coro.close()
    raise AssertionError("the coroutine suspended instead of resolving at once")


# -- 1. enqueue-only follow-up, durable before it returns, idempotent ids ---------------------


async def test_followup_returns_none_and_is_durable_as_queued_before_it_returns(open_runtime, db_path) -> None:
    busy = Gate(Reply.say("first answer"))
    script = Script(busy, Reply.say("second answer"))
    async with open_runtime(script.model) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        assert await agent.followup("first") is None
        await within(busy.entered.wait())

        mid = MessageId.new()
        result = await agent.followup("second", message_id=mid)

        # The model is still parked in the first turn; another connection already sees the receipt.
        assert result is None
        assert not busy.released.is_set()
        assert agent.status is AgentStatus.RUNNING
        with closing(storekit.connect(db_path)) as conn:
            row = conn.execute(
                "SELECT session_id, delivery, fate, turn_id, cancel_reason FROM inbox WHERE id=?", (mid,)
            ).fetchone()
            queued = conn.execute(
                "SELECT COUNT(*) FROM events WHERE session_id=? AND type=? AND json_extract(data, '$.messageId')=?",
                (sid, EventType.MESSAGE_QUEUED.value, mid),
            ).fetchone()[0]
        assert tuple(row) == (sid, "followup", "queued", None, None)
        assert queued == 1

        busy.release()
        await within(agent.when_idle())
        assert (await inbox_row(rt, mid))["fate"] == Fate.ADMITTED
    script.assert_done()


async def test_repeated_message_id_makes_no_second_message(open_runtime, db_path) -> None:
    busy = Gate(Reply.say("one"))
    script = Script(busy, Reply.say("two"))
    async with open_runtime(script.model) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        await agent.followup("keep me busy")
        await within(busy.entered.wait())

        mid = MessageId.new()
        for _ in range(3):  # repeated while queued
            assert await agent.followup("do it once", message_id=mid) is None
        busy.release()
        await within(agent.when_idle())

        before = counts(db_path)
        await agent.followup("do it once", message_id=mid)  # repeated after admission
        await agent.followup("do it once", message_id=str(mid))  # the same id as a plain string
        assert counts(db_path) == before
        assert agent.status is AgentStatus.IDLE

        queued = [e for e in await events_of(rt, sid, EventType.MESSAGE_QUEUED) if e.data["messageId"] == mid]
        admitted = [e for e in await events_of(rt, sid, EventType.MESSAGE_ADMITTED) if e.data["messageId"] == mid]
        rows = await rt.store.read(lambda c: c.execute("SELECT COUNT(*) FROM inbox WHERE id=?", (mid,)).fetchone())
        turns = await events_of(rt, sid, EventType.TURN_START)
    assert len(queued) == 1
    assert len(admitted) == 1
    assert rows[0] == 1
    assert len(turns) == 2
    script.assert_done()


async def test_same_message_id_in_another_session_conflicts_and_writes_nothing(open_runtime, db_path) -> None:
    model = ScriptedModel([Reply.say("ok")])
    async with open_runtime(model) as rt:
        first, second = await rt.create_session(), await rt.create_session()
        agent1, agent2 = await rt.agent(first), await rt.agent(second)
        mid = MessageId.new()
        await agent1.followup("mine", message_id=mid)
        await within(agent1.when_idle())

        before = counts(db_path)
        with pytest.raises(Conflict, match=f"{mid}.*another session"):
            await agent2.followup("also mine?", message_id=mid)
        with pytest.raises(Conflict):
            await agent2.inject("also mine?", message_id=mid)
        assert counts(db_path) == before
        assert agent2.status is AgentStatus.IDLE
        assert (await inbox_row(rt, mid))["session_id"] == first
    model.assert_done()


# -- 2. fates --------------------------------------------------------------------------------


async def test_every_message_ends_exactly_once_and_records_its_admitting_turn(open_runtime) -> None:
    busy = Gate(Reply.call("noop"))
    script = Script(busy, Reply.say("turn one done"), Reply.say("turn two done"))
    async with open_runtime(script.model) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        ids = {name: MessageId.new() for name in ("a", "b", "c", "s", "x", "d")}
        await agent.followup("a", message_id=ids["a"])
        await within(busy.entered.wait())
        await agent.followup("b", message_id=ids["b"])
        await agent.followup("c", message_id=ids["c"])
        await agent.steer("s", message_id=ids["s"])
        await agent.inject("x", message_id=ids["x"])
        await agent.followup("d", message_id=ids["d"])
        await agent.cancel_message(ids["d"], "changed my mind")
        busy.release()
        await within(agent.when_idle())

        rows = {name: await inbox_row(rt, mid) for name, mid in ids.items()}
        starts = [e.data["turnId"] for e in await events_of(rt, sid, EventType.TURN_START)]
        ends = await events_of(rt, sid, EventType.MESSAGE_ADMITTED, EventType.MESSAGE_CANCELLED)
    script.assert_done()

    assert len(starts) == 2
    turn1, turn2 = starts
    # Turn one admits its waking batch, then steering and context at its next model step.
    assert {n: r["turn_id"] for n, r in rows.items()} == {
        "a": turn1,
        "s": turn1,
        "x": turn1,
        "b": turn2,
        "c": turn2,
        "d": None,
    }
    assert {n: r["fate"] for n, r in rows.items()} == {
        "a": "admitted",
        "s": "admitted",
        "x": "admitted",
        "b": "admitted",
        "c": "admitted",
        "d": "cancelled",
    }
    assert rows["d"]["cancel_reason"] == "changed my mind"
    # Exactly one terminal event per message, agreeing with the row.
    per_message = Counter(e.data["messageId"] for e in ends)
    assert per_message == Counter(ids.values())
    for event in ends:
        name = next(n for n, m in ids.items() if m == event.data["messageId"])
        if event.type == EventType.MESSAGE_ADMITTED:
            assert event.data["turnId"] == rows[name]["turn_id"]
        else:
            assert event.data["reason"] == "changed my mind"


async def test_cancel_of_an_admitted_or_cancelled_message_is_refused_and_writes_nothing(open_runtime, db_path) -> None:
    model = ScriptedModel([Reply.say("ok")])
    async with open_runtime(model) as rt:
        sid, other = await rt.create_session(), await rt.create_session()
        agent = await rt.agent(sid)
        admitted, queued = MessageId.new(), MessageId.new()
        await agent.followup("run", message_id=admitted)
        await within(agent.when_idle())
        await agent.inject("some context", message_id=queued)  # stays queued: context never wakes

        before = counts(db_path)
        with pytest.raises(InvalidTransition, match="already admitted"):
            await agent.cancel_message(admitted)
        with pytest.raises(NotFound):
            await agent.cancel_message(MessageId.new())
        with pytest.raises(NotFound):  # a message of this session, asked of another session's agent
            await (await rt.agent(other)).cancel_message(queued)
        with pytest.raises(InvalidInput, match="reason"):
            await agent.cancel_message(queued, "   ")
        assert counts(db_path) == before

        await agent.cancel_message(queued, "stale")
        cancelled = (await events_of(rt, sid))[-1]
        assert cancelled.type == EventType.MESSAGE_CANCELLED
        assert cancelled.data == {"messageId": queued, "reason": "stale"}
        after_cancel = counts(db_path)
        with pytest.raises(InvalidTransition, match="already cancelled"):
            await agent.cancel_message(queued, "again")
        assert counts(db_path) == after_cancel
        assert (await inbox_row(rt, admitted))["fate"] == Fate.ADMITTED
        assert agent.status is AgentStatus.IDLE
    model.assert_done()


async def test_pending_key_allows_one_queued_message_under_concurrent_enqueues(open_runtime, db_path) -> None:
    busy = Gate(Reply.say("busy"))
    script = Script(busy, Reply.say("continued"))
    async with open_runtime(script.model) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        await agent.followup("keep busy")
        await within(busy.entered.wait())
        before = counts(db_path)

        content = parse_content("continue the goal")
        attempts = [
            rt.store.transact(partial(enqueue, session_id=sid, content=content, pending_key="goal:g1"))
            for _ in range(25)
        ]
        results = await asyncio.gather(*attempts, return_exceptions=True)

        won = [r for r in results if isinstance(r, Enqueued)]
        lost = [r for r in results if isinstance(r, Conflict)]
        assert len(won) == 1 and len(lost) == 24, results
        assert all("goal:g1" in str(exc) for exc in lost)
        # Only the winner wrote: one inbox row and one message/queued event.
        assert counts(db_path) == (before[0] + 1, before[1] + 1)

        busy.release()
        await within(agent.when_idle())
        assert (await inbox_row(rt, won[0].message_id))["fate"] == Fate.ADMITTED
        # Admission frees the key.
        again = await rt.store.transact(
            partial(enqueue, session_id=sid, content=content, delivery=Delivery.CONTEXT, pending_key="goal:g1")
        )
        assert again.created
    script.assert_done()


async def test_waking_followup_supersedes_a_yielding_message_in_the_same_transaction(open_runtime) -> None:
    busy = Gate(Reply.say("busy"))
    script = Script(busy, Reply.say("answered the person"))
    async with open_runtime(script.model) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        await agent.followup("keep busy")
        await within(busy.entered.wait())

        goal = Source(kind=SourceKind.GOAL, ref="goal_1")
        continue_goal = partial(
            enqueue,
            session_id=sid,
            content=parse_content("continue the goal"),
            source=goal,
            pending_key="goal:g1",
            yields_to_followup=True,
        )
        first = await rt.store.transact(continue_goal)
        # A second yielding message does not supersede the first; the key refuses it.
        with pytest.raises(Conflict):
            await rt.store.transact(continue_goal)

        person = MessageId.new()
        await agent.followup("a person asks", message_id=person)
        tail = (await events_of(rt, sid))[-2:]
        queued, cancelled = tail
        assert queued.type == EventType.MESSAGE_QUEUED and queued.data["messageId"] == person
        assert cancelled.type == EventType.MESSAGE_CANCELLED
        assert cancelled.data == {"messageId": first.message_id, "reason": "superseded", "by": person}
        # One commit: adjacent sequence numbers and the transaction's single timestamp.
        assert cancelled.seq == queued.seq + 1
        assert cancelled.at == queued.at
        row = await inbox_row(rt, first.message_id)
        assert (row["fate"], row["cancel_reason"], row["turn_id"]) == ("cancelled", "superseded", None)

        # The cancellation freed the key: the goal may queue its continuation again.
        reissued = await rt.store.transact(continue_goal)
        assert reissued.created and reissued.message_id != first.message_id

        busy.release()
        await within(agent.when_idle())
        assert (await inbox_row(rt, person))["fate"] == Fate.ADMITTED
        assert (await inbox_row(rt, reissued.message_id))["fate"] == Fate.ADMITTED
    script.assert_done()


@pytest.mark.parametrize(
    ("current", "target", "outcome"),
    [
        (Fate.QUEUED, Fate.ADMITTED, Fate.ADMITTED),
        (Fate.QUEUED, Fate.CANCELLED, Fate.CANCELLED),
        (Fate.QUEUED, Fate.QUEUED, "a queued message cannot become queued"),
        (Fate.ADMITTED, Fate.CANCELLED, "already admitted"),
        (Fate.ADMITTED, Fate.ADMITTED, "already admitted"),
        (Fate.ADMITTED, Fate.QUEUED, "already admitted"),
        (Fate.CANCELLED, Fate.ADMITTED, "already cancelled"),
        (Fate.CANCELLED, Fate.CANCELLED, "already cancelled"),
        (Fate.CANCELLED, Fate.QUEUED, "already cancelled"),
    ],
)
def test_transition_fate(current: Fate, target: Fate, outcome: Fate | str) -> None:
    if isinstance(outcome, Fate):
        assert transition_fate(current, target) is outcome
    else:
        with pytest.raises(InvalidTransition, match=outcome):
            transition_fate(current, target)


# -- 4. steer and inject ---------------------------------------------------------------------


async def test_steer_and_context_join_the_running_turn_at_its_next_model_step(open_runtime) -> None:
    thinking = Gate(Reply.call("noop"))
    script = Script(thinking, Reply.say("done, in blue"))
    async with open_runtime(script.model) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        await agent.followup("paint the fence")
        await within(thinking.entered.wait())
        await agent.steer("use the blue paint")
        await agent.inject("the fence is 10 m long")
        thinking.release()
        await within(agent.when_idle())

        starts = await events_of(rt, sid, EventType.TURN_START)
        history = await events_of(
            rt, sid, EventType.MESSAGE_ADMITTED, EventType.ASSISTANT_MESSAGE, EventType.TOOL_RESULT
        )
    script.assert_done()
    first_call, second_call = script.model.calls
    assert user_texts(first_call.request) == ["paint the fence"]
    assert user_texts(second_call.request) == ["paint the fence", "use the blue paint", "the fence is 10 m long"]
    assert len(starts) == 1
    turn = starts[0].data["turnId"]
    assert [(e.type, e.data.get("delivery")) for e in history] == [
        (EventType.MESSAGE_ADMITTED, "followup"),
        (EventType.ASSISTANT_MESSAGE, None),
        (EventType.TOOL_RESULT, None),
        (EventType.MESSAGE_ADMITTED, "steer"),
        (EventType.MESSAGE_ADMITTED, "context"),
        (EventType.ASSISTANT_MESSAGE, None),
    ]
    assert {e.data["turnId"] for e in history} == {turn}


async def test_steer_wakes_an_idle_agent(open_runtime) -> None:
    model = ScriptedModel([Reply.say("steered")])
    async with open_runtime(model) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        assert agent.status is AgentStatus.IDLE
        assert await agent.steer("change course") is None
        # The enqueue's own commit flipped the status: no idle can be observed before the turn.
        assert agent.status is AgentStatus.RUNNING
        await within(agent.when_idle())
        starts = await events_of(rt, sid, EventType.TURN_START)
        ends = await events_of(rt, sid, EventType.TURN_END)
    model.assert_done()
    assert user_texts(model.calls[0].request) == ["change course"]
    assert len(starts) == 1 and ends[0].data["reason"] == "end_turn"


async def test_inject_never_wakes_an_idle_agent_and_joins_the_next_turn(open_runtime, db_path) -> None:
    model = ScriptedModel([Reply.say("first"), Reply.say("second")])
    async with open_runtime(model) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        await agent.followup("warm up")
        idle = await within(agent.when_idle())

        ctx = MessageId.new()
        assert await agent.inject("the build server is down", message_id=ctx) is None
        assert agent.status is AgentStatus.IDLE
        assert agent.status_seq == idle.seq
        after = await rt.store.events_after(sid, idle.seq)
        assert [e.type for e in after] == [EventType.MESSAGE_QUEUED]
        assert resolve_now(agent.when_idle()) == idle
        assert (await inbox_row(rt, ctx))["fate"] == Fate.QUEUED
        assert model.call_count == 1

        await agent.followup("what should I do?")
        await within(agent.when_idle())
        starts = await events_of(rt, sid, EventType.TURN_START)
        row = await inbox_row(rt, ctx)
    model.assert_done()
    assert len(starts) == 2
    assert row["fate"] == Fate.ADMITTED and row["turn_id"] == starts[1].data["turnId"]
    assert user_texts(model.calls[1].request) == ["warm up", "the build server is down", "what should I do?"]


# -- 5. when_idle ----------------------------------------------------------------------------


async def test_when_idle_waits_for_whole_agent_idle_including_work_queued_while_waiting(open_runtime) -> None:
    one, two = Gate(Reply.say("one")), Gate(Reply.say("two"))
    script = Script(one, two)
    async with open_runtime(script.model) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        await agent.followup("first")
        await within(one.entered.wait())
        waiters = [asyncio.create_task(agent.when_idle()) for _ in range(3)]
        await agent.followup("second, sent while they wait")

        one.release()
        await within(two.entered.wait())
        # Turn one has ended durably, yet the agent never became idle: the waiters still wait.
        assert len(await events_of(rt, sid, EventType.TURN_END)) == 1
        assert not any(w.done() for w in waiters)
        assert agent.status is AgentStatus.RUNNING

        two.release()
        snaps = await within(asyncio.gather(*waiters))
        events = await events_of(rt, sid)
    script.assert_done()

    assert len(set(snaps)) == 1
    snap = snaps[0]
    assert snap.status is AgentStatus.IDLE
    last = events[-1]
    assert (last.seq, last.type, last.data["status"]) == (snap.seq, EventType.STATUS, "idle")
    statuses = [e.data["status"] for e in events if e.type == EventType.STATUS]
    assert statuses == ["running", "idle"]
    assert [e.type for e in events].count(EventType.TURN_END) == 2


async def test_when_idle_resolves_at_once_when_idle(open_runtime) -> None:
    model = ScriptedModel([Reply.say("done")])
    async with open_runtime(model) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        fresh = resolve_now(agent.when_idle())
        assert fresh == StatusSnapshot(AgentStatus.IDLE, 0)

        await agent.followup("go")
        first = await within(agent.when_idle())
        again = [resolve_now(agent.when_idle()) for _ in range(3)]
        last_status = (await events_of(rt, sid, EventType.STATUS))[-1]
    model.assert_done()
    assert again == [first] * 3
    assert first.seq == last_status.seq and last_status.data["status"] == "idle"


# -- 10. bad input ---------------------------------------------------------------------------

_OVERHEAD = len(content_json([TextBlock(text="")]).encode())


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("", "text is empty"),
        ("  \n\t", "text is empty"),
        ([], "at least one block"),
        ([{"type": "text", "text": ""}], "text is empty"),
        ([{"type": "tool_use", "id": "call_1", "name": "noop", "input": {}}], "text blocks only, not tool_use"),
        ([{"type": "tool_result", "tool_use_id": "call_1", "content": "ok"}], "text blocks only, not tool_result"),
        ([{"type": "image", "data": "iVBORw0KGgo="}], "at 0: Input tag 'image'"),
        ([{"type": "text"}], "Field required"),
        ([{"type": "text", "text": "hi", "colour": "red"}], "Extra inputs are not permitted"),
        (["just a string in a list"], "at 0:"),
        (42, "valid list"),
        (None, "valid list"),
        (b"raw bytes", "valid list"),
        ({"text": "a dict"}, "valid list"),
        ("x" * (MAX_MESSAGE_BYTES - _OVERHEAD + 1), "over the limit of 1048576"),
        ("é" * (MAX_MESSAGE_BYTES // 2), "over the limit"),  # bytes count, not characters
    ],
    ids=lambda v: repr(v)[:30],
)
async def test_invalid_content_is_rejected_and_writes_nothing(open_runtime, db_path, content, problem) -> None:
    model = ScriptedModel([])
    async with open_runtime(model) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        before = counts(db_path)
        for send in (agent.followup, agent.steer, agent.inject):
            with pytest.raises(InvalidInput, match="invalid content") as err:
                await send(content)
            assert problem in str(err.value)
        with pytest.raises(InvalidInput, match="invalid content"):
            await agent.enqueue(content, delivery="followup")
        assert counts(db_path) == before
        assert agent.status is AgentStatus.IDLE
    model.assert_done()


def test_content_size_limit_is_inclusive() -> None:
    at_limit = "x" * (MAX_MESSAGE_BYTES - _OVERHEAD)
    assert parse_content(at_limit) == [TextBlock(text=at_limit)]
    with pytest.raises(InvalidInput, match=f"{MAX_MESSAGE_BYTES + 1} bytes"):
        parse_content(at_limit + "x")


@pytest.mark.parametrize("delivery", ["shout", "FOLLOWUP", "", None, 3])
async def test_unknown_delivery_is_rejected_and_writes_nothing(open_runtime, db_path, delivery) -> None:
    model = ScriptedModel([])
    async with open_runtime(model) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        before = counts(db_path)
        with pytest.raises(InvalidInput, match=r"unknown delivery .*expected one of followup, steer, context"):
            await agent.enqueue("hello", delivery=delivery)
        assert counts(db_path) == before
        assert agent.status is AgentStatus.IDLE
    model.assert_done()


_GOOD = MessageId.new()


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("msg_bad", "expected 'msg_' and 26 Crockford base32 characters"),
        ("", "must start with 'msg_'"),
        ("ses_" + _GOOD[4:], "must start with 'msg_'"),
        (" " + _GOOD, "must start with 'msg_'"),
        ("msg_" + _GOOD[4:].lower(), "Crockford base32"),
        (_GOOD + "0", "26 Crockford base32"),
        (_GOOD[:-1], "26 Crockford base32"),
        ("msg_" + "U" * 26, "Crockford base32"),
        ("msg_8" + "0" * 25, "out of range"),
        (123, "must be a string, got int"),
        (None, "must be a string, got NoneType"),
    ],
    ids=lambda v: repr(v)[:30],
)
def test_malformed_message_id_is_rejected(value: object, problem: str) -> None:
    with pytest.raises(InvalidInput, match="MessageId") as err:
        MessageId.parse(value)
    assert problem in str(err.value)


def test_well_formed_message_ids_parse() -> None:
    mid = MessageId.new()
    assert MessageId.parse(str(mid)) == mid
    assert isinstance(MessageId.parse(str(mid)), MessageId)
    assert MessageId.new() > mid  # ids sort by time


async def test_malformed_message_id_is_rejected_by_every_entry_point_and_writes_nothing(open_runtime, db_path) -> None:
    model = ScriptedModel([])
    async with open_runtime(model) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        before = counts(db_path)
        for send in (agent.followup, agent.steer, agent.inject):
            with pytest.raises(InvalidInput, match="malformed MessageId 'msg_bad'"):
                await send("hello", message_id="msg_bad")
        with pytest.raises(InvalidInput, match="malformed MessageId"):
            await agent.enqueue("hello", message_id="ses_" + _GOOD[4:])
        with pytest.raises(InvalidInput, match="malformed MessageId"):
            await agent.cancel_message("msg_bad")
        assert counts(db_path) == before
        assert agent.status is AgentStatus.IDLE
    model.assert_done()


async def test_enqueue_to_an_unknown_session_writes_nothing(open_runtime, db_path) -> None:
    async with open_runtime(ScriptedModel([])) as rt:
        await rt.create_session()
        before = counts(db_path)
        with pytest.raises(NotFound, match="no session"):
            await rt.store.transact(partial(enqueue, session_id="ses_" + _GOOD[4:], content=parse_content("hello")))
        assert counts(db_path) == before
