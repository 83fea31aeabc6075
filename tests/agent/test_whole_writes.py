"""A write that sends nothing before its end goes as one text with no ``BEGIN`` and no ``COMMIT``
(PostgreSQL; issue 30).

Most of a session's writes are one round trip: the opening (the locks, the check of the state the
node knows), the deferred inserts, the fences and the notices, and the ``COMMIT``, in one text.
PostgreSQL runs the statements of one text as one transaction, committed after the last and rolled
back whole if one fails, so the ``BEGIN`` and the ``COMMIT`` are two statements of work for the
server and nothing for the transaction: they are left out, and the opening's locks and checks join
the ``SELECT`` of the fences and notices. Pins, on a real PostgreSQL database:

* such a write is one text, starting with the check, with neither ``BEGIN`` nor ``COMMIT``, and it
  commits (its event stored, its connection not left in a transaction);
* it is atomic: a statement of it that fails takes every earlier one back, and the session's next
  write commits; so too when a read's ``ROLLBACK`` goes first in its text (the read ends, and the
  statements after it are a transaction of their own);
* a write that writes nothing still sends its check (what it decided on the known state counts
  only if that state was current), and a write that reads first keeps its ``BEGIN`` and ``COMMIT``;
* its events go in the same statement as its check, after it (``goald_events``, agent schema
  version 9), stored exactly (quotes, backslashes, newlines, any character) and numbered gap-free.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from functools import partial

import psycopg
import pytest

from agent import create_session
from agent.db import PgConn
from agent.store import Store
from agent.tx import Tx


@pytest.fixture
async def one_lane(pg_dsn: str) -> AsyncIterator[Store]:
    store = await Store.open(pg_dsn, connections=1)
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every text the store's connections send with several statements (or deferred ones)."""
    texts: list[str] = []
    send = PgConn._send

    def recording(self: PgConn, text: str) -> object:
        texts.append(text)
        return send(self, text)

    monkeypatch.setattr(PgConn, "_send", recording)
    return texts


async def types_of(store: Store, sid: str) -> list[str]:
    return [e.type for e in await store.events_after(sid, 0)]


def half_written(sid: str, tx: Tx) -> None:
    """An event, then a statement that fails: the write's text fails after its event's insert."""
    tx.emit(sid, "test/lost", {})
    tx.write("INSERT INTO no_such_table(id) VALUES (?)", (1,))


def without_rollback(text: str) -> str:
    """The text without the ``ROLLBACK`` of a read before it on the connection (agent.db.PgConn.end_read)."""
    return text.removeprefix("ROLLBACK; ")


async def test_a_write_sent_whole_has_no_begin_and_no_commit(one_lane: Store, sent: list[str]) -> None:
    store = one_lane
    sid = await store.transact(lambda tx: create_session(tx))
    await store.transact(lambda tx: tx.emit(sid, "test/first", {}), session=sid)
    sent.clear()
    await store.transact(lambda tx: tx.emit(sid, "test/whole", {}), session=sid)
    assert len(sent) == 1
    text = without_rollback(sent[0])
    assert text.startswith("SELECT CASE WHEN goald_check(") and "THEN goald_events(" in text and "pg_notify(" in text
    assert "INSERT INTO events" not in text, "its event went with its check"
    assert "BEGIN" not in text and "COMMIT" not in text
    assert (await types_of(store, sid))[-1] == "test/whole"
    in_tx = await store.read(
        lambda conn: conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'goald' AND state LIKE 'idle in%'"
        ).fetchone()[0]
    )
    assert in_tx == 0


async def test_a_write_sent_whole_is_atomic(one_lane: Store, sent: list[str]) -> None:
    store = one_lane
    sid = await store.transact(lambda tx: create_session(tx))
    await store.transact(lambda tx: tx.emit(sid, "test/first", {}), session=sid)

    with pytest.raises(psycopg.errors.UndefinedTable):
        await store.transact(partial(half_written, sid), session=sid)
    assert "BEGIN" not in without_rollback(sent[-1]), "it went whole"
    assert "test/lost" not in await types_of(store, sid), "the event before the failure was taken back"
    await store.transact(lambda tx: tx.emit(sid, "test/next", {}), session=sid)
    assert (await types_of(store, sid))[-2:] == ["test/first", "test/next"]


async def test_a_write_of_nothing_still_checks_and_one_that_reads_keeps_begin(one_lane: Store, sent: list[str]) -> None:
    store = one_lane
    sid = await store.transact(lambda tx: create_session(tx))
    await store.transact(lambda tx: tx.emit(sid, "test/first", {}), session=sid)
    sent.clear()
    before = store.round_trips
    assert await store.transact(lambda tx: tx.state(sid).last_seq, session=sid) == 2
    assert store.round_trips == (before or 0) + 1
    assert without_rollback(sent[-1]).startswith("SELECT goald_check("), "the check ran"

    def read_then_write(tx: Tx) -> None:
        tx.one("SELECT count(*) FROM events WHERE session_id=?", (sid,))
        tx.emit(sid, "test/after-read", {})

    sent.clear()
    await store.transact(read_then_write, session=sid)
    assert without_rollback(sent[0]).startswith("BEGIN; SELECT goald_check(") and sent[-1].endswith("COMMIT")
    assert (await types_of(store, sid))[-1] == "test/after-read"


async def test_events_sent_with_the_check_are_stored_exactly(one_lane: Store, sent: list[str]) -> None:
    store = one_lane
    sid = await store.transact(lambda tx: create_session(tx))
    await store.transact(lambda tx: tx.emit(sid, "test/first", {}), session=sid)
    data = {"text": 'it\'s a \\ back\nslash, "quoted", ünïcode 🙂, 100%', "n": [1, 2.5, None, True]}

    def two(tx: Tx) -> None:
        tx.emit(sid, "test/a", data)
        tx.emit(sid, "test/b", {"plain": "x"})

    sent.clear()
    await store.transact(two, session=sid)
    assert len(sent) == 1 and "goald_events(" in sent[0] and "INSERT INTO events" not in sent[0]
    events = await store.events_after(sid, 0)
    assert [(e.type, e.data) for e in events[-2:]] == [("test/a", data), ("test/b", {"plain": "x"})]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))


async def test_a_write_sent_after_a_read_is_its_own_transaction(one_lane: Store, sent: list[str]) -> None:
    """The read's ``ROLLBACK`` goes first in the write's text: it ends the read, and the statements
    after it are a transaction of their own, still rolled back whole when one fails."""
    store = one_lane
    sid = await store.transact(lambda tx: create_session(tx))
    await store.transact(lambda tx: tx.emit(sid, "test/first", {}), session=sid)

    gate = threading.Event()
    held = asyncio.ensure_future(store.read(lambda conn: (conn.execute("SELECT 1").fetchone(), gate.wait(10))))
    failing = asyncio.ensure_future(store.transact(partial(half_written, sid), session=sid))
    await asyncio.sleep(0)  # the write is queued behind the read on the one connection
    gate.set()
    await held
    with pytest.raises(psycopg.errors.UndefinedTable):
        await failing
    assert sent[-1].startswith("ROLLBACK; SELECT CASE WHEN goald_check("), "the read's end went first"
    assert "test/lost" not in await types_of(store, sid), "the write's statements were one transaction"
    await store.transact(lambda tx: tx.emit(sid, "test/next", {}), session=sid)
    assert (await types_of(store, sid))[-2:] == ["test/first", "test/next"]


async def test_a_commit_that_only_reads_ends_its_transaction_with_them(one_lane: Store) -> None:
    """What a transaction reads with its ``COMMIT`` (``agent.pgtx.commit``'s reads, an idle's
    evaluation: ``tests/goals/test_read_at_idle.py``) when it has nothing else to send: the reads
    and the ``COMMIT`` in one round trip, and the connection ready for its next transaction."""
    from agent import pgtx

    def run(conn: PgConn) -> tuple[list[list[int]], bool, int, int]:
        conn.execute("BEGIN")
        conn.execute("SELECT 1")
        trips = conn.trips
        got = pgtx.commit(conn, [], (), [("SELECT ? AS n", (2,)), ("SELECT ? AS n UNION ALL SELECT ?", (3, 4))])
        trips = conn.trips - trips
        ended = conn.in_transaction
        return [[r["n"] for r in rows] for rows in got], ended, trips, conn.execute("SELECT 5 AS k").fetchone()["k"]

    (got, in_transaction, trips, after), _ = await one_lane.maintain(run)
    assert got == [[2], [3, 4]]
    assert (in_transaction, trips, after) == (False, 1, 5)
