"""A transaction's last statement, a read, carries its ``COMMIT`` on PostgreSQL (issue 30).

A goal's evaluation reads the goal and then its round's events, and writes nothing; a spend guard's
load reads its row and then what its calls spent. Each spent a round trip on its ``COMMIT`` alone;
:meth:`agent.tx.Tx.last_read` sends it with the last read instead. Pins, on both stores:

* two reads in a session's transaction opened on the state the node knows are two round trips in
  all (the opening with the first, the ``COMMIT`` with the second), and read what they should;
* a transaction that wrote before its last read commits as any other (its events, its notices);
* a statement after the last read is refused, and the transaction's writes before it stand
  uncommitted by nothing: there were none (``last_read`` commits early only what wrote nothing).
"""

from __future__ import annotations

import pytest

from agent.sessions import create_session
from agent.store import Store
from agent.tx import Tx

pytestmark = pytest.mark.both_stores


async def types_of(store: Store, sid: str) -> list[str]:
    return [e.type for e in await store.events_after(sid, 0)]


async def test_the_last_read_carries_the_commit(store: Store) -> None:
    sid = await store.transact(lambda tx: create_session(tx))
    await store.transact(lambda tx: tx.emit(sid, "test/one", {}), session=sid)

    def read_twice(tx: Tx) -> tuple[int, list[str]]:
        first = tx.one("SELECT COUNT(*) AS n FROM sessions WHERE id=?", (sid,))["n"]
        tx.last_read()
        rows = tx.all("SELECT type FROM events WHERE session_id=? ORDER BY seq", (sid,))
        return int(first), [r["type"] for r in rows]

    before = store.round_trips
    count, types = await store.transact(read_twice, session=sid)
    assert count == 1 and types[-1] == "test/one"
    if before is not None:  # PostgreSQL: the opening with the first read, the COMMIT with the last
        assert store.round_trips == before + 2
    # The transaction is over: the session's next write opens and commits as usual.
    await store.transact(lambda tx: tx.emit(sid, "test/two", {}), session=sid)
    assert (await types_of(store, sid))[-2:] == ["test/one", "test/two"]


async def test_a_transaction_that_wrote_commits_after_its_last_read(store: Store) -> None:
    sid = await store.transact(lambda tx: create_session(tx))

    def write_then_read(tx: Tx) -> int:
        tx.emit(sid, "test/written", {})
        tx.last_read()
        return int(tx.one("SELECT COUNT(*) AS n FROM events WHERE session_id=?", (sid,))["n"])

    seen = await store.transact(write_then_read, session=sid)
    types = await types_of(store, sid)
    assert types[-1] == "test/written" and seen == len(types), "its own event read, and committed"


async def test_nothing_is_sent_after_the_last_read(store: Store) -> None:
    sid = await store.transact(lambda tx: create_session(tx))
    await store.transact(lambda tx: tx.emit(sid, "test/one", {}), session=sid)

    def read_then_write(tx: Tx) -> None:
        tx.last_read()
        tx.one("SELECT 1 AS n")
        tx.emit(sid, "test/after", {})

    if store.kind == "postgresql":
        with pytest.raises(RuntimeError, match="committed with its last read"):
            await store.transact(read_then_write, session=sid)
        assert "test/after" not in await types_of(store, sid)
    else:  # one writer: the read is a read, the COMMIT comes after the function
        await store.transact(read_then_write, session=sid)
        assert (await types_of(store, sid))[-1] == "test/after"
    await store.transact(lambda tx: tx.emit(sid, "test/two", {}), session=sid)
    assert (await types_of(store, sid))[-1] == "test/two"
