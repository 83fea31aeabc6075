"""A PostgreSQL transaction's event inserts travel with its next statement or its ``COMMIT``
(issue 30: fewer round trips per round), and mean exactly what they meant when each was a round
trip of its own: a later statement of the transaction reads them, a savepoint rolled back takes back
those made inside it and keeps those made before, a rolled-back transaction leaves none behind for
the next one on the connection.
"""

from __future__ import annotations

import pytest

from agent.db import PgConn, savepoint
from agent.ids import MessageId
from agent.inbox import enqueue
from agent.messages import parse_content
from agent.sessions import create_session
from agent.store import Store
from agent.tx import Tx


@pytest.fixture
def db_path(pg_dsn: str) -> str:
    """This module's stores are PostgreSQL's (the shared ``store`` fixture opens ``db_path``)."""
    return pg_dsn


def stored(tx: Tx, sid: str) -> list[str]:
    return [r[0] for r in tx.all("SELECT type FROM events WHERE session_id = ? ORDER BY seq", (sid,))]


async def test_a_later_statement_reads_what_was_deferred(store: Store) -> None:
    sid = await store.transact(lambda tx: create_session(tx))

    def run(tx: Tx) -> list[str]:
        tx.emit(sid, "test/one", {"n": 1})
        tx.emit(sid, "test/two", {"text": "it's 100% {quoted} \\ here"})
        return stored(tx, sid)

    seen = await store.transact(run, session=sid)
    assert seen[-2:] == ["test/one", "test/two"]
    events = await store.events_after(sid, 0)
    assert events[-1].data == {"text": "it's 100% {quoted} \\ here"}  # as given, through the literal
    assert [e.seq for e in events] == list(range(1, len(events) + 1))


async def test_trailing_inserts_go_with_the_commit(store: Store) -> None:
    sid = await store.transact(lambda tx: create_session(tx))
    statements: list[str] = []
    await store.trace(statements.append)
    try:
        await store.transact(lambda tx: enqueue(tx, sid, parse_content("hi"), message_id=MessageId.new()), session=sid)
    finally:
        await store.trace(None)
    [commit] = [s for s in statements if s.rstrip().endswith("COMMIT")]
    assert "INSERT INTO events" in commit
    assert "message/queued" in [e.type for e in await store.events_after(sid, 0)]


async def test_a_savepoint_rolled_back_takes_back_only_its_own(store: Store) -> None:
    sid = await store.transact(lambda tx: create_session(tx))

    def run(tx: Tx) -> None:
        tx.emit(sid, "test/before", {})
        with pytest.raises(RuntimeError), savepoint(tx.conn):
            tx.emit(sid, "test/inside", {})
            tx.execute("SELECT 1")
            raise RuntimeError("undo the inside")
        tx.events = [e for e in tx.events if e.type != "test/inside"]

    await store.transact(run)
    types = [e.type for e in await store.events_after(sid, 0)]
    assert "test/before" in types and "test/inside" not in types


async def test_a_rolled_back_transaction_leaves_nothing_for_the_next(store: Store) -> None:
    sid = await store.transact(lambda tx: create_session(tx))

    def fails(tx: Tx) -> None:
        tx.emit(sid, "test/rolled-back", {})
        raise RuntimeError("the transaction fails after its insert was deferred")

    for _ in range(3):  # on the session's connection, which runs its next transaction too
        with pytest.raises(RuntimeError):
            await store.transact(fails, session=sid)
    await store.transact(lambda tx: tx.emit(sid, "test/next", {}), session=sid)
    types = [e.type for e in await store.events_after(sid, 0)]
    assert "test/rolled-back" not in types and types[-1] == "test/next"
    seqs = [e.seq for e in await store.events_after(sid, 0)]
    assert seqs == list(range(1, len(seqs) + 1))


async def test_a_write_s_own_literals_are_quoted_as_the_server_reads_them(store: Store) -> None:
    """``BEGIN`` and ``COMMIT`` texts quote their ids and payloads by hand when they are plain, and
    by psycopg otherwise: either way the server reads back exactly the text."""
    from agent.pgtext import quoted

    texts = ['{"n":"abc","s":{"ses_1":[1,2]}}', "goald_events", "it's", "back\\slash", "line\nbreak", "100%"]

    def run(conn: object) -> list[str]:
        assert isinstance(conn, PgConn)
        return [conn.execute(f"SELECT {quoted(conn, t)}::text").fetchone()[0] for t in texts]

    assert await store.read(run) == texts


async def test_rows_inserted_one_after_another_go_as_one_statement(store: Store) -> None:
    """Three events of one transaction: one ``INSERT`` of three rows, read back as three events."""
    sid = await store.transact(lambda tx: create_session(tx))
    sent: list[str] = []

    def run(tx: Tx) -> list[str]:
        conn = tx.conn
        assert isinstance(conn, PgConn)
        assert conn.take_deferred() == []  # the transaction's opening sent all before it
        for n in range(3):
            tx.emit(sid, "test/row", {"n": n, "text": "a, b), (c"})
        sent.extend(conn.take_deferred())
        for text in sent:
            conn.script(text)
        return stored(tx, sid)

    seen = await store.transact(run, session=sid)
    assert len(sent) == 1 and sent[0].startswith("INSERT INTO events(") and sent[0].count("'test/row'") == 3
    assert seen[-3:] == ["test/row"] * 3
    events = await store.events_after(sid, 0)
    assert [e.data for e in events[-3:]] == [{"n": n, "text": "a, b), (c"} for n in range(3)]
