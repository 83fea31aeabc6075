"""How a PostgreSQL transaction of goald's opens and ends: the texts its connection sends.

:class:`agent.backends.PgBackend` runs the store's units of work on its connections; these are the
statements each unit sends around its own: a read's snapshot (opened with its first statement,
ended with the connection's next: :func:`open_read`, :func:`end_read`), a write's locks and the
check of the state it was decided on (:func:`begin`), and its end — the fences, the notices and
what was deferred, in one text (:func:`commit`). ``docs/architecture.md`` ("The writer lock", "Round
trips per write") says which invariant each lock keeps and why each write costs the round trips it does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agent.db import Conn, PgConn, result_sets
from agent.pgtext import quoted
from agent.tx import Query, SessionState

#: The advisory lock key every PostgreSQL write transaction takes (``goald`` in ASCII): exclusive,
#: or shared by a transaction whose invariants are its sessions' own (:func:`begin`).
WRITER_LOCK = 0x676F616C64
#: The first key of a session's advisory lock (``goal`` in ASCII); the second is the hash of its id.
SESSION_LOCKS = 0x676F616C
#: The first key of a named lock (``goan`` in ASCII; the second is the hash of its name): a write bound
#: to no session whose invariants are that name's holds it and the writer lock shared (:func:`begin`).
NAMED_LOCKS = 0x676F616E
#: The SQLSTATE of a session's write opened on a state another writer changed since (``goald_check``).
STALE_STATE = "GD002"
#: The opening of a session's write on the state this node knows: the locks, then the state checked
#: (``goald_check``, agent schema version 7); such a write's events may go in the same statement (:func:`commit`).
CHECK = "goald_check("


def open_read(conn: Conn) -> None:
    """Open a read snapshot with the read's first statement, in its round trip (``open_later``)."""
    assert isinstance(conn, PgConn)
    conn.open_read()


def end_read(conn: Conn) -> None:
    """End the read: its ``ROLLBACK`` goes with the connection's next text (:meth:`PgConn.end_read`)."""
    assert isinstance(conn, PgConn)
    conn.end_read()


def begin(conn: Conn, session: str | None = None, known: SessionState | None = None, named: str | None = None) -> Any:
    """Open a write transaction and take the writer lock, sent first in the transaction's first
    round trip, its first statement or its ``COMMIT`` (:meth:`agent.db.PgConn.open_later`): every
    statement runs after the lock. Exclusive: the transaction runs alone in the cluster. With
    ``session``, for a transaction whose invariants are that session's own: the writer lock shared
    and the session's lock (:func:`lock_session`), so that such transactions of different sessions
    run at once, on every node, while one that needs the cluster to itself still waits for all of
    them (and they for it); and then, in the same statement (``goald_begin``, :mod:`agent.schema`'s
    version 6), the session's state (:func:`agent.tx.state_query`'s columns), whose row is returned
    (``None``: no such session) — read after the locks, so it is current.

    With ``known`` (the session's state as this node last committed it), nothing is sent now and
    ``known`` is returned: the opening goes first in the transaction's next round trip, with the
    same locks and a check that the state is still ``known`` (``goald_check``, version 7), which
    fails the transaction otherwise (:func:`stale`): what was decided on ``known`` commits only if
    it was current. A write whose only statements are deferred is one round trip (:func:`commit`).

    With ``named`` (and no ``session``): the writer lock shared and that name's lock, for a write
    whose invariants are that name's (the outbox's: notifications sealed once, each delivery
    recorded once): such writes run one at a time, and sessions' writes go on meanwhile."""
    assert isinstance(conn, PgConn)
    conn.drop_pending()  # nothing of an earlier transaction goes with this one
    if session is None:
        lock = f"pg_advisory_xact_lock({WRITER_LOCK})"
        if named is not None:
            name = f"{NAMED_LOCKS}, hashtext({quoted(conn, named)})"
            lock = f"pg_advisory_xact_lock_shared({WRITER_LOCK}), pg_advisory_xact_lock({name})"
        conn.open_later("BEGIN", lock)  # with the first statement: every one after the lock
        return None
    from agent.events import EventType

    status = quoted(conn, EventType.STATUS.value)
    if known is not None:
        turn = "NULL" if known.open_turn is None else quoted(conn, known.open_turn)
        conn.open_later(
            "BEGIN",
            f"{CHECK}{WRITER_LOCK}, {SESSION_LOCKS}, {quoted(conn, session)}, {status},"
            f" {known.last_seq}, {known.status_seq}, {turn})",
        )
        return known
    # Both locks, then the state read after them, in one statement (agent.schema's version 6).
    text = f"BEGIN; SELECT * FROM goald_begin({WRITER_LOCK}, {SESSION_LOCKS}, {quoted(conn, session)}, {status})"
    cursor = conn.script(text)
    while cursor.nextset():  # to the last statement's result: the state
        pass
    return cursor.fetchone()


def stale(exc: BaseException) -> bool:
    """Whether ``exc``, or an error it was raised while handling, is a write's opening that found
    its session changed (:func:`begin`'s ``known``): then the transaction failed there."""
    seen: BaseException | None = exc
    while seen is not None and getattr(seen, "sqlstate", None) != STALE_STATE:
        seen = seen.__context__
    return seen is not None


def lock_session(conn: Conn, session_id: str) -> None:
    """Take ``session_id``'s lock until the transaction ends (two ids of the same hash share one:
    they only wait for each other). Taken before the session's state is read: in PostgreSQL's
    READ COMMITTED each statement sees what was committed before it began, so the read after
    the lock sees every commit of the previous holder."""
    conn.execute("SELECT pg_advisory_xact_lock(?, hashtext(?))", (SESSION_LOCKS, session_id))


def commit(conn: Conn, notes: list[str], first: Sequence[str] = (), reads: Sequence[Query] = ()) -> list[list[Any]]:
    """Check ``first`` (expressions of no parameters: a lease fence, which fails the transaction),
    send ``notes`` on :data:`agent.relay.CHANNEL`, send the transaction's deferred inserts, run
    ``reads`` and commit, in one round trip; returns each read's rows. The fences and the notices
    are one ``SELECT``, and the payloads are quoted as literals (goald's own JSON of session ids and
    numbers), so the statements need no parameters and go as one text (a statement that fails ends
    the text there, and the transaction is rolled back; a notice is only delivered by the
    ``COMMIT``; the reads see what the transaction wrote). A transaction that sent nothing before
    (its opening still to send, a state check that must still run even when nothing is written)
    goes whole as one text with no ``BEGIN`` and no ``COMMIT``: its locks and checks first in the
    same ``SELECT``, and a session's write its events too, after its check (a ``CASE``: evaluated
    in order), as ``goald_events``' one argument."""
    assert isinstance(conn, PgConn)
    if conn.ended:  # committed with its last read (agent.tx.Tx.last_read): nothing was written after
        conn.ended = False
        return [[] for _ in reads]
    locks = conn.unsent_locks()  # nothing sent yet: one text, its own transaction, no BEGIN/COMMIT
    if locks is not None and locks.startswith(CHECK) and (rows := conn.take_events()) is not None:
        # Its events inserted after its check, in the same statement (agent.schema's version 9).
        locks = f"CASE WHEN {locks} THEN goald_events({quoted(conn, rows)}) END"
    deferred = conn.take_deferred()  # the transaction's trailing inserts: after the fences
    if not notes and not first and not deferred and locks is None:
        if reads:
            conn.end_with_next()  # the COMMIT goes after the reads, in their round trip
            got = conn.reads(reads)
            conn.ended = False  # ended here, by its commit
            return got
        conn.execute("COMMIT")
        return []
    from agent.relay import CHANNEL

    channel = quoted(conn, CHANNEL)
    checks = [*([locks] if locks else []), *first, *(f"pg_notify({channel}, {quoted(conn, n)})" for n in notes)]
    select = ["SELECT " + ", ".join(checks)] if checks else []
    texts = [*select, *deferred, *(conn.literal(sql, params) for sql, params in reads)]
    cursor = conn.script("; ".join([*texts, *([] if locks else ["COMMIT"])]))
    if not reads:
        return []
    results = result_sets(cursor)  # the reads' are the last before the COMMIT's
    end = len(results) - (0 if locks else 1)
    return results[end - len(reads) : end]


__all__ = [
    "NAMED_LOCKS",
    "SESSION_LOCKS",
    "STALE_STATE",
    "WRITER_LOCK",
    "begin",
    "commit",
    "end_read",
    "lock_session",
    "open_read",
    "stale",
]
