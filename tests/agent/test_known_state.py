"""A PostgreSQL write bound to a session opens on the state this node last committed for it (issue 30).

Such a write used to spend its first round trip on ``BEGIN``, the locks and the session's state
(``goald_begin``) before its first statement. Now, when this node knows the session's state (it
committed the session's last write it knows of), nothing is sent until the transaction's first
statement or its ``COMMIT``, which carry the opening: the same locks and ``goald_check``, which
compares the state with the known one and fails the transaction if another writer changed it
(:meth:`agent.backends.PgBackend.begin`). The store then runs the write again on the state read
(:meth:`agent.store.Store._run_tx`). Pins:

* a write whose statements are all deferred (an event, a reservation) is one round trip;
* a write decided on a state another node changed since is run again on the current one: its
  first run's statements are never committed, its events follow the other node's, gap-free;
* each part of the state is checked (the last sequence number, the status event's, the open turn);
* a write that fails before its first statement sends nothing and leaves the known state as it was;
* a write whose first statement is in a savepoint (a message queued under a ``pending_key``) runs
  again too: the savepoint's own rollback fails once the check has failed, and the check's failure
  is what counts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import pytest

from agent.errors import InvalidInput
from agent.inbox import enqueue
from agent.messages import parse_content
from agent.sessions import create_session
from agent.store import Store
from agent.tx import SessionState, Tx


@pytest.fixture
async def nodes(pg_dsn: str) -> AsyncIterator[tuple[Store, Store]]:
    a = await Store.open(pg_dsn, connections=2)
    b = await Store.open(pg_dsn, connections=2)
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


async def stored(store: Store, sid: str) -> list[tuple[int, str]]:
    return [(e.seq, e.type) for e in await store.events_after(sid, 0, limit=1000)]


def known(store: Store, sid: str) -> SessionState:
    """What ``store`` knows of the session (white box: the states it opens writes on)."""
    return dataclasses.replace(store._states[sid])


async def test_a_write_of_deferred_statements_only_is_one_round_trip(nodes: tuple[Store, Store]) -> None:
    a, _ = nodes
    sid = await a.transact(lambda tx: create_session(tx))
    await a.transact(lambda tx: tx.emit(sid, "test/first", {}), session=sid)
    before = a.round_trips
    assert before is not None
    await a.transact(lambda tx: tx.emit(sid, "test/second", {"n": 2}), session=sid)
    assert a.round_trips == before + 1
    # One more statement read in the write: its opening goes with it, and the COMMIT: two.
    await a.transact(
        lambda tx: (tx.one("SELECT 1 FROM sessions WHERE id=?", (sid,)), tx.emit(sid, "test/third", {})), session=sid
    )
    assert a.round_trips == before + 3
    types = [t for _, t in await stored(a, sid)]
    assert types[-3:] == ["test/first", "test/second", "test/third"]


async def test_a_write_on_a_state_another_node_changed_runs_again_on_the_current_one(
    nodes: tuple[Store, Store],
) -> None:
    a, b = nodes
    # a does not hear of b's commit (its listener would make it forget the state: a race here).
    assert a._listener is not None
    a._listener.stop()
    sid = await a.transact(lambda tx: create_session(tx))
    await a.transact(lambda tx: tx.emit(sid, "test/a1", {}), session=sid)
    old = known(a, sid)
    await b.transact(lambda tx: tx.emit(sid, "test/b1", {}), session=sid)
    assert known(a, sid) == old
    seen: list[int] = []

    def write(tx: Tx) -> int:
        seen.append(tx.state(sid).last_seq)
        return tx.emit(sid, "test/a2", {}).seq

    reruns = a.reruns
    seq = await a.transact(write, session=sid)
    assert seen == [old.last_seq, old.last_seq + 1], "run once on the known state, then on the current one"
    assert a.reruns == reruns + 1, "counted (daemon/health's storeReruns)"
    events = await stored(a, sid)
    assert [s for s, _ in events] == list(range(1, len(events) + 1)), "gap-free, each number once"
    assert [t for _, t in events][-3:] == ["test/a1", "test/b1", "test/a2"]
    assert seq == events[-1][0]
    assert known(a, sid).last_seq == seq, "what a committed is what it knows now"


@pytest.mark.parametrize("part", ["last_seq", "status_seq", "open_turn"])
async def test_every_part_of_the_known_state_is_checked(nodes: tuple[Store, Store], part: str) -> None:
    a, _ = nodes
    sid = await a.transact(lambda tx: create_session(tx))
    await a.transact(lambda tx: tx.emit(sid, "test/a1", {}), session=sid)
    actual = known(a, sid)
    wrong = {"last_seq": actual.last_seq - 1, "status_seq": actual.status_seq + 1, "open_turn": "turn_gone"}[part]
    a._states[sid] = dataclasses.replace(actual, **{part: wrong})
    seen: list[SessionState] = []

    def write(tx: Tx) -> None:
        seen.append(dataclasses.replace(tx.state(sid)))
        tx.emit(sid, "test/a2", {})

    await a.transact(write, session=sid)
    assert [getattr(s, part) for s in seen] == [wrong, getattr(actual, part)]
    assert (await stored(a, sid))[-1] == (actual.last_seq + 1, "test/a2")


async def test_a_write_that_fails_before_its_first_statement_sends_nothing(nodes: tuple[Store, Store]) -> None:
    a, _ = nodes
    sid = await a.transact(lambda tx: create_session(tx))
    await a.transact(lambda tx: tx.emit(sid, "test/a1", {}), session=sid)
    state, before = known(a, sid), a.round_trips

    def refuse(tx: Tx) -> None:
        tx.emit(sid, "test/never", {})
        raise InvalidInput("refused before any statement was sent")

    with pytest.raises(InvalidInput):
        await a.transact(refuse, session=sid)
    assert a.round_trips == before, "no opening, no deferred insert and no ROLLBACK were sent"
    assert known(a, sid) == state
    await a.transact(lambda tx: tx.emit(sid, "test/a2", {}), session=sid)
    assert [t for _, t in await stored(a, sid)][-2:] == ["test/a1", "test/a2"]


async def test_a_write_whose_first_statement_is_in_a_savepoint_runs_again(nodes: tuple[Store, Store]) -> None:
    a, _ = nodes
    sid = await a.transact(lambda tx: create_session(tx))
    await a.transact(lambda tx: tx.emit(sid, "test/a1", {}), session=sid)
    actual = known(a, sid)
    a._states[sid] = dataclasses.replace(actual, last_seq=actual.last_seq - 1)
    runs: list[int] = []

    def queue(tx: Tx) -> int:
        runs.append(tx.state(sid).last_seq)
        return enqueue(tx, sid, parse_content("queued under a key"), pending_key="k").seq

    seq = await a.transact(queue, session=sid)
    assert runs == [actual.last_seq - 1, actual.last_seq] and seq == actual.last_seq + 1
    assert (seq, "message/queued") in await stored(a, sid)
    assert a.reruns == 1
