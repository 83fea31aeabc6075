"""The store's threads and connections, for each database: SQLite's aiosqlite thread, and
PostgreSQL connections each on a thread of its own.

:class:`~agent.store.Store` runs every unit of work as one synchronous function on one thread (its
module says why); a backend is that thread plus the connection the functions receive, and the
statements that open a transaction:

- **SQLite**: ``BEGIN IMMEDIATE`` takes the file's one writer lock; a read is a plain ``BEGIN``.
- **PostgreSQL**: a write is ``BEGIN`` plus ``pg_advisory_xact_lock`` on one cluster-wide key, so
  write transactions of every node run one at a time exactly as SQLite's do on one file: the
  engine's one-transaction decisions, gap-free sequence numbers and the inbox's checks keep the
  meaning they have on SQLite without a second concurrency design. A write whose invariants are one
  session's own names it (:meth:`agent.store.Store.transact`'s ``session``) and holds that key
  shared, plus the session's own lock: such writes of different sessions run at once across the
  cluster (across a network the one lock was the cluster's throughput ceiling). A read is a
  ``REPEATABLE READ READ ONLY`` transaction: one snapshot, no lock.

A PostgreSQL store has several connections (``store_connections``, :data:`DEFAULT_CONNECTIONS`), each a *lane*:
a thread with a connection of its own. Work has a key (:meth:`PgBackend.submit`): a session's id
for its transactions, its state and its events read; :data:`NO_SESSION` for writes bound to no
session (and the relay). Lanes take work from one queue, the next unit whose key has no unit running:
so a session's work runs, commits and reaches the hub in the order it was submitted, one unit at a
time, as on SQLite's one thread, and a slow transaction holds up its own session only, never the
sessions that would have shared its connection (with lanes fixed by a hash of the id, they waited
behind it). Reads bound to nothing take the next free lane. Different sessions' writes thus run at
once on one node, as they already did across nodes (across a network one connection was one node's
ceiling: a round trip per statement, one statement at a time). What keeps each session's events in
order on the hub when two lanes commit them is :class:`agent.relay.Marks`.

A PostgreSQL connection that breaks (the server restarted, the network went away) is dropped and
made again on the next unit of work; until that succeeds every write fails with
:class:`~agent.errors.StorageUnavailable` (:func:`agent.pgaccess.pg_failure`), which is what stops model calls and
shows in ``daemon/health`` — and clears, by itself, at the first write that commits.
"""

from __future__ import annotations

import collections
import sqlite3
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import aiosqlite
from loguru import logger

from agent.db import Conn, PgConn, psycopg_module
from agent.pgaccess import credential_password, where
from agent.pgtext import quoted
from agent.storage import owner_only
from agent.tx import SessionState

#: The advisory lock key every PostgreSQL write transaction takes (``goald`` in ASCII): exclusive,
#: or shared by a transaction whose invariants are its sessions' own (:meth:`PgBackend.begin`).
WRITER_LOCK = 0x676F616C64
#: The connections a PostgreSQL store works over unless told otherwise (setting ``store_connections``).
DEFAULT_CONNECTIONS = 8
#: The key of the work bound to no session that writes (:meth:`PgBackend.submit`): one unit at a time.
NO_SESSION = ""
#: The first key of a session's advisory lock (``goal`` in ASCII); the second is the hash of its id.
SESSION_LOCKS = 0x676F616C
#: The first key of a named lock (``goan`` in ASCII; the second is the hash of its name): a write bound
#: to no session whose invariants are that name's holds it and the writer lock shared (:meth:`PgBackend.begin`).
NAMED_LOCKS = 0x676F616E
#: The SQLSTATE of a session's write opened on a state another writer changed since (``goald_check``).
STALE_STATE = "GD002"


class SqliteBackend:
    """aiosqlite's connection thread and its ``sqlite3`` connection."""

    kind = "sqlite"
    begin_read = "BEGIN"

    @staticmethod
    def open_read(conn: Conn) -> None:
        """Open a read snapshot (:meth:`agent.store.Store.read`)."""
        conn.execute("BEGIN")

    @staticmethod
    def end_read(conn: Conn) -> None:
        """End the read :meth:`open_read` opened."""
        if conn.in_transaction:
            conn.execute("COMMIT")

    @staticmethod
    def begin(
        conn: Conn, session: str | None = None, known: SessionState | None = None, named: str | None = None
    ) -> Any:
        """Open a write transaction: the file's one writer lock (whatever ``session`` says). Returns
        no state row (a SQLite store caches sessions' states: it is their one writer)."""
        conn.execute("BEGIN IMMEDIATE")
        return None

    @staticmethod
    def stale(exc: BaseException) -> bool:
        """The one writer of its file never decides on a stale state."""
        return False

    @staticmethod
    def commit(conn: Conn, notes: list[str], first: Sequence[str] = ()) -> None:
        """Commit (one process writes a SQLite file: there is nobody to notify, no lease to fence)."""
        conn.execute("COMMIT")

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self.conn = conn

    @classmethod
    async def connect(cls, path: Path, *, full: bool) -> SqliteBackend:
        """Open (creating if needed) the SQLite file at ``path`` in WAL mode, owner only (``full``:
        ``synchronous=FULL``, else ``NORMAL``)."""
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        conn = await aiosqlite.connect(str(path), isolation_level=None)
        try:
            # Every prompt and tool output is in here: owner only, whatever the umask. SQLite creates
            # the WAL and SHM files with the database file's mode, so this comes before WAL mode.
            owner_only(path)
            # A new database frees pages back to the file system in bounded steps (retention's
            # ``incremental_vacuum``); the mode can only be chosen before the first table exists
            # (an older database switches with the offline ``goald store vacuum``).
            if (await (await conn.execute("PRAGMA page_count")).fetchone() or (0,))[0] == 0:
                await conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
            await conn.execute("PRAGMA journal_mode=WAL")
            await conn.execute(f"PRAGMA synchronous={'FULL' if full else 'NORMAL'}")
            await conn.execute("PRAGMA busy_timeout=5000")
            await conn.execute("PRAGMA foreign_keys=OFF")
        except BaseException:
            await conn.close()
            raise
        conn.row_factory = sqlite3.Row
        return cls(conn)

    def raw(self) -> sqlite3.Connection:
        """The connection (on the store thread only)."""
        conn: sqlite3.Connection = self.conn._conn
        return conn

    #: One connection: every unit of work runs on the one thread, in order.
    lanes = 1

    @staticmethod
    def crosses(sessions: Iterable[str]) -> bool:
        """One thread: no session's work is elsewhere."""
        return False

    @staticmethod
    def round_trips() -> None:
        """A file has no round trips to count."""

    @staticmethod
    def broke() -> None:
        """A file is not reached over a connection that breaks: nothing to make again."""

    def submit(self, work: Callable[[], None], key: str | None = NO_SESSION) -> None:
        """Run ``work`` on the store thread, after the work queued before it (whatever its key)."""
        if not self.conn._running or self.conn._connection is None:
            raise ValueError("Connection closed")
        # A function queued without a future runs as is (no second wake-up of the loop per unit).
        self.conn._tx.put_nowait((None, work))

    async def close(self) -> None:
        """Optimize and close the connection after the queued work."""
        try:
            await self.conn.execute("PRAGMA optimize")
        finally:
            await self.conn.close()


class PgBackend:
    """psycopg connections, each on a thread of its own (see the module docstring)."""

    kind = "postgresql"
    begin_read = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"

    @staticmethod
    def open_read(conn: Conn) -> None:
        """Open a read snapshot with the read's first statement, in its round trip (``open_later``)."""
        assert isinstance(conn, PgConn)
        conn.open_later(PgBackend.begin_read)

    @staticmethod
    def end_read(conn: Conn) -> None:
        """End the read: its ``ROLLBACK`` goes with the connection's next text (:meth:`PgConn.end_read`)."""
        assert isinstance(conn, PgConn)
        conn.end_read()

    @staticmethod
    def begin(
        conn: Conn, session: str | None = None, known: SessionState | None = None, named: str | None = None
    ) -> Any:
        """Open a write transaction and take the writer lock, sent first in the transaction's first
        round trip, its first statement or its ``COMMIT`` (:meth:`agent.db.PgConn.open_later`): every
        statement runs after the lock. Exclusive: the transaction runs alone in the cluster. With
        ``session``, for a transaction whose invariants are that session's own: the writer lock shared
        and the session's lock (:meth:`lock_session`), so that such transactions of different sessions
        run at once, on every node, while one that needs the cluster to itself still waits for all of
        them (and they for it); and then, in the same statement (``goald_begin``, :mod:`agent.schema`'s
        version 6), the session's state (:func:`agent.tx.state_query`'s columns), whose row is returned
        (``None``: no such session) — read after the locks, so it is current.

        With ``known`` (the session's state as this node last committed it), nothing is sent now and
        ``known`` is returned: the opening goes first in the transaction's next round trip, with the
        same locks and a check that the state is still ``known`` (``goald_check``, version 7), which
        fails the transaction otherwise (:meth:`stale`): what was decided on ``known`` commits only if
        it was current. A write whose only statements are deferred is one round trip (:meth:`commit`).

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
                f"goald_check({WRITER_LOCK}, {SESSION_LOCKS}, {quoted(conn, session)}, {status},"
                f" {known.last_seq}, {known.status_seq}, {turn})",
            )
            return known
        # Both locks, then the state read after them, in one statement (agent.schema's version 6).
        text = f"BEGIN; SELECT * FROM goald_begin({WRITER_LOCK}, {SESSION_LOCKS}, {quoted(conn, session)}, {status})"
        cursor = conn.script(text)
        while cursor.nextset():  # to the last statement's result: the state
            pass
        return cursor.fetchone()

    @staticmethod
    def stale(exc: BaseException) -> bool:
        """Whether ``exc``, or an error it was raised while handling, is a write's opening that found
        its session changed (:meth:`begin`'s ``known``): then the transaction failed there."""
        seen: BaseException | None = exc
        while seen is not None and getattr(seen, "sqlstate", None) != STALE_STATE:
            seen = seen.__context__
        return seen is not None

    @staticmethod
    def lock_session(conn: Conn, session_id: str) -> None:
        """Take ``session_id``'s lock until the transaction ends (two ids of the same hash share one:
        they only wait for each other). Taken before the session's state is read: in PostgreSQL's
        READ COMMITTED each statement sees what was committed before it began, so the read after
        the lock sees every commit of the previous holder."""
        conn.execute("SELECT pg_advisory_xact_lock(?, hashtext(?))", (SESSION_LOCKS, session_id))

    @staticmethod
    def commit(conn: Conn, notes: list[str], first: Sequence[str] = ()) -> None:
        """Check ``first`` (expressions of no parameters: a lease fence, which fails the transaction),
        send ``notes`` on :data:`agent.relay.CHANNEL`, send the transaction's deferred inserts and
        commit, in one round trip: the fences and the notices are one ``SELECT``, and the payloads
        are quoted as literals (goald's own JSON of session ids and numbers), so the statements
        need no parameters and go as one text (a statement that fails ends the text there, and the
        transaction is rolled back; a notice is only delivered by the ``COMMIT``). A transaction
        that sent nothing before (its opening still to send, a state check that must still run
        even when nothing is written) goes whole as one text with no ``BEGIN`` and no ``COMMIT``:
        its locks and checks first in the same ``SELECT``."""
        assert isinstance(conn, PgConn)
        if conn.ended:  # committed with its last read (agent.tx.Tx.last_read): nothing was written after
            conn.ended = False
            return
        deferred = conn.take_deferred()  # the transaction's trailing inserts: after the fences
        locks = conn.unsent_locks()  # nothing sent yet: one text, its own transaction, no BEGIN/COMMIT
        if not notes and not first and not deferred and locks is None:
            conn.execute("COMMIT")
            return
        from agent.relay import CHANNEL

        channel = quoted(conn, CHANNEL)
        checks = [*([locks] if locks else []), *first, *(f"pg_notify({channel}, {quoted(conn, n)})" for n in notes)]
        select = ["SELECT " + ", ".join(checks)] if checks else []
        conn.script("; ".join([*select, *deferred, *([] if locks else ["COMMIT"])]))

    def __init__(self, dsn: str, connections: int = DEFAULT_CONNECTIONS) -> None:
        self.dsn = dsn
        self.where = where(dsn)
        self._lanes = [_Lane(self, i) for i in range(max(1, connections))]
        self._tls = threading.local()
        #: Units of work ready to run (their key has none running), and per key with a unit ready or
        #: running, its units submitted after it (:meth:`submit`). Changed under ``_ready_cv``.
        self._ready: collections.deque[tuple[Callable[[], None], str | None]] = collections.deque()
        self._waiting: dict[str, collections.deque[Callable[[], None]]] = {}
        self._ready_cv = threading.Condition(threading.Lock())
        #: The statement trace of every connection (:meth:`agent.store.Store.trace`; benchmarks, tests).
        self.trace: Callable[[str], None] | None = None
        self._closed = False
        #: Connection failures seen on any lane: a lane whose connection is older than the last one
        #: makes it again before its next work (:meth:`raw`), so that after a server restart each
        #: lane does not fail once of its own.
        self._failures = 0
        self._trips = 0  # of the connections closed

    @classmethod
    def connect(cls, dsn: str) -> PgConn:
        """A new autocommit connection for goald (``BEGIN``/``COMMIT`` are goald's own)."""
        password = credential_password()
        kw: dict[str, Any] = {"autocommit": True, "application_name": "goald", "connect_timeout": 5}
        if password is not None:
            kw["password"] = password
        return PgConn(psycopg_module().connect(dsn, **kw))

    @property
    def lanes(self) -> int:
        """How many connections (each on a thread of its own) the store has."""
        return len(self._lanes)

    def crosses(self, sessions: Iterable[str]) -> bool:
        """Whether one of ``sessions`` is not the key of this thread's work: its own work may run on
        another connection meanwhile (and publish its events too: :class:`agent.relay.Marks`). On a
        store thread only."""
        if len(self._lanes) == 1:
            return False
        here: str | None = self._tls.key
        return any(sid != here for sid in sessions)

    def start(self) -> None:
        """Connect every lane (raising if the database cannot be reached) and start their threads."""
        for lane in self._lanes:
            lane.conn = self.connect(self.dsn)
        for lane in self._lanes:
            lane.thread.start()

    def raw(self) -> Conn:
        """This thread's connection, made again first if it broke (on a store thread only)."""
        lane: _Lane = self._lanes[self._tls.lane]
        conn: PgConn | None = lane.conn
        if conn is None or conn.raw.closed or conn.raw.broken or lane.made < self._failures:
            if conn is not None:
                self._trips += conn.trips
                conn.close()
            lane.conn, lane.made = None, self._failures
            lane.conn = conn = self.connect(self.dsn)
        conn.trace = self.trace
        return conn

    def round_trips(self) -> int:
        """Client round trips to the database since the store opened, over every connection."""
        return self._trips + sum(lane.conn.trips for lane in self._lanes if lane.conn is not None)

    def broke(self) -> None:
        """A unit of work met the database unreachable (on a store thread): every lane's connection
        made before now is made again before its next use (it most likely broke too)."""
        self._failures += 1

    def submit(self, work: Callable[[], None], key: str | None = NO_SESSION) -> None:
        """Run ``work`` on the next free connection's thread. Work of one ``key`` (a session's id, or
        :data:`NO_SESSION`) runs one unit at a time, in the order submitted; ``None``: no order (a
        read bound to nothing)."""
        with self._ready_cv:
            if self._closed:
                raise ValueError("Connection closed")
            if key is not None and key in self._waiting:
                self._waiting[key].append(work)  # after the key's unit queued or running
                return
            if key is not None:
                self._waiting[key] = collections.deque()
            self._ready.append((work, key))
            self._ready_cv.notify()

    def _next_unit(self, lane: _Lane) -> tuple[Callable[[], None], str | None] | None:
        # On a lane's thread: the next unit of work whose key has none running (``None``: closed,
        # done); with none ready, first the end of the lane's last read (agent.db.PgConn.end_read).
        with self._ready_cv:
            while not self._ready:
                if self._closed and not self._waiting:
                    return None
                if lane.conn is not None and lane.conn.closing:
                    return lane.end_read, None
                self._ready_cv.wait()
            return self._ready.popleft()

    def _done(self, key: str | None) -> None:
        # On a lane's thread, after a unit of ``key``'s work: the key's next unit, if any, is ready.
        with self._ready_cv:
            if key is not None:
                waiting = self._waiting[key]
                if waiting:
                    self._ready.append((waiting.popleft(), key))
                    self._ready_cv.notify()
                else:
                    del self._waiting[key]
            if self._closed and not self._waiting:
                self._ready_cv.notify_all()  # the lanes may end

    async def close(self) -> None:
        """Finish the queued work, then close the connections."""
        import asyncio

        with self._ready_cv:
            self._closed = True
            self._ready_cv.notify_all()
        for lane in self._lanes:
            await asyncio.to_thread(lane.thread.join)
            if lane.conn is not None:
                lane.conn.close()


class _Lane:
    """One connection of a PostgreSQL store and the thread that runs work on it (see the module
    docstring: the lanes take their work from one queue)."""

    def __init__(self, backend: PgBackend, index: int) -> None:
        self.index = index
        self.conn: PgConn | None = None
        #: The backend's failure count when the connection was made.
        self.made = 0
        name = "goald-pg-store" if index == 0 else f"goald-pg-store-{index}"
        self.thread = threading.Thread(target=self._run, args=(backend,), name=name, daemon=True)

    def _run(self, backend: PgBackend) -> None:
        backend._tls.lane = self.index
        while (unit := backend._next_unit(self)) is not None:
            work, backend._tls.key = unit
            try:
                work()
            finally:
                backend._done(unit[1])

    def end_read(self) -> None:
        """Send the ``ROLLBACK`` of this lane's last read, which waited for a statement to go with:
        the lane has no work now. A connection that fails is made again before its next use."""
        if self.conn is not None:
            try:
                self.conn.flush()
            except Exception as exc:  # the next unit of work meets it, and raw() makes it again
                logger.debug("ending a read on store connection {} failed: {}", self.index, exc)


Backend = SqliteBackend | PgBackend

__all__ = [
    "DEFAULT_CONNECTIONS",
    "NAMED_LOCKS",
    "NO_SESSION",
    "SESSION_LOCKS",
    "STALE_STATE",
    "WRITER_LOCK",
    "Backend",
    "PgBackend",
    "SqliteBackend",
]
