"""A PostgreSQL store works over several connections, one thread each (issue 30).

A session's work runs one unit at a time, in the order submitted: on the connection that has that
session's work queued or running, else on the least busy one (:meth:`PgBackend.submit
<agent.backends.PgBackend.submit>`); different sessions' run at once on one node, as they already
did across nodes. Pins:

* on one node, another session's write commits while a write is held open on another connection
  (with one connection it would wait behind it);
* a transaction held open holds up its own session's next write only: every other session's writes
  commit meanwhile, however many (with a connection fixed by a hash of the id, the sessions hashed
  to the held one's connection waited behind it);
* one session's writes, submitted at once and in bursts between which it moves to another
  connection, run in the order they were submitted;
* every session's events reach the hub of a node in sequence order, once each, with no gap, while
  its own writes, writes bound to no session that touch several sessions at once, another node's
  writes (relayed) and first reads of a session (which mark it) race on all four connections
  (:class:`agent.relay.Marks`).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import AsyncIterator

import pytest

from agent.backends import SESSION_LOCKS, WRITER_LOCK
from agent.db import Conn
from agent.events import Event, EventType
from agent.ids import MessageId
from agent.inbox import enqueue
from agent.messages import parse_content
from agent.payloads import AgentStatus
from agent.sessions import create_session
from agent.store import Store
from agent.tx import Tx, state_of_row, state_query

LIMIT = 10.0
CONNECTIONS = 4


@pytest.fixture
async def nodes(pg_dsn: str) -> AsyncIterator[tuple[Store, Store]]:
    a = await Store.open(pg_dsn, connections=CONNECTIONS)
    b = await Store.open(pg_dsn, connections=CONNECTIONS)
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


def add(tx: Tx, sid: str, text: str) -> None:
    enqueue(tx, sid, parse_content(text), message_id=MessageId.new())


async def new_sessions(store: Store, count: int) -> list[str]:
    return [await store.transact(lambda tx: create_session(tx)) for _ in range(count)]


def lane_now(store: Store) -> int:
    """The connection this store thread works on (inside a unit of work)."""
    lane: int = store._backend._tls.lane  # type: ignore[union-attr]
    return lane


async def test_the_store_has_its_connections(nodes: tuple[Store, Store]) -> None:
    a, _ = nodes
    assert a.connections == CONNECTIONS
    # As many reads as connections, each waiting for all the others to begin: they run at once.
    barrier = threading.Barrier(CONNECTIONS, timeout=LIMIT)

    def meet(conn: Conn) -> int:
        barrier.wait()
        return lane_now(a)

    lanes = await asyncio.gather(*(a.read(meet) for _ in range(CONNECTIONS)))
    assert sorted(lanes) == list(range(CONNECTIONS))


async def test_two_sessions_writes_on_one_node_overlap(nodes: tuple[Store, Store]) -> None:
    a, _ = nodes
    s1, s2 = await new_sessions(a, 2)
    inside, go = threading.Event(), threading.Event()

    def held(tx: Tx) -> None:
        add(tx, s1, "held open")
        inside.set()
        assert go.wait(LIMIT), "the held transaction was never released"

    task = asyncio.create_task(a.transact(held, session=s1))
    try:
        assert await asyncio.to_thread(inside.wait, LIMIT), "the held transaction never began"
        # The same node, another session, another connection: it commits while the first is open.
        await asyncio.wait_for(a.transact(lambda tx: add(tx, s2, "meanwhile"), session=s2), LIMIT)
        assert not task.done()
    finally:
        go.set()
    await task
    assert "message/queued" in [e.type for e in await a.events_after(s2, 0)]


async def test_a_held_transaction_holds_up_its_own_session_only(nodes: tuple[Store, Store]) -> None:
    a, _ = nodes
    held_sid, *others = await new_sessions(a, 1 + 4 * CONNECTIONS)
    inside, go = threading.Event(), threading.Event()
    order: list[str] = []

    def held(tx: Tx) -> None:
        add(tx, held_sid, "held open")
        inside.set()
        assert go.wait(LIMIT), "the held transaction was never released"
        order.append("held")

    def after(tx: Tx) -> None:
        add(tx, held_sid, "after")
        order.append("after")

    task = asyncio.create_task(a.transact(held, session=held_sid))
    try:
        assert await asyncio.to_thread(inside.wait, LIMIT), "the held transaction never began"
        second = asyncio.create_task(a.transact(after, session=held_sid))
        # Four writes of each of 16 other sessions, all submitted at once: every one commits while
        # the held transaction is open, whichever connection it runs on.
        writes = [a.transact(lambda tx, s=s, i=i: add(tx, s, f"w{i}"), session=s) for s in others for i in range(4)]
        await asyncio.wait_for(asyncio.gather(*writes), LIMIT)
        assert not task.done() and not second.done() and order == []
    finally:
        go.set()
    await asyncio.wait_for(asyncio.gather(task, second), LIMIT)
    assert order == ["held", "after"]  # the session's own next write waited for it


async def test_one_sessions_writes_run_in_the_order_submitted(nodes: tuple[Store, Store]) -> None:
    a, _ = nodes
    sid, *others = await new_sessions(a, 1 + CONNECTIONS)
    ran: list[int] = []
    lanes: set[int] = set()

    def write(i: int) -> object:
        def run(tx: Tx) -> None:
            ran.append(i)
            lanes.add(lane_now(a))
            add(tx, sid, f"message {i}")

        return run

    for burst in range(8):
        # Other sessions' writes in flight, so the session's next burst may go to another connection.
        busy = [a.transact(lambda tx, s=s: add(tx, s, "busy"), session=s) for s in others[: burst % CONNECTIONS]]
        mine = [a.transact(write(burst * 10 + i), session=sid) for i in range(10)]
        await asyncio.gather(*busy, *mine)
    assert ran == [b * 10 + i for b in range(8) for i in range(10)]
    assert len(lanes) > 1, "the session never moved to another connection: the order was not at stake"
    queued = [e for e in await a.events_after(sid, 0) if e.type == "message/queued"]
    assert len(queued) == 80


async def race(a: Store, b: Store, seed: int) -> None:
    """One race of every way a session's events reach ``a``'s hub; then each session's events there
    are each once, in order, with no gap."""
    sids = await new_sessions(a, 3 * CONNECTIONS)
    got: list[Event] = []
    stop = a.hub.add_listener(got.append)
    rng = random.Random(seed)

    async def own(sid: str, n: int) -> None:  # the session's own writes, one at a time
        for i in range(n):
            await a.transact(lambda tx, i=i: add(tx, sid, f"own {i}"), session=sid)

    async def across(n: int) -> None:  # bound to no session, several sessions
        for i in range(n):
            some = rng.sample(sids, 3)
            await a.transact(lambda tx, some=some, i=i: [add(tx, s, f"across {i}") for s in some])

    async def other_node(sid: str, n: int) -> None:  # relayed to a by its notifications
        for i in range(n):
            await b.transact(lambda tx, i=i: add(tx, sid, f"from b {i}"), session=sid)

    async def reads(sid: str, n: int) -> None:  # first uses of a session mark it (agent.relay.follow)
        for _ in range(n):
            await a.session_state(sid)
            await a.events_after(sid, 0)

    try:
        await asyncio.gather(
            *(own(s, 8) for s in sids),
            *(across(10) for _ in range(3)),
            *(other_node(s, 5) for s in sids[::2]),
            *(reads(s, 4) for s in sids[1::2]),
        )
        tops = {s: (await a.events_after(s, 0))[-1].seq for s in sids}

        def complete() -> bool:
            seen = dict.fromkeys(sids, 0)
            for e in got:
                if e.session_id in seen:
                    seen[e.session_id] = max(seen[e.session_id], e.seq)
            return seen == tops

        end = time.monotonic() + LIMIT
        while not complete():
            assert time.monotonic() < end, "not every event reached the hub"
            await asyncio.sleep(0.01)
        for sid in sids:
            seqs = [e.seq for e in got if e.session_id == sid]
            # From the first event published here on: each once, in order, no gap.
            assert seqs == list(range(seqs[0], tops[sid] + 1)), (seed, sid)
    finally:
        stop()


async def test_each_sessions_events_reach_the_hub_in_order_once(nodes: tuple[Store, Store]) -> None:
    a, b = nodes
    for seed in range(10):
        await race(a, b, seed)


@pytest.mark.soak
async def test_each_sessions_events_reach_the_hub_in_order_once_soak(nodes: tuple[Store, Store]) -> None:
    a, b = nodes
    for seed in range(200):
        await race(a, b, seed)


async def test_after_a_server_restart_one_unit_of_work_fails_not_one_per_connection() -> None:
    """Every connection breaks when the server restarts; the first unit of work that meets its
    broken connection fails (as with one connection), and the others' connections are made again
    before their next use instead of failing once each."""
    from pgkit import PgServer

    from agent.errors import StorageUnavailable

    server = PgServer.start()
    try:
        store = await Store.open(server.create_database(), connections=CONNECTIONS)
        try:
            await store.read(lambda conn: conn.execute("SELECT 1").fetchone())
            server.halt()
            server.restart()
            outcomes = []
            for _ in range(2 * CONNECTIONS):
                try:
                    await store.read(lambda conn: conn.execute("SELECT 1").fetchone())
                    outcomes.append("ok")
                except StorageUnavailable:
                    outcomes.append("failed")
            assert outcomes == ["failed"] + ["ok"] * (2 * CONNECTIONS - 1), outcomes
            assert store.storage_health() == {"ok": True}
        finally:
            await store.close()
    finally:
        server.stop()


async def test_a_session_writes_opening_function_reads_its_state_as_state_query_does(pg_dsn: str) -> None:
    """``goald_begin`` (agent.schema's version 6: a PostgreSQL write's locks and state in one
    statement) answers what :func:`agent.tx.state_query` does, in every state a session has."""
    store = await Store.open(pg_dsn)
    try:
        sid = await store.transact(lambda tx: create_session(tx))

        def both(conn: Conn) -> tuple[object, object]:
            by_query = conn.execute(*state_query(sid)).fetchone()
            by_function = conn.execute(
                "SELECT * FROM goald_begin(?, ?, ?, ?)", (WRITER_LOCK, SESSION_LOCKS, sid, EventType.STATUS.value)
            ).fetchone()
            return state_of_row(by_query, sid), state_of_row(by_function, sid)

        a, b = await store.read(both)
        assert a == b and a.open_turn is None
        await store.transact(lambda tx: add(tx, sid, "first"), session=sid)
        await store.transact(lambda tx: tx.set_status(sid, AgentStatus.RUNNING), session=sid)
        a, b = await store.read(both)
        assert a == b and a.status is AgentStatus.RUNNING and a.status_seq > 0
        await store.transact(
            lambda tx: tx.conn.execute(
                "INSERT INTO turns(id, session_id, start_seq, started_at) VALUES ('turn_x', ?, 1, 'now')", (sid,)
            ),
            session=sid,
        )
        await store.transact(
            lambda tx: tx.conn.execute("UPDATE sessions SET seq_watermark = 500 WHERE id = ?", (sid,)), session=sid
        )
        a, b = await store.read(both)
        assert a == b and a.open_turn == "turn_x" and a.last_seq == 500

        def missing(conn: Conn) -> object:
            return conn.execute(
                "SELECT * FROM goald_begin(?, ?, ?, ?)", (WRITER_LOCK, SESSION_LOCKS, "ses_none", "status")
            ).fetchone()

        assert await store.read(missing) is None
    finally:
        await store.close()
