"""Whether a waking message is queued, known from this node's own writes (issue 30).

A turn's end commits ``idle`` unless a waking message (a follow-up or a steer) is queued, which it
read: a round trip of its own on PostgreSQL before the ``COMMIT``. The node that opened the turn
admitted every queued message then, so unless a message was queued since, none wakes: the session's
state now carries whether one is queued as this node's writes left it
(:attr:`agent.tx.SessionState.waking`), and the read is made only when that is not known. Every
change of the queue is an event, so a write opened on a known state whose check holds (no other
writer since) finds the queue as this node left it. Pins, on both stores:

* a turn that ends with nothing queued since it opened does not read the queue: its end is one
  round trip on PostgreSQL (the opening, the events, the ``COMMIT``);
* a follow-up queued during the turn, by this node or (PostgreSQL) by another, keeps it running;
* a steer admitted during the turn leaves a queued follow-up known to wake; a cancelled one is read.
"""

from __future__ import annotations

import pytest

from agent.inbox import admit, cancel, enqueue
from agent.messages import Delivery, parse_content
from agent.payloads import AgentStatus, EndReason
from agent.sessions import create_session
from agent.store import Store
from agent.turns import TurnEnd, end_turn, take_or_idle
from agent.tx import Tx

pytestmark = pytest.mark.both_stores

END = TurnEnd(reason=EndReason.END_TURN)


async def opened(store: Store) -> tuple[str, str]:
    """A session with a turn open on a follow-up, its state known to ``store``."""
    sid = await store.transact(lambda tx: create_session(tx))
    await store.transact(lambda tx: enqueue(tx, sid, parse_content("go")), session=sid)
    turn = await store.transact(lambda tx: take_or_idle(tx, sid), session=sid)
    assert turn is not None
    return sid, turn.turn_id


async def ended(store: Store, sid: str, turn_id: str) -> bool:
    """The turn ended; whether the session has more work (a waking message queued)."""
    return await store.transact(lambda tx: end_turn(tx, sid, turn_id, END), session=sid)


async def test_a_turn_with_nothing_queued_since_it_opened_ends_without_reading_the_queue(store: Store) -> None:
    sid, turn_id = await opened(store)
    before = store.round_trips
    assert await ended(store, sid, turn_id) is False
    if before is not None:  # PostgreSQL: the opening, the turn's end and idle, the COMMIT
        assert store.round_trips == before + 1
    assert (await store.session_state(sid)).status is AgentStatus.IDLE


async def test_a_follow_up_queued_during_the_turn_keeps_it_running(store: Store) -> None:
    sid, turn_id = await opened(store)
    await store.transact(lambda tx: enqueue(tx, sid, parse_content("and then")), session=sid)
    assert await ended(store, sid, turn_id) is True
    assert (await store.session_state(sid)).status is AgentStatus.RUNNING
    again = await store.transact(lambda tx: take_or_idle(tx, sid), session=sid)
    assert again is not None and [a.content[0].text for a in again.admitted] == ["and then"]  # type: ignore[union-attr]


async def test_a_steer_admitted_midturn_leaves_a_queued_follow_up_waking(store: Store) -> None:
    sid, turn_id = await opened(store)

    def queue_both(tx: Tx) -> None:
        enqueue(tx, sid, parse_content("later"))
        enqueue(tx, sid, parse_content("now"), delivery=Delivery.STEER)

    await store.transact(queue_both, session=sid)
    steered = await store.transact(lambda tx: admit(tx, sid, turn_id, waking=False), session=sid)
    assert [a.delivery for a in steered] == [Delivery.STEER]
    assert await ended(store, sid, turn_id) is True


async def test_a_cancelled_follow_up_is_read_and_the_session_goes_idle(store: Store) -> None:
    sid, turn_id = await opened(store)
    queued = await store.transact(lambda tx: enqueue(tx, sid, parse_content("maybe")), session=sid)
    await store.transact(lambda tx: cancel(tx, sid, queued.message_id, "not needed"), session=sid)
    assert await ended(store, sid, turn_id) is False
    assert (await store.session_state(sid)).status is AgentStatus.IDLE


async def test_a_follow_up_another_node_queued_keeps_the_turn_running(db_path: str) -> None:
    if not isinstance(db_path, str):
        pytest.skip("one writer per SQLite file: no other node")
    a = await Store.open(db_path, connections=2)
    b = await Store.open(db_path, connections=2)
    try:
        sid, turn_id = await opened(a)
        await b.transact(lambda tx: enqueue(tx, sid, parse_content("from b")), session=sid)
        # Whether or not a has heard of b's write yet: its check finds the state changed, and the
        # end runs again on the state read, which reads the queue.
        assert await ended(a, sid, turn_id) is True
        assert (await a.session_state(sid)).status is AgentStatus.RUNNING
    finally:
        await a.close()
        await b.close()
