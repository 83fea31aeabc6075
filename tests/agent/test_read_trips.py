"""A read costs the round trips of its statements only (PostgreSQL; issue 30).

A read (:meth:`agent.store.Store.read`) sent its ``BEGIN`` and its ``ROLLBACK`` in round trips of
their own: a read of one statement cost three. Its opening now goes with its first statement, and
its ``ROLLBACK`` with the connection's next statement, or alone as soon as the connection has no
work (so no snapshot is held while it waits). Pins, on a real PostgreSQL database:

* a read of one statement is one round trip; a read that sends nothing sends nothing;
* once the store is idle, none of its connections is left inside a transaction (the server's own
  view, ``pg_stat_activity``);
* on one connection, a write after a read, after a read that raised, and after a read whose
  statement failed on the server all commit, and each read sees its own snapshot;
* two statements of one read see one snapshot (a write between them is not seen).
"""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg
import pytest
from storekit import scalar

from agent import NotFound, create_session
from agent.db import Conn
from agent.store import Store


async def in_transaction(dsn: str) -> int:
    """goald's connections that the server sees inside a transaction."""
    query = (
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'goald'"
        " AND datname = current_database() AND state LIKE 'idle in transaction%'"
    )
    return int(await asyncio.to_thread(scalar, dsn, query))


async def until_none_in_transaction(dsn: str, limit: float = 10.0) -> None:
    end = time.monotonic() + limit
    while (left := await in_transaction(dsn)) != 0:
        assert time.monotonic() < end, f"{left} connection(s) still inside a transaction"
        await asyncio.sleep(0.02)


async def test_a_read_of_one_statement_is_one_round_trip(pg_dsn: str) -> None:
    store = await Store.open(pg_dsn, connections=1)
    try:
        await store.transact(lambda tx: create_session(tx))
        await until_none_in_transaction(pg_dsn)
        before = store.round_trips
        assert before is not None
        n = await store.read(lambda conn: conn.execute("SELECT count(*) FROM sessions").fetchone()[0])
        assert n == 1
        await until_none_in_transaction(pg_dsn)
        assert store.round_trips == before + 2, "its statement, then its ROLLBACK alone: the store went idle"
        await store.read(lambda conn: None)
        assert store.round_trips == before + 2, "a read that sends nothing sends nothing"
        # Under work, each ROLLBACK travels with the next read's statement: twenty reads queued
        # behind one that holds the connection are twenty round trips, and one ROLLBACK at the end.
        gate = threading.Event()
        held = asyncio.ensure_future(store.read(lambda conn: gate.wait(10)))
        reads = [
            asyncio.ensure_future(store.read(lambda conn: conn.execute("SELECT 1").fetchone()[0])) for _ in range(20)
        ]
        await asyncio.sleep(0)  # the reads are submitted (queued behind the held one)
        gate.set()
        assert await held and await asyncio.gather(*reads) == [1] * 20
        await until_none_in_transaction(pg_dsn)
        assert store.round_trips == before + 2 + 21
    finally:
        await store.close()


async def test_writes_after_reads_on_one_connection_commit(pg_dsn: str) -> None:
    store = await Store.open(pg_dsn, connections=1)
    try:
        sid = await store.transact(lambda tx: create_session(tx))

        def fine(conn: Conn) -> int:
            return int(conn.execute("SELECT 1").fetchone()[0])

        def missing(conn: Conn) -> None:
            conn.execute("SELECT 1 FROM sessions WHERE id=?", ("ses_none",)).fetchone()
            raise NotFound("no session ses_none")

        def broken(conn: Conn) -> None:
            conn.execute("SELECT * FROM no_such_table").fetchall()

        for read, error in ((fine, None), (missing, NotFound), (broken, psycopg.errors.UndefinedTable)):
            if error is None:
                assert await store.read(read) == 1
            else:
                with pytest.raises(error):
                    await store.read(read)
            await store.transact(lambda tx: tx.emit(sid, "test/write", {}), session=sid)
        types = [e.type for e in await store.events_after(sid, 0)]
        assert types.count("test/write") == 3, "each write after a read committed"
        await until_none_in_transaction(pg_dsn)
    finally:
        await store.close()


async def test_two_statements_of_a_read_see_one_snapshot(pg_dsn: str) -> None:
    store = await Store.open(pg_dsn, connections=2)
    try:
        await store.transact(lambda tx: create_session(tx))
        loop = asyncio.get_running_loop()

        def read(conn: Conn) -> tuple[int, int]:
            first = int(conn.execute("SELECT count(*) FROM sessions").fetchone()[0])
            # Another connection commits a session meanwhile.
            asyncio.run_coroutine_threadsafe(store.transact(lambda tx: create_session(tx)), loop).result(10)
            second = int(conn.execute("SELECT count(*) FROM sessions").fetchone()[0])
            return first, second

        assert await store.read(read) == (1, 1), "the second statement read the first one's snapshot"
        assert await store.read(lambda conn: int(conn.execute("SELECT count(*) FROM sessions").fetchone()[0])) == 2
    finally:
        await store.close()
