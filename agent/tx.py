"""A transaction on the store's thread (:class:`Tx`) and the session state it keeps.

Why transactions run as whole functions on the connection's thread: every state change in goald
is a small transaction of a few statements (an inbox row and its event, a goal decision and its
continuation). Sending each statement across the thread boundary would cost a hop apiece; a
transaction function costs one hop in all and can make decisions from what it reads without an
``await`` in between. The functions are synchronous and receive a :class:`Tx`; they compose, so a
package above (the goal engine) can enqueue a message and update its own rows in **one**
transaction. :class:`agent.store.Store` runs them (:meth:`~agent.store.Store.transact`).

On SQLite, sequence numbers and each session's status are cached on the connection's thread and
only changed by transaction functions, which that thread runs one at a time; a transaction's
changes to the cache are applied only after its ``COMMIT``. On PostgreSQL other connections and
nodes write too: a write bound to a session is opened on the state this node last committed for it,
checked after its lock, and run again on the state read if another writer changed it
(:meth:`agent.backends.PgBackend.begin`); any other transaction reads a session's state after its lock.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from loguru import logger

from agent.db import Conn, PgConn
from agent.errors import NotFound
from agent.events import Event, EventType
from agent.payloads import AgentStatus

if TYPE_CHECKING:
    from agent.store import Store

T = TypeVar("T")
#: A read sent as a statement and its parameters (SQLite's placeholders).
Query = tuple[str, Sequence[Any]]
#: What a transaction that commits a session's idle also reads, with its ``COMMIT``
#: (:attr:`agent.store.Store.at_idle`): given the session and its state at that idle, the reads and
#: what takes their rows once committed (on the store thread); ``None``: nothing.
IdleRead = Callable[[str, "SessionState"], tuple[list[Query], Callable[[list[list[Any]]], None]] | None]

#: The SQLSTATE of a deferred write that did not change exactly one row (``goald_one_row``:
#: :meth:`Tx.write`'s ``one_row``); the lease fence's is GD001, a stale opening's GD002.
ONE_ROW = "GD003"


def utcnow() -> str:
    """Now, in UTC, as an ISO 8601 string with microseconds (sorts as text)."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


@dataclasses.dataclass
class SessionState:
    """What the store thread knows of a session between transactions."""

    last_seq: int
    status: AgentStatus
    status_seq: int
    open_turn: str | None
    #: The session's queued messages as this node's writes left them (the rows :func:`agent.inbox.
    #: queued` reads; ``None``: not known, read them). Every change of the queue is an event, so a
    #: write opened on a known state whose check holds (no other writer since) finds it as it was
    #: left. Replaced, never changed in place (a copy of the state shares it).
    queue: tuple[dict[str, Any], ...] | None = None


class KnownStates(collections.OrderedDict[str, SessionState]):
    """The sessions' states as this node last committed them (:attr:`agent.store.Store._states`),
    the most recently written last: at most :attr:`LIMIT` are kept, so a daemon that runs for months
    over many sessions does not keep one for each. A state forgotten costs its session one read at
    its next write (a state is only ever a shortcut: a write opened on it is checked)."""

    LIMIT = 10_000

    def remember(self, states: dict[str, SessionState]) -> None:
        """Keep ``states`` (a transaction's, committed), as the most recently written."""
        for session_id, state in states.items():
            self.pop(session_id, None)
            self[session_id] = state
        while len(self) > self.LIMIT:
            try:
                self.popitem(last=False)
            except KeyError:  # emptied by another connection's thread meanwhile
                break


def _dumps(data: dict[str, Any]) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False, default=str)


#: A session's state in one statement (one round trip to PostgreSQL, where it is read in every
#: transaction): its watermark, its highest stored event, its last status event and its open turn.
_STATE_SQL = """
SELECT s.seq_watermark AS watermark,
  (SELECT COALESCE(MAX(e.seq), 0) FROM events e WHERE e.session_id = s.id) AS top,
  (SELECT e.seq FROM events e WHERE e.session_id = s.id AND e.type = ? ORDER BY e.seq DESC LIMIT 1) AS status_seq,
  (SELECT e.data FROM events e WHERE e.session_id = s.id AND e.type = ? ORDER BY e.seq DESC LIMIT 1) AS status_data,
  (SELECT t.id FROM turns t WHERE t.session_id = s.id AND t.end_reason IS NULL LIMIT 1) AS open_turn
FROM sessions s WHERE s.id = ?
"""


def state_query(session_id: str) -> tuple[str, tuple[str, str, str]]:
    """The statement that reads a session's state, and its parameters (:func:`state_of_row` reads
    its row; a PostgreSQL write sends it with its ``BEGIN``: :meth:`agent.backends.PgBackend.begin`)."""
    status_type = EventType.STATUS.value
    return _STATE_SQL, (status_type, status_type, session_id)


def load_session_state(conn: Conn, session_id: str) -> SessionState:
    """The session's state as stored: its last sequence number, its status and open turn."""
    return state_of_row(conn.execute(*state_query(session_id)).fetchone(), session_id)


def state_of_row(row: Any, session_id: str) -> SessionState:
    """A session's state from the row of :func:`state_query` (``None``: there is no such session).

    Raises:
        NotFound: there is no such session.
    """
    if row is None:
        raise NotFound(f"no session {session_id}")
    # Retention may have pruned the newest stored events' predecessors (or, with no status event
    # kept, all of them): the watermark is the highest number ever given, so numbering goes on.
    last_seq = max(int(row["top"]), int(row["watermark"]))
    status, status_seq = AgentStatus.IDLE, 0
    if row["status_seq"] is not None:
        status, status_seq = AgentStatus(json.loads(row["status_data"])["status"]), int(row["status_seq"])
    return SessionState(last_seq, status, status_seq, row["open_turn"])


class Tx:
    """One open transaction on the store thread. Only transaction functions receive one."""

    def __init__(
        self,
        store: Store,
        conn: Conn,
        *,
        session: str | None = None,
        lock: Callable[[Conn, str], None] | None = None,
    ) -> None:
        self.store = store
        self.conn = conn
        #: With ``lock``, the writer lock is held shared and ``session``'s lock was taken with
        #: ``BEGIN``; another session is locked by it as it is first touched
        #: (:meth:`agent.store.Store.transact`'s ``session``).
        self._lock_of = lock
        self._locked: set[str] = {session} if session is not None else set()
        self.now = utcnow()
        self.events: list[Event] = []
        self._states: dict[str, SessionState] = {}
        self._after: list[Callable[[], None]] = []
        self._committed: list[Callable[[], None]] = []
        self._fenced: set[str] = set()
        #: Fence statements sent with the ``COMMIT`` (:meth:`fence`).
        self.at_commit: list[str] = []
        self._checks = 0  # writes checked by the server (write's one_row), to name each
        self._refusal: BaseException | None = None  # a write's refusal raised here (SQLite: write)
        self._idle: list[str] = []  # sessions made idle here, for the store's at_idle (commit)

    def run(self, fn: Callable[[Tx], T]) -> T:
        """``fn(self)``, failing if one of its writes was refused, even if ``fn`` caught the refusal
        (:meth:`write`): on SQLite as on PostgreSQL, where it is raised by a later round trip."""
        result = fn(self)
        if self._refusal is not None:
            raise self._refusal
        return result

    def commit(self, backend: Any, notes: list[str]) -> None:
        """Commit through ``backend`` (its fences and ``notes`` with the ``COMMIT``) and, in the same
        round trip, what the store's :attr:`~agent.store.Store.at_idle` reads of each session this
        transaction left idle; its rows go to their taker once committed (a taker that fails is
        logged: the commit stands, and the reader reads again its own way)."""
        takers: list[tuple[int, Callable[[list[list[Any]]], None]]] = []
        queries: list[Query] = []
        at_idle = self.store.at_idle
        for sid in self._idle:
            st = self._states.get(sid)  # None: forgotten (deleted) in this same transaction
            if at_idle is None or st is None or st.status is not AgentStatus.IDLE or st.open_turn is not None:
                continue  # or left idle again in this same transaction
            try:
                asked = at_idle(sid, dataclasses.replace(st))
            except Exception:  # the reader's fault must not fail the write that made the idle
                logger.exception("what an idle's commit reads could not be asked for (it is read again)")
                continue
            if asked is not None:
                takers.append((len(asked[0]), asked[1]))
                queries += asked[0]
        rows: list[list[Any]] = backend.commit(self.conn, notes, self.at_commit, queries)
        for count, take in takers:
            self._committed.append(partial(_hand, take, rows[:count]))
            rows = rows[count:]

    def forget(self, session_id: str) -> None:
        """The session is deleted: its state (its last number, its queue) is forgotten, here and by
        the store once this transaction commits, so that a session brought back under the same id
        (``goald goal import``) starts from what is stored."""
        self._states.pop(session_id, None)

        def forgotten() -> None:
            self.store._states.pop(session_id, None)

        self._committed.append(forgotten)

    def born(self, session_id: str) -> None:
        """``session_id`` is created by this transaction: its state is known without a read (no event,
        no status, no turn, nothing queued), and its lock is not needed: no other writer can see the
        session before this transaction commits."""
        self._locked.add(session_id)
        self._states[session_id] = SessionState(0, AgentStatus.IDLE, 0, None, queue=())

    def preload(self, session_id: str, state: SessionState) -> None:
        """``session_id``'s state as read right after its lock was taken (with ``BEGIN``)."""
        self._states[session_id] = state

    def fence(self, session_id: str) -> None:
        """Refuse this transaction unless this process may drive ``session_id`` (the store's
        :attr:`Store.fence` check, once per session and transaction; nothing to check on one node).

        The writes that *drive* a session call it — the driver's (:class:`agent.writer.DriverWriter`)
        and a goal's decision — so that a node that lost the session's lease adds nothing to it;
        what any node may do (enqueue, cancel a queued message, a goal's pause) does not."""
        check = self.store.fence
        if check is None or session_id in self._fenced:
            return
        self._lock(session_id)
        at_commit = self.store.fence_at_commit
        if at_commit is not None:
            # Checked by a statement sent with the COMMIT, in its round trip; if it fails, or the
            # transaction fails otherwise, the store checks again after the rollback and raises
            # LeaseLost if the lease is gone (agent.store.Store._run_tx).
            self.at_commit.append(at_commit(self.conn, session_id))
        else:
            check(self.conn, session_id)
        self._fenced.add(session_id)

    def _lock(self, session_id: str) -> None:
        """Take ``session_id``'s lock, once per transaction, where the writer lock is held shared."""
        if self._lock_of is not None and session_id not in self._locked:
            self._lock_of(self.conn, session_id)
            self._locked.add(session_id)

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Any:
        """Run one statement (a cursor: ``rowcount``, ``fetchone``, ``fetchall``)."""
        return self.conn.execute(sql, params)

    def write(
        self,
        sql: str,
        params: Sequence[Any] | dict[str, Any] = (),
        *,
        refused: Callable[[Exception], BaseException | None] | None = None,
        one_row: Callable[[], BaseException] | None = None,
    ) -> None:
        """Run a statement whose result nobody reads (an insert, an update of known rows): on
        PostgreSQL sent with the next statement or the ``COMMIT``, in its round trip
        (:meth:`agent.db.PgConn.defer`); every later statement reads what it did. A failure of it
        fails the transaction there, raising what ``refused`` maps it to (a constraint's refusal
        as the caller's error; ``None``: the failure itself).

        A refusal fails the whole transaction on both stores, even one its function catches (on
        PostgreSQL it may only be raised after the function returned): nothing of it is written.

        ``one_row`` (an ``UPDATE``): the statement must change exactly one row (a row updated only
        at the revision read, say), else the transaction fails with that error, checked by the
        server where the statement runs (:mod:`agent.schema`'s ``goald_one_row``), so that the
        check costs no round trip of its own. Either error is raised where the statement ran: on
        SQLite here, on PostgreSQL by the round trip that carried it, at the latest the
        ``COMMIT`` (:meth:`agent.store.Store.transact` raises it; nothing was written)."""
        if isinstance(self.conn, PgConn):
            if one_row is not None:
                check, refused = self._server_check("goald_written", one_row, refused)
                sql = f"WITH goald_written AS ({sql} RETURNING 1) {check}"
            self.conn.defer(sql, params, refused)
            return
        try:
            cursor = self.conn.execute(sql, params)
        except Exception as exc:
            if refused is not None and (mapped := refused(exc)) is not None:
                self._refusal = mapped  # the transaction fails even if its function catches it (run)
                raise mapped from None
            raise
        if one_row is not None and cursor.rowcount != 1:
            self._refusal = one_row()
            raise self._refusal

    def expect_one(self, sql: str, params: Sequence[Any] = (), *, error: Callable[[], BaseException]) -> None:
        """Check that a query finds exactly one row (a row still at the revision this process wrote,
        say), else fail the transaction with ``error``; as :meth:`write`'s ``one_row``, on PostgreSQL
        by the server where the statement runs, sent with the next statement or the ``COMMIT`` (no
        round trip of its own), and nothing of the transaction is written."""
        if isinstance(self.conn, PgConn):
            check, refused = self._server_check(f"({sql}) AS goald_found", error, None)
            self.conn.defer(check, params, refused)
            return
        if len(self.conn.execute(sql, params).fetchall()) != 1:
            self._refusal = error()
            raise self._refusal

    def _server_check(
        self, rows: str, error: Callable[[], BaseException], refused: Callable[[Exception], BaseException | None] | None
    ) -> tuple[str, Callable[[Exception], BaseException | None]]:
        """The ``SELECT`` that fails the transaction unless ``rows`` (a table expression) has exactly
        one row (:mod:`agent.schema`'s ``goald_one_row``, named by a token of this transaction), and
        what its failure raises: ``error``, else what ``refused`` maps a failure to."""
        self._checks += 1
        token = f"goald_one_row_{self._checks}"
        return f"SELECT goald_one_row(count(*), '{token}') FROM {rows}", _one_row_refusal(token, error, refused)

    def reads(self, *queries: tuple[str, Sequence[Any] | dict[str, Any]]) -> list[list[Any]]:
        """Run several reads that do not depend on each other's rows: on PostgreSQL in one round
        trip (with the ``COMMIT`` after :meth:`last_read`); each one's rows."""
        if isinstance(self.conn, PgConn):
            return self.conn.reads(queries)
        return [self.conn.execute(sql, params).fetchall() for sql, params in queries]

    def last_read(self) -> None:
        """The next statement is this transaction's last, a read: on PostgreSQL the ``COMMIT`` goes with
        it, in its round trip, when the transaction has written nothing (no event, no fence, nothing
        deferred); the function returns after it and sends nothing more (:meth:`agent.db.PgConn.end_with_next`)."""
        if isinstance(self.conn, PgConn) and not self.events and not self.at_commit:
            self.conn.end_with_next()

    def one(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Any:
        """Run a query and return its first row (``None``: no row)."""
        return self.conn.execute(sql, params).fetchone()

    def all(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[Any]:
        """Run a query and return every row."""
        rows: list[Any] = self.conn.execute(sql, params).fetchall()
        return rows

    def state(self, session_id: str) -> SessionState:
        """The session's cached state as this transaction sees it (changes apply at commit)."""
        st = self._states.get(session_id)
        if st is None:
            self._lock(session_id)
            base = self.store._states.get(session_id) if self.store._cache_states else None
            if base is None:
                base = load_session_state(self.conn, session_id)
            st = dataclasses.replace(base)
            self._states[session_id] = st
        return st

    def emit(self, session_id: str, type: str, data: dict[str, Any]) -> Event:
        """Append an event to the session's sequence (published after commit)."""
        st = self.state(session_id)
        st.last_seq += 1
        event = Event(session_id=session_id, seq=st.last_seq, type=type, data=data, at=self.now)
        self.write(  # nobody reads an insert's result
            "INSERT INTO events(session_id, seq, type, data, at) VALUES (?,?,?,?,?)",
            (session_id, event.seq, type, _dumps(data), self.now),
        )
        self.events.append(event)
        return event

    def set_status(self, session_id: str, status: AgentStatus, **extra: Any) -> Event | None:
        """Record a status transition (a no-op when the status is unchanged)."""
        st = self.state(session_id)
        if st.status == status:
            return None
        event = self.emit(session_id, EventType.STATUS, {"status": status, **extra})
        st.status = status
        st.status_seq = event.seq
        if status is AgentStatus.IDLE and self.store.at_idle is not None and session_id not in self._idle:
            self._idle.append(session_id)
        return event

    def on_commit(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the store thread right after this transaction commits, before any
        later transaction runs (state that the next transaction function must see)."""
        self._committed.append(callback)

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the event loop after this transaction commits."""
        self._after.append(callback)


def _hand(take: Callable[[list[list[Any]]], None], rows: list[list[Any]]) -> None:
    try:
        take(rows)
    except Exception:
        logger.exception("what was read with an idle's commit could not be taken (it is read again)")


def _one_row_refusal(
    token: str, one_row: Callable[[], BaseException], refused: Callable[[Exception], BaseException | None] | None
) -> Callable[[Exception], BaseException | None]:
    """What a write checked by ``goald_one_row`` raises: ``one_row``'s error when the server's check
    named ``token`` failed, else what ``refused`` maps the failure to."""

    def mapped(exc: Exception) -> BaseException | None:
        diag = getattr(exc, "diag", None)
        if getattr(exc, "sqlstate", None) == ONE_ROW and getattr(diag, "message_primary", None) == token:
            return one_row()
        return refused(exc) if refused is not None else None

    return mapped
