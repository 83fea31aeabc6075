"""The two stores' common ground: the connection every transaction function receives, and how one
SQL text serves SQLite and PostgreSQL.

goald's transaction functions are synchronous functions of a connection, run on the store's own
thread (:mod:`agent.store` says why). They are written against :class:`Conn`, the part of
:class:`sqlite3.Connection` they use (``execute`` returning a cursor whose rows answer both
``row[0]`` and ``row["name"]``). On SQLite that *is* the ``sqlite3`` connection; on PostgreSQL it is
a :class:`PgConn`, a thin wrapper of a synchronous psycopg 3 connection that

- rewrites SQLite's placeholders (``?`` and ``:name``) into psycopg's (``%s``, ``%(name)s``), a
  literal ``%`` into ``%%``, and ``json_extract(col, '$.a.b')`` into ``(col::jsonb #>> '{a,b}')``
  (:func:`agent.pgtext.pg_sql`, cached per text);
- loads ``numeric`` (what ``SUM`` of a ``BIGINT`` gives) as ``int`` or ``float`` and sends a Python
  ``bool`` as ``0``/``1``, since both stores keep flags in integer columns;
- defers a statement whose result nobody reads (a transaction's event inserts: :meth:`PgConn.defer`)
  to travel, with its values as literals, in one text with the next statement or the ``COMMIT``:
  across a network a write costs its round trips.

Everything else is written once, in the SQL both speak (``ON CONFLICT … DO NOTHING/UPDATE``,
``RETURNING``, partial indexes, ``COALESCE``); what cannot be (``PRAGMA``, ``VACUUM``, a trigger's
body) asks :func:`is_postgres` and says so where it branches.

Two behaviours differ and every caller that meets them uses the helpers here: a statement that
fails inside a PostgreSQL transaction aborts the whole transaction, so a caller that catches a
constraint error and goes on wraps the statement in :func:`savepoint` (a refusal that is the
caller's error instead fails the transaction on both stores: :meth:`agent.tx.Tx.write`); and the
constraint errors are caught as :func:`integrity_errors` (either driver's).

psycopg is an extra (``pip install 'goald[postgresql]'``) and imported only for a PostgreSQL store
(:func:`psycopg_module`): a SQLite daemon never loads it. Until it is loaded no psycopg error can
be raised, so the error tuples name its classes only once it is.

Why psycopg 3 and not asyncpg: the transaction functions are synchronous on purpose (one thread
hop per transaction, decisions made from what was read with no ``await`` in between, so no other
coroutine sees a half-made decision). psycopg's synchronous connection runs them unchanged on the
store thread, as ``sqlite3`` does; asyncpg is asyncio-only, and would turn every statement into an
``await`` and every transaction function into a coroutine. psycopg also gives ``LISTEN``/``NOTIFY``
(:meth:`psycopg.Connection.notifies`) and prepares repeated statements by itself. One connection
per store thread: a node opens ``store_connections`` of them (each session's work always on the
same one, :mod:`agent.backends`) and a listener.
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from agent.errors import NotSupported
from agent.pgtext import Row, configure, pg_sql

if TYPE_CHECKING:
    import psycopg

#: What installs the PostgreSQL driver.
PSYCOPG_INSTALL = "pip install 'goald[postgresql]'"


def psycopg_module() -> ModuleType:
    """psycopg, imported on first use.

    Raises:
        NotSupported: it is not installed (naming :data:`PSYCOPG_INSTALL`).
    """
    try:
        import psycopg
    except ImportError:
        raise NotSupported(f"a PostgreSQL store needs psycopg, which is not installed: {PSYCOPG_INSTALL}") from None
    return psycopg


def _loaded(name: str) -> tuple[type[Exception], ...]:
    """psycopg's exception class ``name`` if psycopg is loaded (else none can have been raised)."""
    pg = sys.modules.get("psycopg")
    return (getattr(pg, name),) if pg is not None else ()


def integrity_errors() -> tuple[type[Exception], ...]:
    """Either driver's constraint error (a unique index, a check, a trigger's refusal)."""
    return (sqlite3.IntegrityError, *_loaded("IntegrityError"))


def database_errors() -> tuple[type[Exception], ...]:
    """Either driver's error."""
    return (sqlite3.Error, *_loaded("Error"))


def pg_errors() -> tuple[type[Exception], ...]:
    """psycopg's errors (``psycopg.Error``), for code that runs on PostgreSQL only."""
    return _loaded("Error")


class Cursor(Protocol):
    """What a transaction function uses of a cursor."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Conn(Protocol):
    """What a transaction function uses of a connection: :class:`sqlite3.Connection` or :class:`PgConn`."""

    def execute(self, sql: str, parameters: Sequence[Any] | Mapping[str, Any] = ..., /) -> Any: ...

    @property
    def in_transaction(self) -> bool: ...


def is_postgres(conn: object) -> bool:
    """Whether ``conn`` is a PostgreSQL store's connection."""
    return isinstance(conn, PgConn)


def is_dsn(location: object) -> bool:
    """Whether a store location names a PostgreSQL database (``postgresql://…``/``postgres://…``)."""
    return isinstance(location, str) and location.startswith(("postgresql://", "postgres://"))


@contextlib.contextmanager
def savepoint(conn: Conn, name: str = "goald_sp") -> Iterator[None]:
    """Run the block so that a statement failing in it leaves the transaction usable (PostgreSQL
    aborts the whole transaction otherwise); the error still propagates. A no-op on SQLite, where a
    failed statement undoes only itself."""
    if not isinstance(conn, PgConn):
        yield
        return
    conn.defer(f"SAVEPOINT {name}")  # made with the block's first statement, in its round trip
    try:
        yield
    except BaseException:
        # Not made if what failed came before it in that round trip (the transaction's opening found
        # its session changed, an earlier deferred statement failed): that failure is what propagates.
        with contextlib.suppress(psycopg_module().errors.InvalidSavepointSpecification):
            conn.script(f"ROLLBACK TO SAVEPOINT {name}; RELEASE SAVEPOINT {name}")
        raise
    conn.defer(f"RELEASE SAVEPOINT {name}")


# -- PostgreSQL ------------------------------------------------------------------------------------

#: The head of an event row's insert (agent.tx.Tx.emit), and its row: deferred with its values, which
#: go as literals with the next statement or, with a write's check, as ``goald_events``' JSON.
EVENTS_INSERT = "INSERT INTO events(session_id, seq, type, data, at)"
_EVENT_ROW = "(?,?,?,?,?)"
#: A deferred ``INSERT`` of one row (its head, its row of parameters), which rows of the same head
#: join (:meth:`PgConn.take_deferred`).
_INSERT_ROW = re.compile(r"(INSERT INTO \w+\([\w, ]+\)) VALUES (\([?, ]+\))")


class _Rows(list[Any]):
    """A read's rows, already fetched, as a cursor gives them (:meth:`PgConn.end_with_next`)."""

    def fetchone(self) -> Any:
        return self[0] if self else None

    def fetchall(self) -> list[Any]:
        return list(self)


class PgConn:
    """A psycopg 3 connection (autocommit; goald sends its own ``BEGIN``/``COMMIT``) behind :class:`Conn`."""

    def __init__(self, raw: psycopg.Connection[Any]) -> None:
        self.raw = raw
        #: Called with each statement's text before it runs (benchmarks count them), or ``None``.
        self.trace: Callable[[str], None] | None = None
        #: Statements whose results nobody reads (a transaction's event inserts: :meth:`defer`),
        #: sent with the next statement or the ``COMMIT``, in its round trip: each an ``INSERT``'s
        #: head and its row (rows of one head in a row go as one statement), or ``None`` and the text.
        self._deferred: list[tuple[str | None, str | tuple[Any, ...]]] = []
        #: A transaction's opening not sent yet (:meth:`open_later`): it goes first in the next text.
        self._opening: str | None = None
        self._locks: str | None = None  # the opening's SELECT of locks and checks (open_later)
        #: A read ended whose ``ROLLBACK`` is not sent yet (:meth:`end_read`): it goes first in the
        #: next text, or alone when the connection's lane waits for work (:meth:`flush`).
        self._closing = False
        #: :meth:`end_with_next` asked: the next statement carries the ``COMMIT``; then ``ended``.
        self._ending = False
        #: The transaction was committed with its last read (:meth:`end_with_next`).
        self.ended = False
        #: Client round trips made (each ``execute`` of the driver: one statement or one text).
        self.trips = 0
        #: The transaction's deferred statements' refusals (:meth:`defer`'s ``refused``): each maps
        #: a failure of its own statement to the caller's error, ``None`` for any other failure.
        self._refused: list[Callable[[Exception], BaseException | None]] = []
        self._failed: BaseException | None = None  # the refusal that failed the transaction
        self._client: Any = None  # a ClientCursor, made on the first deferred statement (literal)
        configure(raw)

    def literal(self, sql: str, parameters: Sequence[Any] | Mapping[str, Any]) -> str:
        """``sql`` with its parameters merged in as literals (quoted by psycopg, as the server would
        read them), so that it can travel in one text with others."""
        if self._client is None:
            from psycopg import ClientCursor

            self._client = ClientCursor(self.raw)  # only renders (mogrify): one serves every statement
        text: str = self._client.mogrify(pg_sql(sql), parameters or ())
        return text

    def defer(
        self,
        sql: str,
        parameters: Sequence[Any] | Mapping[str, Any] = (),
        /,
        refused: Callable[[Exception], BaseException | None] | None = None,
    ) -> None:
        """Run ``sql`` with the next statement (before it) or the ``COMMIT``: for a statement whose
        result nobody reads; what is deferred is read by every later statement, as if it had run.

        ``refused`` maps a failure of this statement (a constraint it breaks, a check it makes:
        :meth:`agent.tx.Tx.write`) to the error its caller raises, ``None`` for any other failure:
        whichever round trip carries it raises that error instead of the driver's."""
        if refused is not None:
            self._refused.append(refused)
        if self.trace is not None:
            self.trace(sql)
        self._sendable()
        insert = _INSERT_ROW.fullmatch(sql)
        if insert is not None and insert[1] == EVENTS_INSERT and refused is None and isinstance(parameters, tuple):
            self._deferred.append((insert[1], parameters))  # rendered when sent (take_events, take_deferred)
        elif insert is not None:
            self._deferred.append((insert[1], self.literal(insert[2], parameters)))
        else:
            self._deferred.append((None, self.literal(sql, parameters)))

    def open_later(self, text: str, locks: str | None = None) -> None:
        """Send ``text`` (a transaction's ``BEGIN``) and ``SELECT locks`` (its locks and checks,
        expressions of no parameters) first in the next round trip: the transaction's first
        statement or its ``COMMIT`` (then with no ``BEGIN`` at all: :meth:`unsent_locks`)."""
        self._opening = text if locks is None else f"{text}; SELECT {locks}"
        self._locks = locks
        if self.trace is not None:
            self.trace(self._opening)

    def unsent_locks(self) -> str | None:
        """The locks of a write's opening when nothing of the transaction was sent yet (taken: they
        are the caller's to send now). Its writes and its locks can then go as one text with no
        ``BEGIN`` and no ``COMMIT``: PostgreSQL runs the statements of one text as one transaction,
        committed after the last, all rolled back if one fails."""
        if self._opening is None or self._locks is None:
            return None
        locks, self._opening, self._locks = self._locks, None, None
        return locks

    def open_read(self) -> None:
        """Open a read transaction (one snapshot, no lock) with its first statement, in its round trip."""
        self.open_later("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")

    def end_read(self) -> None:
        """A read transaction (opened with :meth:`open_read`) ends: nothing to send if it sent
        nothing; else its ``ROLLBACK`` goes first in the connection's next round trip, or alone once
        its lane has nothing to do (:meth:`flush`), so that a read costs no round trip of its own to
        end and no snapshot is held while the connection waits."""
        if self._opening is not None:
            self._opening, self._locks = None, None  # never opened
            return
        self._closing = True

    @property
    def closing(self) -> bool:
        """Whether a read's ``ROLLBACK`` is still to be sent (:meth:`end_read`)."""
        return self._closing

    def flush(self) -> None:
        """Send a read's ``ROLLBACK`` still pending (:meth:`end_read`) now."""
        if self._closing:
            self._closing = False
            self.trips += 1
            self.raw.execute(b"ROLLBACK", prepare=False)

    def drop_pending(self) -> None:
        """Forget what was to go with the next statement (a transaction that failed before sending it)."""
        self._deferred, self._opening, self._locks, self._ending, self.ended = [], None, None, False, False
        self._refused, self._failed = [], None

    def end_with_next(self) -> None:
        """Send the ``COMMIT`` with the next statement, the transaction's last, a read (whose rows
        :meth:`execute` returns): one round trip less. Only in a transaction that has deferred
        nothing (else the ``COMMIT`` goes as usual, after the function)."""
        self._ending = not self._deferred

    def _pending(self) -> list[str]:
        """What goes first in this round trip: the end of the read before, the transaction's opening,
        then what was deferred."""
        closing, self._closing = ["ROLLBACK"] if self._closing else [], False
        opening, self._opening, self._locks = self._opening, None, None
        return [*closing, *([opening] if opening is not None else []), *self.take_deferred()]

    def _has_pending(self) -> bool:
        return bool(self._deferred) or self._opening is not None or self._closing

    def take_events(self) -> str | None:
        """The deferred event rows, as the JSON array ``goald_events`` takes (``None``: none), taken
        out of what is deferred (:func:`agent.pgtx.commit` sends them with the write's check)."""
        rows = [list(values) for head, values in self._deferred if head == EVENTS_INSERT and isinstance(values, tuple)]
        if not rows:
            return None
        self._deferred = [d for d in self._deferred if not (d[0] == EVENTS_INSERT and isinstance(d[1], tuple))]
        return json.dumps(rows, separators=(",", ":"))

    def take_deferred(self) -> list[str]:
        """The deferred statements, to send now (with the ``COMMIT``); none are left deferred. Rows
        inserted one after another into the same columns go as one ``INSERT`` of several rows."""
        out: list[str] = []
        last: str | None = None
        for head, values in self._deferred:
            text = values if isinstance(values, str) else self.literal(_EVENT_ROW, values)
            if head is not None and head == last:
                out[-1] += ", " + text
            else:
                out.append(text if head is None else f"{head} VALUES {text}")
            last = head
        self._deferred = []
        return out

    def execute(self, sql: str, parameters: Sequence[Any] | Mapping[str, Any] = (), /) -> Any:
        """Run one statement written with SQLite's placeholders (after what was deferred, in one
        round trip with it)."""
        if self.trace is not None:
            self.trace(sql)
        self._sendable()
        self.trips += 1
        if self._ending:
            return _Rows(self._reads([(sql, parameters)])[0])  # with the COMMIT after it
        if self._has_pending():
            cursor = self._send("; ".join([*self._pending(), self.literal(sql, parameters)]))
            while cursor.nextset():  # to this statement's result, the last
                pass
            return cursor
        # Always parameters (maybe none): psycopg then turns the escaped ``%%`` back into ``%``.
        return self.raw.execute(pg_sql(sql), parameters or ())

    def reads(self, queries: Sequence[tuple[str, Sequence[Any] | Mapping[str, Any]]]) -> list[list[Any]]:
        """Run reads (after what is pending, and with the ``COMMIT`` after them when
        :meth:`end_with_next` asked) in one round trip: each one's rows."""
        for sql, _ in queries:
            if self.trace is not None:
                self.trace(sql)
        self._sendable()
        self.trips += 1
        return self._reads(queries)

    def _reads(self, queries: Sequence[tuple[str, Sequence[Any] | Mapping[str, Any]]]) -> list[list[Any]]:
        ending, self._ending = self._ending, False
        self.ended = ending
        texts = [*self._pending(), *(self.literal(sql, parameters) for sql, parameters in queries)]
        if ending:
            texts.append("COMMIT")
        results = result_sets(self._send("; ".join(texts)))
        if ending:
            results.pop()
        return results[len(results) - len(queries) :]

    def _sendable(self) -> None:
        """Raise if nothing more may be sent in this transaction: it was committed with its last
        read, or one of its writes was refused (raised again: the transaction failed there, and a
        ``COMMIT`` would only roll it back)."""
        if self.ended:
            raise RuntimeError("the transaction was committed with its last read: nothing more is sent in it")
        if self._failed is not None:
            raise self._failed

    def _send(self, text: str) -> Any:
        """One text of several statements (unprepared: its literals differ each time): a failure of
        a deferred statement in it raises what its ``refused`` maps it to (:meth:`defer`)."""
        try:
            return self.raw.execute(text.encode(), prepare=False)
        except Exception as exc:
            for refused in self._refused:
                if (mapped := refused(exc)) is not None:
                    self._failed = mapped
                    raise mapped from exc
            raise

    def script(self, sql: str) -> Any:
        """Run several statements with no parameters (a migration's DDL, a transaction's opening or
        its notifications and ``COMMIT``) as one text: one round trip. Returns the cursor, on the
        first statement's result (:meth:`psycopg.Cursor.nextset` goes to the next)."""
        if self.trace is not None:
            self.trace(sql)
        self._sendable()
        self.trips += 1
        if self._has_pending():
            sql = "; ".join([*self._pending(), sql])
        return self._send(sql)

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction is open (or failed and not yet rolled back): not a read that ended
        (:meth:`end_read`) and is only waiting for its ``ROLLBACK`` to go with the next statement."""
        from psycopg.pq import TransactionStatus

        return not self._closing and self.raw.info.transaction_status != TransactionStatus.IDLE

    def close(self) -> None:
        """Close the connection."""
        self.raw.close()


def result_sets(cursor: Any) -> list[list[Any]]:
    """Each statement's rows of a text of several, in order (none for a statement without rows)."""
    results: list[list[Any]] = []
    while True:
        results.append(cursor.fetchall() if cursor.description is not None else [])
        if not cursor.nextset():
            return results


__all__ = [
    "PSYCOPG_INSTALL",
    "Conn",
    "Cursor",
    "PgConn",
    "Row",
    "configure",
    "database_errors",
    "integrity_errors",
    "is_dsn",
    "is_postgres",
    "pg_errors",
    "pg_sql",
    "psycopg_module",
    "result_sets",
    "savepoint",
]
