"""A session's queue, known from this node's own writes (issue 30).

A turn's opening read the queue (what it admits), and its end read it again (whether a message
wakes), each a round trip of its own on PostgreSQL; a person's follow-up looked for queued messages
it supersedes. The node that drives a session wrote its queue itself: the session's state now
carries the queued messages as this node's writes left them (:attr:`agent.tx.SessionState.queue`),
and the queue is read only when that is not known. Every change of the queue is an event, so a
write opened on a known state whose check holds (no other writer since) finds the queue as this
node left it. Pins, on both stores:

* a turn that ends with nothing queued since it opened does not read the queue, and a turn opened
  on a queue this node wrote does not either: each is one round trip on PostgreSQL;
* a follow-up queued during the turn, by this node or (PostgreSQL) by another, keeps it running,
  and the next turn admits it; a person's follow-up still supersedes a queued continuation;
* a steer admitted during the turn leaves a queued follow-up known to wake; a cancelled one does
  not keep the session running.
"""

from __future__ import annotations

import pytest

from agent.inbox import admit, cancel, enqueue
from agent.messages import Delivery, parse_content
from agent.payloads import AgentStatus, EndReason
from agent.sessions import create_session, delete_session
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
    before = store.round_trips
    again = await store.transact(lambda tx: take_or_idle(tx, sid), session=sid)
    assert again is not None and [a.content[0].text for a in again.admitted] == ["and then"]  # type: ignore[union-attr]
    if before is not None:  # the queue this node wrote: the opening, the admission, the COMMIT
        assert store.round_trips == before + 1


async def test_a_follow_up_supersedes_a_queued_continuation_on_a_known_queue(store: Store) -> None:
    sid, turn_id = await opened(store)
    assert await ended(store, sid, turn_id) is False
    cont = await store.transact(
        lambda tx: enqueue(tx, sid, parse_content("go on"), yields_to_followup=True), session=sid
    )
    await store.transact(lambda tx: enqueue(tx, sid, parse_content("do this instead")), session=sid)
    turn = await store.transact(lambda tx: take_or_idle(tx, sid), session=sid)
    assert turn is not None and [a.content[0].text for a in turn.admitted] == ["do this instead"]  # type: ignore[union-attr]
    cancelled = [e for e in await store.events_after(sid, 0) if e.type == "message/cancelled"]
    assert [(e.data["messageId"], e.data["reason"]) for e in cancelled] == [(cont.message_id, "superseded")]


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


async def test_a_deleted_session_leaves_no_known_state(store: Store) -> None:
    """A session deleted (an ended goal's history removed) takes its known state with it: one
    brought back under the same id (a goal imported again) starts from what is stored."""
    sid, turn_id = await opened(store)
    assert await ended(store, sid, turn_id) is False
    assert sid in store._states  # white box: what the next write would open on
    assert await store.transact(lambda tx: delete_session(tx, sid)) == 1
    assert sid not in store._states
