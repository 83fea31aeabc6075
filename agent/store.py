"""The durable store: a SQLite file in WAL mode behind one long-lived aiosqlite connection, or a
PostgreSQL database (:mod:`agent.backends`), with every unit of work run on a store thread: SQLite's
one, or on PostgreSQL the thread of one of the store's connections (a session's one unit at a time).

Transactions are whole synchronous functions that receive a :class:`~agent.tx.Tx` (:mod:`agent.tx`
says why). Committed events are handed to the event loop in commit order from the store's thread,
before the caller's ``await`` returns. Reading stored events is :mod:`agent.eventlog`'s.

Storage failures (the disk full, an I/O error, a read-only file system) are told apart from
every other database error (:mod:`agent.storage`): a transaction that meets one rolls back and
raises :class:`~agent.errors.StorageUnavailable` with a hint of what to do. The store remembers the
condition (:meth:`Store.storage_health`), logs it once at error level, and clears it, logged,
at the next commit that succeeds; :meth:`Store.wait_writable` lets whoever retries a write wake
as soon as another write got through. Nothing polls: the writers' own retries are the probes.
A write that meets a full disk first releases the store's reserve (:attr:`Store.reserve`, a file
of real blocks the daemon keeps beside the database: :class:`agent.storage.StoreReserve`) and is
tried once more, so that what filled the disk is still recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Literal, TypeVar

from loguru import logger

from agent.backends import DEFAULT_CONNECTIONS, NO_SESSION, Backend, PgBackend, SqliteBackend
from agent.db import Conn, PgConn, database_errors, is_dsn
from agent.errors import StorageUnavailable, StoreClosed
from agent.eventlog import first_kept_seq, read_events
from agent.events import Event, EventHub
from agent.migrate import apply_in_transaction
from agent.pgaccess import check_collation, masked, pg_failure
from agent.relay import Listener, Marks, payloads, stored_top
from agent.schema import MIGRATIONS, Migration
from agent.storage import StorageHealth, StoreReserve, storage_failure
from agent.tx import IdleRead, KnownStates, SessionState, Tx, load_session_state, state_of_row

T = TypeVar("T")
Durability = Literal["normal", "full"]


class Store:
    """The goald store. Open with :meth:`open`; close with :meth:`close` (or ``async with``)."""

    def __init__(self, path: Path, backend: Backend, durability: Durability, location: str | None = None) -> None:
        #: The SQLite file (for PostgreSQL: none; ``location`` names the database).
        self.path = path
        #: Where the store is, fit to show: the file, or the DSN without its password.
        self.location = location or str(path)
        self.kind = backend.kind
        self.durability = durability
        self.hub = EventHub()
        self._backend = backend
        self._cache_states = backend.kind == "sqlite"  # the one writer: its cache is the truth
        #: This process among the nodes on one PostgreSQL database (its notifications carry it).
        self.node_id = uuid.uuid4().hex[:12]
        #: Per session, the highest seq published and the lock of publishing in order (agent.relay).
        self._marks = Marks()
        self._listener: Listener | None = None
        #: True while the hub is handed events another node committed (listeners may tell them apart).
        self.relaying = False
        #: Which sessions' events committed by other nodes this process publishes (``None``: all);
        #: the runtime sets it (agent.relay).
        self.interest: Callable[[str], bool] | None = None
        #: The lease check of :meth:`Tx.fence` (set by a cluster's lease manager; ``None``: one node),
        #: and the statement that checks it with the ``COMMIT`` instead (``None``: checked at once).
        self.fence: Callable[[Conn, str], None] | None = None
        self.fence_at_commit: Callable[[Conn, str], str] | None = None
        #: What a transaction leaving a session idle also reads with its ``COMMIT`` (the goal engine's).
        self.at_idle: IdleRead | None = None
        self._loop = asyncio.get_running_loop()
        #: Per session, its state as this process last committed it: SQLite's own (agent.tx); on
        #: PostgreSQL what the session's next write is opened on, checked (PgBackend.begin).
        self._states = KnownStates()
        #: Writes run again: their session changed since this process last committed it (PgBackend.begin).
        self.reruns = 0
        self._reruns_lock = threading.Lock()
        self._closed = False
        #: The storage failure that stops writes, if any (logged as it begins and ends).
        self.health = StorageHealth(self.location)
        #: Per store thread: what the transaction it just ran committed, for the loop (see _work).
        self._local = threading.local()
        #: Blocks kept beside the SQLite file for a write that meets a full disk (set by the daemon).
        self.reserve: StoreReserve | None = None

    # -- lifecycle -------------------------------------------------------------------------

    @classmethod
    async def open(
        cls, path: str | Path, *, durability: Durability = "normal", connections: int = DEFAULT_CONNECTIONS
    ) -> Store:
        """Open (creating if needed) the store at ``path`` and apply the runtime's migrations.

        ``path`` is a SQLite file, or a ``postgresql://`` DSN (the database must exist; the
        password comes from ``PGPASSWORD``, ``~/.pgpass`` or a systemd credential, see
        :func:`agent.pgaccess.credential_password`) used over ``connections`` connections (SQLite
        has one writer, so one connection)."""
        if is_dsn(path):
            return await cls._open_pg(str(path), durability, connections)
        path = Path(path)
        backend = await SqliteBackend.connect(path, full=durability == "full")
        try:
            store = cls(path, backend, durability)
            await store.migrate("agent", MIGRATIONS)
        except BaseException:
            await backend.close()
            raise
        return store

    @classmethod
    async def _open_pg(cls, dsn: str, durability: Durability, connections: int) -> Store:
        backend = PgBackend(dsn, connections)
        await asyncio.to_thread(backend.start)
        store = cls(Path(), backend, durability, location=masked(dsn))
        try:
            await store.migrate("agent", MIGRATIONS)
        except BaseException:
            await backend.close()
            raise
        await store.read(partial(check_collation, store.location))
        store._listener = Listener(lambda: PgBackend.connect(dsn).raw, store.node_id, store._relay_soon)
        # Open only once other nodes' commits are heard here (agent.relay: a commit made before the
        # first LISTEN would be missed for good).
        if not await asyncio.to_thread(store._listener.start):
            logger.warning("not yet listening for other nodes' commits on {}; going on", store.location)
        return store

    def _relay_soon(self, spans: dict[str, tuple[int, int]] | None) -> None:
        # From the listener's thread: other nodes' commits (None: catch up), read on the store thread;
        # what this node knew of their sessions is stale (a write reads it again, _run_tx).
        for sid in spans if spans is not None else list(self._states):
            self._states.pop(sid, None)
        with contextlib.suppress(ValueError):  # closed meanwhile
            self._backend.submit(partial(self._relay, spans))

    def _relay(self, spans: dict[str, tuple[int, int]] | None) -> None:
        def deliver(events: list[Event]) -> None:
            self._loop.call_soon_threadsafe(self._deliver_relayed, events)

        self._marks.relay(self._raw, spans, self.interest, deliver)

    def _deliver_relayed(self, events: list[Event]) -> None:
        self.relaying = True
        try:
            self._deliver(events, [])
        finally:
            self.relaying = False

    async def close(self) -> None:
        """Close the connection after the queued work finishes."""
        if self._closed:
            return
        self._closed = True
        if self._listener is not None:
            await asyncio.to_thread(self._listener.stop)
        await self._backend.close()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def migrate(self, package: str, migrations: Sequence[Migration]) -> int:
        """Apply ``package``'s migrations newer than the stored version, all in one transaction
        (one that fails leaves the database as it was); returns the version.

        Raises:
            SchemaTooNew: a newer goald wrote the database; nothing was changed.
        """
        return await self._call(lambda: apply_in_transaction(self._backend.begin, self._raw(), package, migrations))

    @property
    def connections(self) -> int:
        """How many database connections the store works over."""
        return self._backend.lanes

    @property
    def round_trips(self) -> int | None:
        """Client round trips to a PostgreSQL database since the store opened (``None``: SQLite)."""
        return self._backend.round_trips()

    async def size_bytes(self) -> int:
        """What the database takes: the SQLite file and its WAL, or PostgreSQL's database size."""
        if self.kind == "postgresql":
            sql = "SELECT pg_database_size(current_database())"
            return int(await self.read(lambda conn: conn.execute(sql).fetchone()[0]))
        total = 0
        for name in (self.path, self.path.with_name(self.path.name + "-wal")):
            with contextlib.suppress(FileNotFoundError):
                total += name.stat().st_size
        return total

    # -- transactions ----------------------------------------------------------------------

    def _raw(self) -> Any:
        return self._backend.raw()

    async def _call(self, fn: Callable[[], T], key: str | None = NO_SESSION) -> T:
        if self._closed:
            raise StoreClosed("the store is closed")
        # One hop to the connection's thread for the whole unit of work (see the module docstring),
        # and one back: the result and the transaction's events come in one loop callback.
        done: asyncio.Future[T] = self._loop.create_future()
        self._backend.submit(partial(self._work, fn, done), key)
        return await done

    def _work(self, fn: Callable[[], T], done: asyncio.Future[T]) -> None:
        # On a store thread: run ``fn``, then hand its outcome and what it committed to the loop.
        local = self._local
        try:
            result, error = fn(), None
        except BaseException as exc:  # handed to the awaiting caller
            result, error = None, exc
        delivery, local.delivery = getattr(local, "delivery", None), None
        if delivery is None or self.kind == "sqlite":
            self._loop.call_soon_threadsafe(self._finish, done, result, error, delivery)
            return
        # PostgreSQL: handed over in each session's order across the connections (agent.relay.Marks).
        after = delivery[1]
        self._marks.hand_over(
            delivery[0],
            lambda events: self._loop.call_soon_threadsafe(self._finish, done, result, error, (events, after)),
        )

    def _finish(
        self,
        done: asyncio.Future[Any],
        result: object,
        error: BaseException | None,
        delivery: tuple[list[Event], list[Callable[[], None]]] | None,
    ) -> None:
        # On the loop: committed events reach listeners before the caller's ``await`` returns (and
        # even when the caller was cancelled meanwhile: the transaction did commit).
        if delivery is not None:
            self._deliver(*delivery)
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)

    async def transact(self, fn: Callable[[Tx], T], *, session: str | None = None, named: str | None = None) -> T:
        """Run ``fn`` in one ``BEGIN IMMEDIATE`` … ``COMMIT`` on the store thread.

        If ``fn`` raises, the transaction rolls back, no event is published and the cached session
        state is unchanged. Committed events reach listeners before this returns. ``session``: every
        invariant ``fn`` relies on is that session's own; ``named``: they are what that name's lock
        guards (:data:`agent.outbox.LOCK`). On PostgreSQL either holds the writer lock shared and the
        session's or the name's lock (:meth:`agent.backends.PgBackend.begin`; ``docs/architecture.md``,
        "The writer lock")."""
        return await self._call(lambda: self._run_tx(fn, session, named=named), session or NO_SESSION)

    async def timed_transact(self, fn: Callable[[Tx], T]) -> tuple[T, float]:
        """:meth:`transact`, also returning the seconds the transaction held the writer (from its
        ``BEGIN IMMEDIATE`` to its ``COMMIT``, measured on the store thread)."""

        def run() -> tuple[T, float]:
            started = time.perf_counter()
            result = self._run_tx(fn)
            return result, time.perf_counter() - started

        return await self._call(run)

    async def maintain(self, fn: Callable[[Any], T]) -> tuple[T, float]:
        """Run ``fn`` on the store thread outside any transaction (a ``PRAGMA incremental_vacuum``
        or a checkpoint, which open their own); returns its result and the seconds it took."""

        def run() -> tuple[T, float]:
            started = time.perf_counter()
            result = fn(self._raw())
            return result, time.perf_counter() - started

        return await self._call(run)

    def _failure_of(self, exc: BaseException) -> StorageUnavailable | None:
        if self.kind == "sqlite":
            return storage_failure(exc, self.path)
        failure = pg_failure(exc, self.location)
        if failure is not None:
            self._backend.broke()  # the other connections are made again before their next use
        return failure

    def _run_tx(
        self, fn: Callable[[Tx], T], session: str | None = None, optimistic: bool = True, named: str | None = None
    ) -> T:
        try:
            conn = self._raw()
            # PostgreSQL only: a SQLite write holds the file's one lock, every session included.
            backend = self._backend
            lock = backend.lock_session if (session or named) is not None and isinstance(backend, PgBackend) else None
            tx = Tx(self, conn, session=session, lock=lock)
            known = self._states.get(session) if lock is not None and session is not None and optimistic else None
            row = backend.begin(conn, session, known, named)
            if row is not None and session is not None:
                tx.preload(session, dataclasses.replace(known) if known is not None else state_of_row(row, session))
            try:
                result = tx.run(fn)
                notes: list[str] = []
                if tx.events and self.kind == "postgresql":
                    notes = payloads(self.node_id, tx.events)
                    tx.events = self._marks.fill(conn, tx.events)
                    if backend.crosses(e.session_id for e in tx.events):
                        self._marks.hold()  # until its events are queued to the loop (_work)
                tx.commit(backend, notes)
            except BaseException:
                self._marks.drop()
                if isinstance(conn, PgConn):
                    conn.drop_pending()  # never sent: they go with the rollback
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if tx.at_commit and self.fence is not None:
                    for sid in sorted(tx._fenced):  # a lost lease is what the writer must hear of
                        self.fence(conn, sid)
                raise
        except database_errors() as exc:
            if self._backend.stale(exc) and session is not None:
                # Opened on the state this node last committed, which another writer changed since
                # (agent.backends.PgBackend.begin): nothing was written; again, on the state read.
                self._states.pop(session, None)
                with self._reruns_lock:
                    self.reruns += 1
                return self._run_tx(fn, session, optimistic=False, named=named)
            if self.reserve is not None and self.reserve.release_for(exc, self.location):
                return self._run_tx(fn, session, named=named)  # the disk was full: once more, reserve freed
            failure = self._failure_of(exc)
            if failure is None:
                raise
            self.health.failed(failure)
            raise failure from exc
        if self.health.failure is not None:
            self.health.recovered()
        self._states.remember(tx._states)  # PostgreSQL: what the next write is opened on, and checked
        for mark in tx._committed:
            mark()
        if tx.events or tx._after:
            self._local.delivery = (tx.events, tx._after)  # delivered with the result (see _work)
        return result

    # -- storage health (agent.storage.StorageHealth) ---------------------------------------

    def storage_health(self) -> dict[str, Any]:
        """``{"ok": True}``, or the failure that stops writes: ``error``, ``hint`` and ``since``."""
        return self.health.report()

    async def wait_writable(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for a write to get through after a storage failure (``True``: it did)."""
        return await self.health.wait_writable(seconds)

    def _deliver(self, events: list[Event], after: list[Callable[[], None]]) -> None:
        self.hub.publish(events)
        for callback in after:
            try:
                callback()
            except Exception:
                logger.exception("after-commit callback failed")

    async def read(self, fn: Callable[[Any], T], *, session: str | None = None) -> T:
        """Run a read-only function on a store thread inside one consistent snapshot (``session``:
        on the thread of that session's transactions)."""

        def run() -> T:
            try:
                conn = self._raw()
                self._backend.open_read(conn)
                try:
                    result = fn(conn)
                finally:
                    self._backend.end_read(conn)
            except database_errors() as exc:
                failure = self._failure_of(exc) if self.kind == "postgresql" else None
                if failure is None:
                    raise
                # An unreachable database stops reads as well as writes: the same condition.
                self.health.failed(failure)
                raise failure from exc
            if self.health.failure is not None and self.kind == "postgresql":
                self.health.recovered()  # the database answers again
            return result

        return await self._call(run, session)

    async def trace(self, callback: Callable[[str], None] | None) -> None:
        """Install (or remove) a statement trace callback on the connection (benchmarks)."""
        if isinstance(self._backend, SqliteBackend):
            await self._backend.conn.set_trace_callback(callback)  # type: ignore[arg-type]
            return
        self._backend.trace = callback  # each connection takes it up at its next unit of work

    # -- session state ---------------------------------------------------------------------

    def known_state(self, session_id: str) -> SessionState | None:
        """The session's state as this process last committed it (``None``: not known here)."""
        return self._states.get(session_id)

    async def session_state(self, session_id: str) -> SessionState:
        """A copy of the session's state as of the last commit."""

        def run() -> SessionState:
            st = self._states.get(session_id) if self._cache_states else None
            if st is None:
                st = load_session_state(self._raw(), session_id)
                if self._cache_states:
                    self._states[session_id] = st
            if self.kind == "postgresql":
                last = st.last_seq
                self._marks.follow(session_id, lambda: last, self.interest)  # a use begins (agent.relay)
            return dataclasses.replace(st)

        return await self._call(run, session_id)

    # -- events ----------------------------------------------------------------------------

    async def events_after(
        self,
        session_id: str,
        after_seq: int,
        *,
        limit: int = 1000,
        types: Sequence[str] | None = None,
        upto: int | None = None,
    ) -> list[Event]:
        """Stored events of a session with ``after_seq < seq <= upto``, in order, at most ``limit``."""

        def run(conn: Any) -> list[Event]:
            got = read_events(conn, session_id, after_seq, limit=limit, types=types, upto=upto)
            if self.kind == "postgresql" and types is None and upto is None:
                # A use may begin (a subscription's backlog): marked at what this snapshot holds (agent.relay).
                self._marks.follow(session_id, lambda: stored_top(conn, session_id), self.interest)
            return got

        return await self.read(run, session=session_id)

    async def first_kept_seq(self, session_id: str) -> int | None:
        """The lowest sequence number still stored for the session (``None``: it has no events)."""
        return await self.read(lambda conn: first_kept_seq(conn, session_id))
