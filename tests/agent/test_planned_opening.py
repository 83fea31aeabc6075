"""A turn opened in the write that reserves its first call (issue 30: fewer round trips per round), on
both stores.

The driver plans a turn on the session's state as this node last committed it (the queued messages
its own writes left) and opens it in the write that reserves the turn's first call, checked there:
the same messages, the same numbers. Pins:

* a planned turn costs one transaction fewer than one opened on its own, with the same events in the
  same order, and the model sees an admitted message only once its admission is durable (read
  through another connection);
* a follow-up queued between the plan and that write — by this node, or on PostgreSQL by another —
  rolls the write back whole: no reservation made, nothing held by the guard; the turn opens again on
  the queue read and admits both messages, which the model's first request holds;
* a message cancelled between the plan and that write: the same rollback, then nothing wakes — no
  turn, no call, and the model never sees it;
* an interrupt that lands before that write still ends the turn it planned ``cancelled``; a stop
  that lands there opens nothing (the message stays queued for the next start);
* a write handed to the driver (:meth:`agent.driver.Agent.open_after`: a goal's decision) commits
  first in that same write, and its caller gets its result; one that raises writes nothing and its
  caller gets its error; one the driver never takes (it stopped) gets
  :class:`~agent.errors.StaleOpening`, so that its caller commits it itself.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from contextlib import closing
from typing import Any

import pytest
import storekit
from storekit import Location

from agent import Conflict, Delivery, EventType, Reply, ScriptedModel, Source, StaleOpening
from agent import opening as opening_module
from agent.ids import MessageId
from agent.inbox import enqueue, queued_row
from agent.messages import TextBlock, parse_content
from agent.models.base import ModelRequest
from agent.store import Store

pytestmark = pytest.mark.both_stores

WAIT = 10.0


class Racing(ScriptedModel):
    """A scripted model that runs :attr:`race` once, when the next step begins: after the driver
    planned the turn, before the write that opens it (the step asks for the window first)."""

    race: Callable[[], Awaitable[None]] | None = None

    async def discover_window(self) -> None:
        race, self.race = self.race, None
        if race is not None:
            await race()


def user_texts(request: ModelRequest) -> list[str]:
    return [
        b.text for m in request.messages if m.role == "user" for b in m.content if isinstance(b, TextBlock) and b.text
    ]


def admitted_texts(location: Location) -> set[str]:
    """The text of every admitted message, read through a connection of its own (what is durable)."""
    with closing(storekit.connect(location)) as conn:
        rows = conn.execute("SELECT data FROM events WHERE type=?", (EventType.MESSAGE_ADMITTED.value,)).fetchall()
    return {b["text"] for (data,) in rows for b in json.loads(data)["content"] if b.get("type") == "text"}


async def idle(agent: Any) -> None:
    async with asyncio.timeout(WAIT):
        await agent.when_idle()


async def warmed(rt: Any) -> tuple[str, Any]:
    """A session whose first turn ran (it loads the view: opened on its own). Its message is queued
    before the driver starts, so no wake of it is left over to open the next turn unplanned."""
    sid = await rt.create_session()
    await rt.store.transact(lambda tx: enqueue(tx, sid, parse_content("first")), session=sid)
    agent = await rt.agent(sid)
    await idle(agent)
    assert agent.view() is not None
    return sid, agent


async def counted(store: Store, sid: str, work: Callable[[], Awaitable[None]]) -> int:
    """How many transactions on ``sid`` the store runs while ``work`` runs."""
    count = 0
    transact = store.transact

    async def counting(fn: Any, session: str | None = None, **kw: Any) -> Any:
        nonlocal count
        count += session == sid
        return await transact(fn, session=session, **kw)

    store.transact = counting  # type: ignore[method-assign]
    try:
        await work()
    finally:
        store.transact = transact  # type: ignore[method-assign]
    return count


def turn_kinds(events: list[Any], start: int) -> list[str]:
    return [e.type for e in events if e.seq >= start]


async def test_a_planned_turn_costs_a_transaction_less_and_the_model_sees_only_what_is_durable(
    open_runtime, db_path, monkeypatch
) -> None:
    durable: list[bool] = []

    def answer(request: ModelRequest) -> Reply:
        durable.append(set(user_texts(request)) <= admitted_texts(db_path))
        return Reply.say("done")

    async with open_runtime(ScriptedModel(answer)) as rt:
        sid, agent = await warmed(rt)
        counts, kinds = [], []
        for planned in (True, False):
            if not planned:
                monkeypatch.setattr(opening_module, "plan_opening", lambda state, then=(): None)
            start = (await rt.store.session_state(sid)).last_seq + 1

            async def turn(text: str = f"planned {planned}") -> None:
                await agent.followup(text)
                await idle(agent)

            counts.append(await counted(rt.store, sid, turn))
            kinds.append(turn_kinds(await rt.store.events_after(sid, 0), start))
    assert durable == [True, True, True]
    assert counts[0] == counts[1] - 1
    assert kinds[0] == kinds[1]
    assert kinds[0][kinds[0].index("turn/start") :][:2] == ["turn/start", "message/admitted"]


async def test_a_follow_up_queued_after_the_plan_reopens_the_turn_with_both(open_runtime, db_path) -> None:
    model = Racing([Reply.say("one"), Reply.say("both")])
    async with open_runtime(model) as rt:
        sid, agent = await warmed(rt)
        other = await Store.open(db_path, connections=1) if storekit.is_postgres(db_path) else None

        async def race() -> None:
            writer = other or rt.store  # PostgreSQL: another node's write, unknown to this one
            await writer.transact(lambda tx: enqueue(tx, sid, parse_content("second")), session=sid)

        model.race = race
        try:
            await agent.followup("A")
            async with asyncio.timeout(WAIT):
                while len(model.calls) < 2 or agent.status.value != "idle":
                    await agent.when_idle()
        finally:
            if other is not None:
                await other.close()
        events = await rt.store.events_after(sid, 0)
        calls = await rt.store.read(
            lambda conn: conn.execute("SELECT COUNT(*) FROM model_calls WHERE session_id=?", (sid,)).fetchone()[0]
        )
        reserved = agent.guard.reserved_tokens
    model.assert_done()
    assert user_texts(model.calls[1].request)[-2:] == ["A", "second"]
    assert [e.type for e in events].count("turn/start") == 2
    second = [e for e in events if e.type == "message/admitted"][1:]
    assert [e.data["content"][0]["text"] for e in second] == ["A", "second"]
    assert int(calls) == 2  # one reservation per turn: the rolled-back one left nothing
    assert reserved == 0


async def test_a_message_cancelled_after_the_plan_is_never_seen(open_runtime) -> None:
    model = Racing([Reply.say("one"), Reply.say("two")])
    async with open_runtime(model) as rt:
        sid, agent = await warmed(rt)
        queued = [MessageId.new()]

        async def race() -> None:
            await agent.cancel_message(queued[0])

        model.race = race
        await agent.followup("never", message_id=queued[0])
        await idle(agent)
        await agent.followup("then this")  # a turn after: the driver is done with the rolled-back one
        await idle(agent)
        events = await rt.store.events_after(sid, 0)
        reserved = agent.guard.reserved_tokens
    model.assert_done()
    assert [user_texts(c.request) for c in model.calls] == [["first"], ["first", "then this"]]
    assert [e.type for e in events].count("turn/start") == 2
    assert [e.data["messageId"] for e in events if e.type == "message/cancelled"] == queued
    assert reserved == 0


async def test_an_interrupt_before_the_opening_write_ends_the_planned_turn_cancelled(open_runtime) -> None:
    model = Racing([Reply.say("one")])
    async with open_runtime(model) as rt:
        sid, agent = await warmed(rt)
        interrupts: list[asyncio.Task[None]] = []

        async def race() -> None:
            interrupts.append(asyncio.ensure_future(agent.interrupt()))
            await asyncio.Event().wait()  # the step waits here until the interrupt cancels it

        model.race = race
        await agent.followup("stop me")
        await idle(agent)
        async with asyncio.timeout(WAIT):
            await interrupts[0]
        events = await rt.store.events_after(sid, 0)
        reserved = agent.guard.reserved_tokens
    model.assert_done()
    assert model.call_count == 1
    ends = [e.data for e in events if e.type == "turn/end"]
    assert [e["reason"] for e in ends] == ["end_turn", "cancelled"]
    admitted = [e.data["content"][0]["text"] for e in events if e.type == "message/admitted"]
    assert admitted == ["first", "stop me"]
    assert reserved == 0


async def test_a_stop_before_the_opening_write_opens_nothing(open_runtime, db_path) -> None:
    model = Racing([Reply.say("one")])
    async with open_runtime(model) as rt:
        sid, agent = await warmed(rt)
        stops: list[asyncio.Task[None]] = []
        stopping = asyncio.Event()

        async def race() -> None:
            stops.append(asyncio.ensure_future(agent.stop(grace=0.1)))
            stopping.set()
            await asyncio.Event().wait()  # the step waits here until the stop cancels it

        model.race = race
        mid = MessageId.new()
        await agent.followup("after the restart", message_id=mid)
        async with asyncio.timeout(WAIT):
            await stopping.wait()
            await stops[0]
        events = await rt.store.events_after(sid, 0)
    model.assert_done()
    assert [e.type for e in events].count("turn/start") == 1  # the first turn's only
    with closing(storekit.connect(db_path)) as conn:
        fate = conn.execute("SELECT fate FROM inbox WHERE id=?", (mid,)).fetchone()[0]
    assert fate == "queued"  # for the next start, as a message queued while stopping


def handed_write(sid: str, text: str, fail: bool = False) -> tuple[Any, list[dict[str, Any]]]:
    """A write that queues ``text`` (and raises after, if ``fail``), and the row it queues."""

    def write(tx: Any) -> str:
        enqueue(tx, sid, parse_content(text))
        if fail:
            raise Conflict("refused by the write's own check")
        return "written"

    return write, [queued_row(MessageId.new(), parse_content(text), Delivery.FOLLOWUP, Source(), False)]


async def test_a_handed_write_commits_with_the_opening_and_first_reservation(open_runtime) -> None:
    model = ScriptedModel([Reply.say("one"), Reply.say("two")])
    async with open_runtime(model) as rt:
        sid, agent = await warmed(rt)
        write, rows = handed_write(sid, "handed")
        handed = agent.open_after(write, rows)
        assert handed is not None
        async with asyncio.timeout(WAIT):
            assert await handed == "written"
        await idle(agent)
        events = await rt.store.events_after(sid, 0)
        started = await rt.store.read(
            lambda conn: [r[0] for r in conn.execute("SELECT started_at FROM model_calls WHERE session_id=?", (sid,))]
        )
    model.assert_done()
    assert user_texts(model.calls[1].request) == ["first", "handed"]
    opening = next(e for e in events if e.type == "turn/start" and e.seq > 5)
    together = [e.type for e in events if e.at == opening.at]
    assert together[:4] == ["message/queued", "status", "turn/start", "message/admitted"] and opening.at in started


async def test_a_handed_write_that_raises_writes_nothing_and_hears_its_error(open_runtime) -> None:
    model = ScriptedModel([Reply.say("one"), Reply.say("two")])
    async with open_runtime(model) as rt:
        sid, agent = await warmed(rt)
        write, rows = handed_write(sid, "refused", fail=True)
        handed = agent.open_after(write, rows)
        assert handed is not None
        async with asyncio.timeout(WAIT):
            with pytest.raises(Conflict, match="own check"):
                await handed
        await agent.followup("then this")
        await idle(agent)
        events = await rt.store.events_after(sid, 0)
        reserved = agent.guard.reserved_tokens
    model.assert_done()
    assert [user_texts(c.request) for c in model.calls] == [["first"], ["first", "then this"]]
    assert [e.type for e in events].count("message/queued") == 2 and reserved == 0


async def test_a_handed_write_the_driver_never_takes_hears_so(open_runtime) -> None:
    async with open_runtime(ScriptedModel([Reply.say("one")])) as rt:
        sid, agent = await warmed(rt)
        write, rows = handed_write(sid, "too late")
        handed = agent.open_after(write, rows)
        assert handed is not None
        await agent.stop(grace=1.0)
        async with asyncio.timeout(WAIT):
            with pytest.raises(StaleOpening):
                await handed
        assert agent.open_after(write, rows) is None  # a stopped driver takes nothing
        events = await rt.store.events_after(sid, 0)
    assert [e.type for e in events].count("message/queued") == 1


async def test_a_stop_while_the_opening_write_is_in_flight_ends_the_turn_it_opened(open_runtime, db_path) -> None:
    # The write goes on on the store's thread whatever becomes of its caller: the driver cannot tell
    # whether the turn opened, so it writes the turn's end as for any turn (a write after it, on the
    # same lane, finds what it committed) and leaves no turn open.
    async with open_runtime(Racing([Reply.say("one")])) as rt:
        sid, agent = await warmed(rt)
        transact = rt.store.transact
        stops: list[asyncio.Task[None]] = []
        stopping = asyncio.Event()

        async def racing(fn: Any, session: str | None = None, **kw: Any) -> Any:
            if session == sid and agent._writer.opening_pending and not stops:
                call = asyncio.ensure_future(transact(fn, session=session, **kw))
                stops.append(asyncio.ensure_future(agent.stop(grace=0)))
                stopping.set()
                return await call
            return await transact(fn, session=session, **kw)

        rt.store.transact = racing  # type: ignore[method-assign]
        await agent.followup("stopped in flight")
        async with asyncio.timeout(WAIT):
            await stopping.wait()
            await stops[0]
        rt.store.transact = transact  # type: ignore[method-assign]
    with closing(storekit.connect(db_path)) as conn:
        open_turns = conn.execute("SELECT COUNT(*) FROM turns WHERE end_reason IS NULL").fetchone()[0]
        reserved = conn.execute("SELECT COUNT(*) FROM model_calls WHERE state='reserved'").fetchone()[0]
        fate = conn.execute("SELECT fate FROM inbox ORDER BY queued_seq DESC LIMIT 1").fetchone()[0]
    assert (open_turns, reserved) == (0, 0)
    assert fate in ("admitted", "queued")  # in the turn it opened and ended, or still queued
