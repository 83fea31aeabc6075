"""A driving write's lease fence travels with its ``COMMIT`` (issue 30: one round trip fewer per
driving write) and refuses the write as the old check did — and a lease taken while the write was
under way, which the old check (made before the write's statements) let through.

A store on a real PostgreSQL database with the cluster's tables is one node; its fence is a
lease row naming this node at an epoch (what :class:`daemon.cluster.leases.LeaseManager` installs:
``fence`` reads the row, ``fence_at_commit`` builds the statement). Another connection plays the
node that takes the lease over.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import psycopg
import pytest

from agent.db import Conn
from agent.errors import LeaseLost
from agent.ids import MessageId
from agent.inbox import enqueue
from agent.messages import parse_content
from agent.sessions import create_session
from agent.store import Store
from agent.tx import Tx
from daemon.cluster.lease_rows import MIGRATIONS, fence_statement, lease_of

NODE = "node-a"


@pytest.fixture
async def node(pg_dsn: str) -> AsyncIterator[tuple[Store, str]]:
    store = await Store.open(pg_dsn)
    await store.migrate("cluster", MIGRATIONS)
    held: dict[str, int] = {}

    def fence(conn: Conn, sid: str) -> None:
        row = lease_of(conn, sid)
        if row is None or row != (NODE, held.get(sid)):
            raise LeaseLost(f"lease lost for session {sid}: now {row}; nothing was written")

    def at_commit(conn: Conn, sid: str) -> str:
        return fence_statement(sid, NODE, held[sid])

    store.fence, store.fence_at_commit = fence, at_commit
    store.held = held  # type: ignore[attr-defined]
    try:
        yield store, pg_dsn
    finally:
        await store.close()


async def leased(store: Store, dsn: str) -> str:
    sid = await store.transact(lambda tx: create_session(tx))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO leases(session_id, node_id, epoch) VALUES (%s, %s, 1)", (sid, NODE))
    store.held[sid] = 1  # type: ignore[attr-defined]
    return sid


def take_over(dsn: str, sid: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE leases SET node_id = 'node-b', epoch = epoch + 1 WHERE session_id = %s", (sid,))


def count_queued(dsn: str, sid: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT COUNT(*) FROM inbox WHERE session_id = %s", (sid,)).fetchone()
        return int(row[0]) if row else 0


def driving_write(sid: str, during: object = None) -> object:
    def run(tx: Tx) -> None:
        tx.fence(sid)
        if callable(during):
            during()
        enqueue(tx, sid, parse_content("a driving write"), message_id=MessageId.new())

    return run


async def test_a_held_lease_commits_with_its_fence_in_the_commit(node: tuple[Store, str]) -> None:
    store, dsn = node
    sid = await leased(store, dsn)
    statements: list[str] = []
    await store.trace(statements.append)
    try:
        await store.transact(driving_write(sid), session=sid)
    finally:
        await store.trace(None)
    assert count_queued(dsn, sid) == 1
    # No statement of its own for the fence: it is in the COMMIT's text.
    assert not any(s.startswith("SELECT node_id, epoch FROM leases") for s in statements), statements
    [commit] = [s for s in statements if s.rstrip().endswith("COMMIT")]
    # One SELECT checks the fence and sends the write's notice; then the deferred inserts, the COMMIT.
    assert commit.startswith(f"SELECT goald_fence('{sid}', '{NODE}', 1), pg_notify("), commit


async def test_a_lease_taken_before_the_write_refuses_it(node: tuple[Store, str]) -> None:
    store, dsn = node
    sid = await leased(store, dsn)
    take_over(dsn, sid)
    with pytest.raises(LeaseLost, match="nothing was written"):
        await store.transact(driving_write(sid), session=sid)
    assert count_queued(dsn, sid) == 0


async def test_a_lease_taken_while_the_write_runs_refuses_it(node: tuple[Store, str]) -> None:
    store, dsn = node
    sid = await leased(store, dsn)
    with pytest.raises(LeaseLost, match="node-b"):
        await store.transact(driving_write(sid, during=lambda: take_over(dsn, sid)), session=sid)
    assert count_queued(dsn, sid) == 0
    # The store goes on: the next write of another session commits.
    other = await leased(store, dsn)
    await store.transact(driving_write(other), session=other)
    assert count_queued(dsn, other) == 1


async def test_a_write_that_fails_otherwise_reports_the_lost_lease(node: tuple[Store, str]) -> None:
    store, dsn = node
    sid = await leased(store, dsn)

    def broken() -> None:
        take_over(dsn, sid)
        raise RuntimeError("the write's own failure")

    with pytest.raises(LeaseLost) as caught:
        await store.transact(driving_write(sid, during=broken), session=sid)
    assert isinstance(caught.value.__context__, RuntimeError)  # what the writer must hear of: the lease
    assert count_queued(dsn, sid) == 0


def another_nodes_event(dsn: str, sid: str) -> None:
    """An event of the session committed elsewhere, unannounced: the store's known state is stale."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO events(session_id, seq, type, data, at)"
            " SELECT %s, MAX(seq) + 1, 'test/elsewhere', '{}', 'now' FROM events WHERE session_id = %s",
            (sid, sid),
        )


@pytest.mark.parametrize("lease", ["held", "lost"])
async def test_a_write_on_a_stale_known_state_runs_again_unless_its_lease_was_lost(
    node: tuple[Store, str], lease: str
) -> None:
    """A write opened on the state this node knows (agent.backends.PgBackend.begin) fails as stale
    (SQLSTATE GD002) when the session changed elsewhere; run again only while the lease is held: a
    lost lease (GD001, in the same COMMIT's text) is what the writer hears of, and nothing is run again."""
    store, dsn = node
    sid = await leased(store, dsn)
    await store.transact(driving_write(sid), session=sid)  # this node knows the session's state now
    another_nodes_event(dsn, sid)
    if lease == "lost":
        take_over(dsn, sid)
    runs: list[int] = []
    write = driving_write(sid, during=lambda: runs.append(1))
    if lease == "lost":
        with pytest.raises(LeaseLost, match="node-b"):
            await store.transact(write, session=sid)
        assert runs == [1] and store.reruns == 0 and count_queued(dsn, sid) == 1
    else:
        await store.transact(write, session=sid)
        assert runs == [1, 1] and store.reruns == 1 and count_queued(dsn, sid) == 2


def test_the_cluster_jobs_locks_are_apart_from_every_write_lock() -> None:
    """A job's session-level lock (``pg_try_advisory_lock(JOB_CLASS, key)``, held for as long as a
    node runs the job) shares no key with a session's write lock (``SESSION_LOCKS``, the hash of its
    id): with one class, a session whose id hashed to a job's key would wait on the job."""
    from agent.backends import SESSION_LOCKS, WRITER_LOCK
    from daemon.cluster.leases import JOB_CLASS, JOBS

    assert JOB_CLASS != SESSION_LOCKS
    # A bigint key shows in pg_locks with objsubid 1, a pair of int4 keys with objsubid 2: the
    # writer lock cannot meet a job's, whatever its value; the job keys are few and fixed.
    assert WRITER_LOCK > 2**32 and sorted(JOBS.values()) == [1, 2]
