"""Writes of different sessions run at once across nodes; writes of one session never do (issue 30).

Two stores on one PostgreSQL database are two nodes. A transaction given its session
(``Store.transact(..., session=...)``) holds the cluster's writer lock shared and the session's
lock; one given none holds the writer lock alone. Each test holds node A's transaction open at a
known point (a ``threading.Event`` on A's store thread) and looks at what node B can do meanwhile:

* another session's write commits while A's is still open (they overlap: before, B waited);
* a write of A's session waits: PostgreSQL shows it waiting on an advisory lock, and its function
  runs its first statement only after A's has ended;
* a write that needs the cluster to itself waits the same way.

What B waits on is read from ``pg_locks``, not guessed from a time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from lockkit import LIMIT, Held, add, until_waiting

from agent.sessions import create_session
from agent.store import Store
from agent.tx import Tx


@pytest.fixture
async def nodes(pg_dsn: str) -> AsyncIterator[tuple[Store, Store, str]]:
    a, b = await Store.open(pg_dsn), await Store.open(pg_dsn)
    try:
        yield a, b, pg_dsn
    finally:
        await a.close()
        await b.close()


async def test_writes_of_two_sessions_on_two_nodes_overlap(nodes: tuple[Store, Store, str]) -> None:
    a, b, _ = nodes
    s1 = await a.transact(lambda tx: create_session(tx))
    s2 = await a.transact(lambda tx: create_session(tx))
    held = Held()
    task = asyncio.create_task(a.transact(held(s1), session=s1))
    try:
        await held.entered()
        # B's write of another session commits while A's is open: they overlap.
        await asyncio.wait_for(b.transact(lambda tx: add(tx, s2, "from b"), session=s2), LIMIT)
        assert not task.done()
        committed_b = time.monotonic()
    finally:
        held.release()
    await task
    assert committed_b < held.ended_at
    assert "message/queued" in [e.type for e in await a.events_after(s2, 0)]


@pytest.mark.parametrize("whose", ["the same session", "the whole cluster"])
async def test_a_write_of_the_same_session_or_of_the_cluster_waits(nodes: tuple[Store, Store, str], whose: str) -> None:
    a, b, dsn = nodes
    s1 = await a.transact(lambda tx: create_session(tx))
    held = Held()
    task = asyncio.create_task(a.transact(held(s1), session=s1))
    started_b: list[float] = []

    def write_b(tx: Tx) -> None:
        # Its first statement goes with the transaction's opening (or after it): it runs after the locks.
        tx.one("SELECT 1")
        started_b.append(time.monotonic())
        add(tx, s1, "from b")

    try:
        await held.entered()
        other = asyncio.create_task(b.transact(write_b, session=s1 if whose == "the same session" else None))
        await until_waiting(dsn)  # PostgreSQL shows B waiting on a lock, A's transaction still open
        assert not started_b and not other.done()
    finally:
        held.release()
    await task
    await asyncio.wait_for(other, LIMIT)
    assert started_b and started_b[0] > held.ended_at  # B's first statement ran only after A's had ended
    seqs = [e.seq for e in await a.events_after(s1, 0)]
    assert seqs == list(range(1, len(seqs) + 1))  # one gap-free sequence, whichever node wrote
