"""The outbox's writes hold a lock of their own, with the cluster's writer lock shared (issue 30).

Sealing notifications into messages, recording a delivery's attempt and pruning once took the
writer lock alone on PostgreSQL: each node's sender sealed a completed goal's notification, and
while it did every session's write in the cluster waited. Their invariants are the outbox's own (a
notification sealed once, each attempt recorded once, between the nodes' senders), so they hold the
outbox's named lock (``agent.outbox.LOCK``) and the writer lock shared. Pins, against another
connection that holds locks open as a node's transaction would:

* a seal commits while a session's write holds its locks (it used to wait for it);
* a seal waits while another holds the outbox's lock (``pg_locks`` shows it waiting), and seals
  once that one ends, each notification once;
* a seal still waits for a transaction that holds the writer lock alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from clusterkit import until

from agent.backends import NAMED_LOCKS, SESSION_LOCKS, WRITER_LOCK
from agent.outbox import LOCK, backlog, put
from agent.store import Store
from daemon.alerts import NotifySettings
from daemon.alerts.sender import Sender

LIMIT = 10.0
HOLDS = {
    "a session's write": f"pg_advisory_xact_lock_shared({WRITER_LOCK}), pg_advisory_xact_lock({SESSION_LOCKS}, 7)",
    "another seal": (
        f"pg_advisory_xact_lock_shared({WRITER_LOCK}), pg_advisory_xact_lock({NAMED_LOCKS}, hashtext('{LOCK}'))"
    ),
    "the cluster alone": f"pg_advisory_xact_lock({WRITER_LOCK})",
}


@pytest.fixture
def db_path(pg_dsn: str) -> str:
    """This module's stores are PostgreSQL's (the shared ``store`` fixture opens ``db_path``)."""
    return pg_dsn


@pytest.fixture
def holder(pg_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        yield conn


def payload(n: int) -> dict[str, Any]:
    return {"goal": {"id": f"goal_{n}", "key": None, "title": f"goal {n}"}, "status": "completed", "reason": "verified"}


def waiting_on_advisory_lock(dsn: str) -> bool:
    """Whether a connection to this database waits for an advisory lock (not granted), as ``pg_locks`` shows."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return (
            conn.execute(
                "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ).fetchone()
            is not None
        )


@pytest.mark.parametrize("held", list(HOLDS))
async def test_a_seal_waits_only_for_the_outbox_and_the_cluster(
    store: Store, holder: psycopg.Connection[Any], pg_dsn: str, held: str
) -> None:
    sender = Sender(store, NotifySettings.model_validate({"sinks": []}), {})
    await sender.step()  # the first prunes what is old
    for n in range(3):
        await store.transact(lambda tx, n=n: put(tx, "goal_completed", payload(n)))
    holder.execute("BEGIN")
    holder.execute(f"SELECT {HOLDS[held]}")
    step = asyncio.ensure_future(sender.step())
    try:
        if held == "a session's write":
            async with asyncio.timeout(LIMIT):
                await step  # commits beside it
            assert (await store.read(backlog))["unsealed"] == 0
        else:
            await until(lambda: asyncio.to_thread(waiting_on_advisory_lock, pg_dsn), "the seal waits", LIMIT)
            assert not step.done() and (await store.read(backlog))["unsealed"] == 3
    finally:
        holder.execute("ROLLBACK")
    async with asyncio.timeout(LIMIT):
        await step
    assert (await store.read(backlog))["unsealed"] == 0
    sealed = await store.read(lambda conn: conn.execute("SELECT COUNT(DISTINCT message_id) FROM outbox").fetchone())
    assert sealed[0] == 3, "each notification sealed once, into a message of its own"
