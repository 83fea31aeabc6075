"""Invariants 3 and 5: events are durable, per-session, gap-free facts, published only after commit.

Pinned here:

* each session's sequence is 1..n with no gap and no duplicate, while several sessions are
  written concurrently (and in one transaction), and it survives closing and reopening the store;
* every status transition is an event: ``running`` and ``idle`` alternate, never twice in a row,
  and ``Agent.status`` / ``status_seq`` change only at those events;
* hub listeners and subscribers get an event only once it is committed (a second
  connection already sees its row), in sequence order, before the writer's ``await`` returns;
* a subscriber that disconnects at random points and resumes from its last sequence number while
  another task keeps appending sees every event exactly once, in order;
* subscribing from 0 yields the stored history (several pages) then live events, no duplicates;
* a subscriber of one session sees nothing of another;
* a rolled-back transaction publishes nothing and consumes no sequence number.

The only stand-in is the shipped scripted model; the store is a real SQLite file or a real
PostgreSQL database (every test runs on both).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest
import storekit
from pydantic import BaseModel
from storekit import Location

from agent import (
    AgentStatus,
    Event,
    EventType,
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
    Tx,
    enqueue,
    parse_content,
)
from agent.driver import Agent

#: The store contract: every test here runs on SQLite and on PostgreSQL.
pytestmark = pytest.mark.both_stores

TIMEOUT = 10.0
SEED = 5_2024
NOTE = "test/note"  # a kind of our own, as other packages add theirs
END = "test/end"  # a sentinel: the last event a reader waits for


# -- helpers -------------------------------------------------------------------------------------


class SpinArgs(BaseModel):
    """How many event-loop yields to spin for."""

    n: int = 0


async def _spin(args: SpinArgs, ctx: ToolContext) -> str:
    await yields(args.n)
    return f"spun {args.n}"


def spin_tool() -> FunctionTool[SpinArgs]:
    return FunctionTool("spin", "yields to the event loop n times", SpinArgs, _spin, repeat_safe=True)


async def yields(n: int) -> None:
    """Let the event loop run ``n`` rounds (no wall-clock waiting)."""
    for _ in range(n):
        await asyncio.sleep(0)


def busy_model(seed: int) -> ScriptedModel:
    """Answers after a few loop rounds; often asks for one or two tool calls first."""
    rng = random.Random(seed)

    async def rule(request: ModelRequest) -> Reply:
        await yields(rng.randrange(0, 5))
        last = request.messages[-1]
        text = "".join(b.text for b in last.content if isinstance(b, TextBlock))
        if text.startswith("fail"):
            return Reply.fail(ModelErrorKind.BAD_REQUEST, "scripted non-retryable failure")
        if last.role == "user" and rng.random() < 0.6:
            calls = [ToolCall("spin", {"n": rng.randrange(0, 8)}) for _ in range(rng.randint(1, 2))]
            return Reply(tool_calls=calls)
        return Reply.say(f"ok {rng.randrange(1000)}")

    return ScriptedModel(rule, record=False)


async def idle(agent: Agent) -> int:
    snap = await asyncio.wait_for(agent.when_idle(), TIMEOUT)
    assert snap.status is AgentStatus.IDLE
    return snap.seq


async def keep_busy(agent: Agent, rng: random.Random, n: int, tag: str) -> None:
    """Send ``n`` follow-ups (some steers) at random moments, then wait for idle."""
    for i in range(n):
        await yields(rng.randrange(0, 25))
        if rng.random() < 0.2:
            await agent.steer(f"{tag} steer {i}")
        else:
            await agent.followup(f"{tag} {i}")
    await idle(agent)


async def emit(rt: Runtime, sid: str, type: str = NOTE, **data: Any) -> Event:
    return await rt.store.transact(lambda tx: tx.emit(sid, type, data))


async def stored(rt: Runtime, sid: str) -> list[Event]:
    return await rt.store.events_after(sid, 0, limit=10**6)


def assert_gap_free(events: list[Event], sid: str) -> None:
    assert events, "no events"
    assert all(e.session_id == sid for e in events)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))


async def read_until_end(rt: Runtime, sid: str, after: int = 0, mark: Any = None, **kw: Any) -> list[Event]:
    """Subscribe from ``after`` and collect up to and including the ``END`` sentinel (with ``mark``)."""
    got: list[Event] = []
    async with contextlib.aclosing(rt.store.hub.subscribe(rt.store, sid, after, **kw)) as events:
        async for event in events:
            got.append(event)
            if event.type == END and event.data.get("mark") == mark:
                break
    return got


def same(a: Event, b: Event) -> bool:
    return (a.session_id, a.seq, a.type, a.data, a.at) == (b.session_id, b.seq, b.type, b.data, b.at)


def second_connection(location: Location) -> contextlib.closing[Any]:
    """A connection of its own to the test's store (a fresh process's view of it)."""
    return contextlib.closing(storekit.connect(location))


@contextlib.asynccontextmanager
async def runtime(open_runtime: Any, seed: int = SEED, **kw: Any) -> AsyncIterator[Runtime]:
    async with open_runtime(busy_model(seed), tools=[spin_tool()], **kw) as rt:
        yield rt


# -- sequences -----------------------------------------------------------------------------------


async def test_each_session_has_a_gap_free_durable_sequence_across_interleaved_sessions(open_runtime, db_path) -> None:
    rng = random.Random(SEED)
    counts: dict[str, int] = {}
    async with runtime(open_runtime) as rt:
        sids = [await rt.create_session() for _ in range(4)]
        agents = [await rt.agent(s) for s in sids]
        # several sessions written concurrently: turns, tool calls, steering
        await asyncio.wait_for(
            asyncio.gather(*(keep_busy(a, rng, 15, f"s{i}") for i, a in enumerate(agents))), TIMEOUT * 3
        )

        # and in one transaction, alternating between sessions
        def interleaved(tx: Tx) -> list[Event]:
            return [tx.emit(sids[i % 4], NOTE, {"i": i}) for i in range(12)]

        written = await rt.store.transact(interleaved)
        for i, event in enumerate(written):
            peers = [e for e in written if e.session_id == event.session_id]
            assert event.seq == peers[0].seq + peers.index(event)
            assert event.data == {"i": i}
        for sid in sids:
            events = await stored(rt, sid)
            assert_gap_free(events, sid)
            assert events[0].type == EventType.SESSION_CREATED
            assert (await rt.store.session_state(sid)).last_seq == len(events)
            counts[sid] = len(events)
        assert min(counts.values()) > 30  # real traffic in every session

    # durable: a fresh process view of the file has the same rows, and the sequence continues
    with second_connection(db_path) as conn:
        for sid, n in counts.items():
            seqs = [r["seq"] for r in conn.execute("SELECT seq FROM events WHERE session_id=? ORDER BY seq", (sid,))]
            assert seqs == list(range(1, n + 1))
    async with runtime(open_runtime, seed=SEED + 1) as rt:
        for sid, n in counts.items():
            agent = await rt.agent(sid)
            await agent.followup("after reopening")
            await idle(agent)
            events = await stored(rt, sid)
            assert_gap_free(events, sid)
            assert len(events) > n
            assert events[n].type == EventType.MESSAGE_QUEUED  # the next fact got seq n+1


# -- status --------------------------------------------------------------------------------------


async def test_every_status_transition_is_an_event_and_they_alternate(open_runtime, db_path) -> None:
    rng = random.Random(SEED + 2)
    async with runtime(open_runtime, seed=SEED + 2) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        assert agent.status is AgentStatus.IDLE
        assert agent.status_seq == 0
        observed: list[str] = []

        def check(event: Event) -> None:
            # The runtime's own listener updated the agent first; its status moves only here.
            if event.session_id != sid:
                return
            if event.type == EventType.STATUS:
                ok = agent.status == event.data["status"] and agent.status_seq == event.seq
            else:
                ok = agent.status_seq < event.seq and agent.status == (observed[-1] if observed else "idle")
            if event.type == EventType.STATUS:
                observed.append(event.data["status"])
            if not ok:
                observed.append(f"MISMATCH at {event.seq}")

        rt.store.hub.add_listener(check)
        snaps: list[int] = []
        for i in range(8):
            await agent.followup(f"fail {i}" if i % 3 == 2 else f"round {i}")
            if i % 2:
                await asyncio.gather(*(agent.followup(f"round {i}.{j}") for j in range(3)))
            snaps.append(await idle(agent))
        await asyncio.wait_for(keep_busy(agent, rng, 20, "busy"), TIMEOUT)
        snaps.append(agent.status_seq)
        # a steer to an idle agent wakes it; an injected context message does not
        await agent.inject("context only")
        assert agent.status is AgentStatus.IDLE
        await agent.steer("steer while idle")
        snaps.append(await idle(agent))

        events = await stored(rt, sid)
        statuses = [e for e in events if e.type == EventType.STATUS]
        values = [e.data["status"] for e in statuses]
        assert values[0] == "running"
        assert values[-1] == "idle"
        assert all(a != b for a, b in itertools.pairwise(values))  # never twice in a row
        assert observed == values  # the agent's status changed exactly at these events
        idle_seqs = {e.seq for e in statuses if e.data["status"] == "idle"}
        assert set(snaps) <= idle_seqs  # when_idle() reports the idle event's sequence number
        assert agent.status_seq == statuses[-1].seq
        state = await rt.store.session_state(sid)
        assert (state.status, state.status_seq) == ("idle", statuses[-1].seq)
        turn_ends = [e for e in events if e.type == EventType.TURN_END]
        assert {e.data["reason"] for e in turn_ends} >= {"end_turn", "error"}
        assert len(idle_seqs) >= 10


# -- live delivery -------------------------------------------------------------------------------


async def test_listeners_and_subscribers_get_events_only_after_commit_in_order(open_runtime, db_path) -> None:
    rng = random.Random(SEED + 3)
    async with runtime(open_runtime, seed=SEED + 3) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        with second_connection(db_path) as conn:
            problems: list[str] = []
            heard: list[Event] = []

            def committed(event: Event) -> bool:
                row = conn.execute(
                    "SELECT type, data FROM events WHERE session_id=? AND seq=?", (event.session_id, event.seq)
                ).fetchone()
                return row is not None and row["type"] == event.type and json.loads(row["data"]) == event.data

            def listener(event: Event) -> None:
                if event.session_id != sid:
                    return
                if not committed(event):
                    problems.append(f"listener got {event.seq} before its commit")
                heard.append(event)

            rt.store.hub.add_listener(listener)

            async def subscriber() -> list[Event]:
                got: list[Event] = []
                async with contextlib.aclosing(rt.store.hub.subscribe(rt.store, sid, 0)) as events:
                    async for event in events:
                        if not committed(event):
                            problems.append(f"subscriber got {event.seq} before its commit")
                        got.append(event)
                        if event.type == END:
                            return got
                return got

            reader = asyncio.create_task(subscriber())
            await keep_busy(agent, rng, 15, "live")
            # the writer's await returns only after its events reached the listeners
            note = await emit(rt, sid, k=1)
            assert heard[-1].seq == note.seq
            assert same(heard[-1], note)
            await emit(rt, sid, END)
            got = await asyncio.wait_for(reader, TIMEOUT)
            assert problems == []
            everything = await stored(rt, sid)
            assert_gap_free(got, sid)
            assert all(same(a, b) for a, b in zip(got, everything, strict=True))
            # the listener was registered after session/created; from then on, all, in order
            assert [e.seq for e in heard] == list(range(heard[0].seq, everything[-1].seq + 1))


async def test_resuming_after_disconnects_sees_every_event_once_in_order(open_runtime, db_path) -> None:
    """Item 7: disconnect at random points, resume from the last sequence number, lose nothing."""
    rng = random.Random(SEED + 4)
    async with runtime(open_runtime, seed=SEED + 4) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        got: list[Event] = []
        cycles = missed_while_away = 0

        async def reader() -> None:
            nonlocal cycles, missed_while_away
            last = 0
            while True:
                take = rng.randint(1, 8)
                async with contextlib.aclosing(rt.store.hub.subscribe(rt.store, sid, last)) as events:
                    async for event in events:
                        got.append(event)
                        last = event.seq
                        take -= 1
                        if event.type == END:
                            return
                        if take == 0:
                            break  # disconnect mid-stream
                cycles += 1
                await yields(rng.randrange(0, 30))  # away while the session keeps appending
                if (await rt.store.session_state(sid)).last_seq > last:
                    missed_while_away += 1

        task = asyncio.create_task(reader())
        await asyncio.wait_for(keep_busy(agent, rng, 80, "busy"), TIMEOUT * 2)
        await emit(rt, sid, END)
        await asyncio.wait_for(task, TIMEOUT)
        everything = await stored(rt, sid)
        assert_gap_free(got, sid)  # exactly once each, in order
        assert len(got) == len(everything)
        assert all(same(a, b) for a, b in zip(got, everything, strict=True))
        assert cycles >= 30
        assert missed_while_away >= 10  # resumes really had to catch up on events appended meanwhile


async def test_subscribing_from_zero_yields_history_then_live_events_without_duplicates(open_runtime, db_path) -> None:
    rng = random.Random(SEED + 5)
    async with runtime(open_runtime, seed=SEED + 5) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        await keep_busy(agent, rng, 3, "history")

        def many(tx: Tx) -> None:  # more history than one page of the subscription's catch-up read
            for i in range(2500):
                tx.emit(sid, NOTE, {"i": i})

        await rt.store.transact(many)
        history = len(await stored(rt, sid))
        caught_up_at: list[int] = []

        async def on_caught_up() -> None:
            # right between the stored read and the live phase: append more
            caught_up_at.append((await rt.store.session_state(sid)).last_seq)
            await agent.followup("at the boundary")

        busy = asyncio.create_task(keep_busy(agent, rng, 10, "live"))
        reader = asyncio.create_task(read_until_end(rt, sid, 0, on_caught_up=on_caught_up))
        await asyncio.wait_for(busy, TIMEOUT)
        await emit(rt, sid, END)
        got = await asyncio.wait_for(reader, TIMEOUT)
        everything = await stored(rt, sid)
        assert_gap_free(got, sid)
        assert len(got) == len(everything) > history + 10
        assert all(same(a, b) for a, b in zip(got, everything, strict=True))
        assert got[0].type == EventType.SESSION_CREATED
        assert len(caught_up_at) == 1 and caught_up_at[0] >= history


async def test_the_last_event_committed_while_a_subscriber_catches_up_is_not_missed(open_runtime, db_path) -> None:
    """One final event, committed k loop rounds after a subscription starts, with nothing after it.

    Sweeping k lands the commit before, during and after the subscriber's catch-up read, where a
    subscriber that registered for live events too late would wait for it forever.
    """
    async with runtime(open_runtime) as rt:
        sid = await rt.create_session()

        def many(tx: Tx) -> None:
            for i in range(300):
                tx.emit(sid, NOTE, {"i": i})

        await rt.store.transact(many)
        for k in range(40):
            after = (await rt.store.session_state(sid)).last_seq - rng_back(k)
            reader = asyncio.create_task(read_until_end(rt, sid, after, mark=k))
            await yields(k)
            end = await emit(rt, sid, END, mark=k)
            got = await asyncio.wait_for(reader, TIMEOUT)
            assert [e.seq for e in got] == list(range(after + 1, end.seq + 1))
            assert same(got[-1], end)


def rng_back(k: int) -> int:
    """How far back from the end a subscription starts (varies the catch-up read's size)."""
    return (k * 37) % 250


async def test_a_subscriber_sees_nothing_of_another_session(open_runtime, db_path) -> None:
    rng = random.Random(SEED + 6)
    async with runtime(open_runtime, seed=SEED + 6) as rt:
        a, b = await rt.create_session(), await rt.create_session()
        agent_a, agent_b = await rt.agent(a), await rt.agent(b)
        readers = {sid: asyncio.create_task(read_until_end(rt, sid)) for sid in (a, b)}
        late_reader = asyncio.create_task(read_until_end(rt, a, 0))
        await asyncio.wait_for(
            asyncio.gather(keep_busy(agent_a, rng, 10, "a"), keep_busy(agent_b, rng, 10, "b")), TIMEOUT * 2
        )
        await emit(rt, b, END)  # b ends first: a's readers must not stop on it
        await emit(rt, b, NOTE, after="b's end")
        await emit(rt, a, END)
        for sid in (a, b):
            got = await asyncio.wait_for(readers[sid], TIMEOUT)
            assert {e.session_id for e in got} == {sid}
            everything = await stored(rt, sid)
            assert [e.seq for e in got] == [e.seq for e in everything if e.seq <= got[-1].seq]
        got_late = await asyncio.wait_for(late_reader, TIMEOUT)
        assert {e.session_id for e in got_late} == {a}
        assert_gap_free(got_late, a)


# -- rollback ------------------------------------------------------------------------------------


class Boom(RuntimeError):
    """Raised by a transaction function on purpose."""


async def test_a_rolled_back_transaction_publishes_nothing_and_consumes_no_sequence_number(
    open_runtime, db_path
) -> None:
    async with runtime(open_runtime) as rt:
        sid, other = await rt.create_session(), await rt.create_session()
        agent = await rt.agent(sid)
        await agent.followup("one turn first")
        await idle(agent)
        before = await stored(rt, sid)
        state = await rt.store.session_state(sid)
        heard: list[Event] = []
        rt.store.hub.add_listener(heard.append)
        live = rt.store.hub.open(None)  # a live queue for every session

        def emits_then_raises(tx: Tx) -> None:
            tx.emit(sid, NOTE, {"doomed": 1})
            tx.emit(other, NOTE, {"doomed": 2})
            tx.emit(sid, NOTE, {"doomed": 3})
            raise Boom("roll it back")

        mid = MessageId.new()

        def enqueues_then_raises(tx: Tx) -> None:
            # a waking message and its status flip, rolled back together
            enqueue(tx, sid, parse_content("never queued"), message_id=mid)
            raise Boom("roll this back too")

        for fn in (emits_then_raises, enqueues_then_raises):
            with pytest.raises(Boom):
                await rt.store.transact(fn)
        assert heard == []
        assert live.queue.empty()
        assert await stored(rt, sid) == before
        assert (await rt.store.session_state(sid)) == state
        assert agent.status is AgentStatus.IDLE
        assert await rt.store.read(lambda c: c.execute("SELECT 1 FROM inbox WHERE id=?", (mid,)).fetchone()) is None

        kept = await emit(rt, sid, kept=True)
        assert kept.seq == state.last_seq + 1  # no sequence number was consumed
        kept_other = await emit(rt, other, kept=True)
        assert kept_other.seq == 2  # after session/created only
        assert [e.seq for e in heard] == [kept.seq, kept_other.seq]
        assert [live.queue.get_nowait().seq for _ in range(2)] == [kept.seq, kept_other.seq]
        live.close()
        assert_gap_free(await stored(rt, sid), sid)
        # and the agent still works: the rolled-back enqueue left no trace to trip over
        await agent.followup("after the rollback")
        await idle(agent)
        assert_gap_free(await stored(rt, sid), sid)
