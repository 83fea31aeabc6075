"""Statements written once for both stores mean the same on each.

The runtime's SQL is the common ground of SQLite and PostgreSQL (``ON CONFLICT`` for SQLite's
``INSERT OR …``, primary keys for ``rowid``, ``information_schema`` for ``PRAGMA table_info``);
a refused insert fails its transaction on both, which writes nothing. Each test runs on a real SQLite file and
a real PostgreSQL database.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

import pytest

from agent import Conflict, Store, Tx, create_session, enqueue, outbox, parse_content, transfer
from agent.outbox import Attempt

pytestmark = pytest.mark.both_stores


async def test_a_refused_pending_key_fails_its_transaction_and_writes_nothing(db_path: Path | str) -> None:
    """A second queued ``pending_key`` is a Conflict on both stores, raised by the transaction (on
    PostgreSQL by the round trip that carries the row: here its COMMIT); the transaction writes
    nothing, even when its function caught the refusal and went on."""
    store = await Store.open(db_path)
    try:
        sid = await store.transact(lambda tx: create_session(tx))
        await store.transact(lambda tx: enqueue(tx, sid, parse_content("first"), pending_key="k"))
        top = (await store.session_state(sid)).last_seq

        def again(tx: Tx) -> None:
            enqueue(tx, sid, parse_content("second"), pending_key="k")
            enqueue(tx, sid, parse_content("third"))

        def caught(tx: Tx) -> None:
            with contextlib.suppress(Conflict):  # on PostgreSQL nothing is raised here yet
                enqueue(tx, sid, parse_content("second"), pending_key="k")
            enqueue(tx, sid, parse_content("third"))

        for fn in (again, caught):
            with pytest.raises(Conflict, match="pending key 'k' is already queued"):
                await store.transact(fn, session=sid)
        rows = await store.read(
            lambda c: c.execute("SELECT content FROM inbox WHERE session_id=? ORDER BY queued_seq", (sid,)).fetchall()
        )
        assert len(rows) == 1 and "first" in rows[0][0]
        assert (await store.session_state(sid)).last_seq == top  # no event of either was kept
        # The session goes on: the next write is opened on its state as it is.
        await store.transact(lambda tx: enqueue(tx, sid, parse_content("fourth")), session=sid)
        assert (await store.session_state(sid)).last_seq == top + 1
    finally:
        await store.close()


async def test_sealing_twice_makes_one_delivery_and_a_recorded_attempt_is_replaced(db_path: Path | str) -> None:
    store = await Store.open(db_path)
    try:
        await store.transact(lambda tx: outbox.put(tx, "test/kind", {"n": 1}))
        for _ in range(2):
            await store.transact(lambda tx: outbox.seal(tx, 0, lambda kind: ["a", "b"]))
        later = datetime.now(UTC) + timedelta(seconds=5)
        due = await store.read(lambda c: outbox.due(c, later, ["a", "b"]))
        assert sorted(d.sink for d in due) == ["a", "b"]
        mid = due[0].message.id
        await store.transact(lambda tx: outbox.record(tx, mid, "a", 1, Attempt(ok=False, error="refused"), later))
        await store.transact(
            lambda tx: outbox.record(tx, mid, "a", 1, Attempt(ok=True, status=204, seconds=0.25), None)
        )
        attempts = await store.read(lambda c: outbox.attempts(c, mid))
        assert [(a["sink"], a["attempt"], a["ok"], a["status"], a["error"]) for a in attempts] == [
            ("a", 1, True, 204, None)
        ]
        assert await store.read(outbox.backlog) == {"unsealed": 0, "pending": 1, "delivered": 1, "failed": 0}
    finally:
        await store.close()


async def test_a_session_tree_moves_between_the_two_stores(db_path: Path | str, tmp_path: Path) -> None:
    source = await Store.open(db_path)
    other = await Store.open(tmp_path / "other.db")
    try:
        root = await source.transact(lambda tx: create_session(tx))
        await source.transact(lambda tx: create_session(tx, parent_session_id=root, config={"subagent": {}}))
        await source.transact(lambda tx: enqueue(tx, root, parse_content("hello")))
        for table in transfer.TABLES:
            here = await source.read(partial(transfer.table_columns, table=table))
            there = await other.read(partial(transfer.table_columns, table=table))
            assert here == there and len(here) > 2
        doc = await source.read(lambda c: transfer.export_session_tree(c, root))
        assert len(doc["sessions"]) == 2 and len(doc["inbox"]) == 1
        ids = await other.transact(lambda tx: transfer.import_session_tree(tx, doc))
        assert sorted(ids) == sorted(s["id"] for s in doc["sessions"])
        assert await other.read(lambda c: transfer.export_session_tree(c, root)) == doc
        assert await source.read(lambda c: transfer.table_columns(c, "no_such_table")) == set()
    finally:
        await other.close()
        await source.close()
