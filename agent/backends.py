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

from agent import pgtx
from agent.db import Conn, PgConn, psycopg_module
from agent.pgaccess import credential_password, where
from agent.pgtx import NAMED_LOCKS, SESSION_LOCKS, STALE_STATE, WRITER_LOCK
from agent.storage import owner_only
from agent.tx import Query, SessionState

#: The connections a PostgreSQL store works over unless told otherwise (setting ``store_connections``).
DEFAULT_CONNECTIONS = 8
#: The key of the work bound to no session that writes (:meth:`PgBackend.submit`): one unit at a time.
NO_SESSION = ""


class SqliteBackend:
    """aiosqlite's connection thread and its ``sqlite3`` connection."""

    kind = "sqlite"

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
    def commit(conn: Conn, notes: list[str], first: Sequence[str] = (), reads: Sequence[Query] = ()) -> list[list[Any]]:
        """Run ``reads`` (each one's rows returned) and commit (one process writes a SQLite file:
        there is nobody to notify, no lease to fence)."""
        rows = [list(conn.execute(sql, params).fetchall()) for sql, params in reads]
        conn.execute("COMMIT")
        return rows

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

    open_read = staticmethod(pgtx.open_read)
    end_read = staticmethod(pgtx.end_read)
    begin = staticmethod(pgtx.begin)
    stale = staticmethod(pgtx.stale)
    lock_session = staticmethod(pgtx.lock_session)
    commit = staticmethod(pgtx.commit)

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
                    return lane.flush_read, None
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

    def flush_read(self) -> None:
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
