"""Events committed by other nodes, published here in order: ``NOTIFY`` on commit, ``LISTEN`` in a
thread, the events table as the truth, and a slow poll as the fallback (PostgreSQL only).

On one SQLite file every commit is this process's, and :class:`~agent.store.Store` hands each
transaction's events to its hub as it commits. On PostgreSQL other daemons commit too — a follow-up
enqueued through another node's socket, for a session this node drives — and everything that
listens to the hub (the driver waking on ``message/queued``, the goal engine on an idle, a client's
subscription) must see those events, in each session's order, with no gap and no repeat. So:

- every write transaction that emitted events sends, before its ``COMMIT``, one ``pg_notify`` on
  the ``goald_events`` channel: this node's id and, per session, the first and last sequence number
  it wrote (PostgreSQL delivers a notification only if, and when, its transaction commits);
- each node keeps, per session, the highest sequence number it has published (``published``). A
  local transaction whose first event is not the next one reads the missing ones inside the same
  transaction (under the writer lock, so they are exactly the ones between) and publishes them
  first (:func:`fill_gaps`);
- a listener thread on a connection of its own collects notifications of *other* nodes and hands
  them, batched, to the store thread, which reads each session's events above its mark up to the
  notified last one and publishes them (:func:`relay`);
- the listener's connection can break and notifications can be missed while it reconnects; every
  ``poll_seconds`` (and after each reconnect) the store thread compares each known session's mark
  with the stored maximum and publishes what it is missing.

A notification reaches only a node that was listening when it was sent, and the slow poll only
covers sessions that have a mark, so two rules close the ways a node could miss a session's first
events for good (``c`` never saw ``a``'s commit: issue 25, point 10):

- the store is not open before its listener listens (:meth:`Listener.start` waits for the first
  ``LISTEN``): a commit made after :meth:`agent.store.Store.open` returned is always notified here;
- a session this node starts to use gets its mark when it is read (:func:`follow`): the reader —
  the runtime loading an agent, a subscription reading its backlog — registers its use *before* it
  reads, so its read has every event up to the mark, and every later one reaches it by its
  notification or, if that is lost, by the poll, which now knows the session. (Without the mark a
  session whose first notification here was lost was published only from its *next* commit on.)

All publishing happens on the store thread's order, so a session's events reach the hub in sequence
order whichever node committed them.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from loguru import logger

from agent.db import Conn, PgConn, database_errors, pg_errors
from agent.eventlog import read_events
from agent.events import Event

if TYPE_CHECKING:
    import psycopg

CHANNEL = "goald_events"
#: PostgreSQL's limit on a notification's payload is 8,000 bytes; a larger batch is split.
PAYLOAD_LIMIT = 7000


def payloads(node_id: str, events: list[Event]) -> list[str]:
    """The notifications of one transaction's events: ``{"n": node, "s": {sid: [first, last]}}``."""
    spans: dict[str, list[int]] = {}
    for e in events:
        span = spans.setdefault(e.session_id, [e.seq, e.seq])
        span[0], span[1] = min(span[0], e.seq), max(span[1], e.seq)
    out: list[str] = []
    chunk: dict[str, list[int]] = {}
    for sid, span in spans.items():
        chunk[sid] = span
        if len(json.dumps(chunk)) > PAYLOAD_LIMIT:
            del chunk[sid]
            out.append(json.dumps({"n": node_id, "s": chunk}, separators=(",", ":")))
            chunk = {sid: span}
    if chunk:
        out.append(json.dumps({"n": node_id, "s": chunk}, separators=(",", ":")))
    return out


def _read_span(conn: Conn, session_id: str, after: int, upto: int) -> list[Event]:
    out: list[Event] = []
    while after < upto:
        got = read_events(conn, session_id, after, upto=upto, limit=1000)
        if not got:
            break
        out += got
        after = got[-1].seq
    return out


def fill_gaps(conn: Conn, published: dict[str, int], events: list[Event]) -> tuple[list[Event], dict[str, int]]:
    """``events`` (one transaction's, about to commit) preceded by each session's events that other
    nodes committed since this node last published that session, and the marks to set in
    ``published`` once the transaction has committed (not before: a rollback gives its numbers again)."""
    firsts: dict[str, int] = {}
    marks: dict[str, int] = {}
    for e in events:
        firsts.setdefault(e.session_id, e.seq)
        marks[e.session_id] = max(marks.get(e.session_id, 0), e.seq)
    missing: list[Event] = []
    for sid, first in firsts.items():
        mark = published.get(sid)
        if mark is not None and mark < first - 1:
            missing += _read_span(conn, sid, mark, first - 1)
    return (missing + events if missing else events), marks


class Marks:
    """Per session, the highest sequence number handed to the hub (``published``), and the lock
    under which a PostgreSQL store's connections hand events over so that each session's reach the
    hub in order, once (a store with several connections: :mod:`agent.backends`).

    A session's own transactions run on one connection, so they commit and hand over in order. Events
    of a session handed over from another connection — a transaction bound to no session or to
    another one, the relay of other nodes' commits — are handed over with the lock held from before
    their ``COMMIT`` (:attr:`lock`) until they are queued to the loop, and gaps are filled under the
    lock: a batch starts at most one past the mark, and what another connection handed over already
    is left out (:meth:`hand`)."""

    def __init__(self) -> None:
        self.published: dict[str, int] = {}
        self.lock = threading.RLock()
        self._held = threading.local()

    def hold(self) -> None:
        """Take :attr:`lock` until this thread's next :meth:`hand_over` (or :meth:`drop`): for a
        transaction whose events another connection may publish too, from before its ``COMMIT``."""
        self.lock.acquire()
        self._held.on = True

    def drop(self) -> None:
        """Let go of this thread's :meth:`hold`, if any (its transaction did not commit)."""
        if getattr(self._held, "on", False):
            self._held.on = False
            self.lock.release()

    def hand_over(self, events: list[Event], send: Callable[[list[Event]], object]) -> None:
        """Under :attr:`lock`: ``send`` (which queues to the loop) what of ``events`` (committed) is
        not handed over yet (:meth:`hand`); then let go of this thread's :meth:`hold`."""
        try:
            with self.lock:
                send(self.hand(events))
        finally:
            self.drop()

    def follow(self, session_id: str, top: Callable[[], int], interest: Callable[[str], bool] | None) -> None:
        """:func:`follow` under :attr:`lock`."""
        with self.lock:
            follow(self.published, session_id, top, interest)

    def fill(self, conn: Conn, events: list[Event]) -> list[Event]:
        """``events`` (a transaction's, about to commit) preceded by what other nodes committed since
        each of their sessions was last handed over (:func:`fill_gaps`)."""
        with self.lock:
            return fill_gaps(conn, self.published, events)[0]

    def relay(
        self,
        conn_of: Callable[[], Conn],
        spans: dict[str, tuple[int, int]] | None,
        interest: Callable[[str], bool] | None,
        deliver: Callable[[list[Event]], None],
    ) -> None:
        """On a store thread: read what other nodes committed (``spans``, or ``None``: the slow poll)
        that this node has a use for and has not published, and hand it to ``deliver`` (which
        queues it to the loop) — under :attr:`lock` from the marks read to the hand-over."""
        with self.lock:
            if not needed(self.published, spans, interest):
                return  # nothing of use here: no transaction
            try:
                conn = conn_of()
                assert isinstance(conn, PgConn)
                conn.open_read()  # with the first read, in its round trip
                try:
                    events = (
                        catch_up(conn, self.published, interest)
                        if spans is None
                        else relay(conn, self.published, spans, interest)
                    )
                finally:
                    conn.end_read()  # with the connection's next statement
            except database_errors() as exc:
                logger.debug("could not read other nodes' events now (the next notification or poll will): {}", exc)
                return
            if events:
                deliver(events)

    def hand(self, events: list[Event]) -> list[Event]:
        """What of ``events`` (committed, in each session's order) is not handed over yet; marks it
        handed over. The caller holds :attr:`lock` and queues the result to the loop under it."""
        out: list[Event] = []
        for event in events:
            mark = self.published.get(event.session_id)
            if mark is not None and event.seq <= mark:
                continue
            self.published[event.session_id] = event.seq
            out.append(event)
        return out


def relay(
    conn: Conn,
    published: dict[str, int],
    spans: dict[str, tuple[int, int]],
    interest: Callable[[str], bool] | None = None,
) -> list[Event]:
    """The events of other nodes' commits (``spans``: session → first and last seq notified) that
    this node has not published yet, in order; advances ``published``.

    Only the sessions ``interest`` names are read (what this node drives, has loaded or has a
    subscriber for): the others are forgotten, so that if one becomes of interest later its
    publishing starts at its next commit (whoever takes it up reads its state from the store)."""
    out: list[Event] = []
    for sid, (first, last) in spans.items():
        if interest is not None and not interest(sid):
            published.pop(sid, None)
            continue
        mark = published.get(sid)
        low = mark if mark is not None else first - 1
        if last <= low:
            continue
        got = _read_span(conn, sid, low, last)
        if got:
            published[sid] = got[-1].seq
            out += got
    return out


def needed(
    published: dict[str, int],
    spans: dict[str, tuple[int, int]] | None,
    interest: Callable[[str], bool] | None = None,
) -> bool:
    """Whether reading other nodes' commits (``spans``, or ``None``: the slow poll) can publish
    anything here: a session this node has a use for whose notified events are above its mark (the
    poll: any session it has published). A node spends no transaction on the commits of sessions it
    neither drives, nor has loaded, nor has a subscriber for (issue 30). The marks of sessions it
    has no use for are forgotten here, as :func:`relay` forgets them."""
    if interest is not None:
        for sid in [s for s in published if not interest(s)]:
            del published[sid]
    if spans is None:
        return bool(published)
    for sid, (first, last) in spans.items():
        if interest is not None and not interest(sid):
            continue
        mark = published.get(sid)
        if last > (mark if mark is not None else first - 1):
            return True
    return False


def follow(
    published: dict[str, int], session_id: str, top: Callable[[], int], interest: Callable[[str], bool] | None = None
) -> None:
    """Mark ``session_id`` as published up to ``top()`` if this node uses it (``interest``) and has
    no mark for it yet: ``top()`` is the highest event a read of its events or state just saw (on
    the store thread, so no relay runs between that read and this mark). From here on the session's
    later events are published here — by their notifications, or by the slow poll if those are lost —
    which, without a mark, would start only at the next notification that arrives."""
    if session_id in published or (interest is not None and not interest(session_id)):
        return
    published[session_id] = top()


def stored_top(conn: Conn, session_id: str) -> int:
    """The highest sequence number stored for ``session_id`` (0: none)."""
    row = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events WHERE session_id = ?", (session_id,)).fetchone()
    return int(row[0]) if row is not None else 0


def catch_up(conn: Conn, published: dict[str, int], interest: Callable[[str], bool] | None = None) -> list[Event]:
    """What the notifications may have missed: for every session this node has published (and
    still has an interest in), the stored events above its mark (the slow poll)."""
    if interest is not None:
        for sid in [s for s in published if not interest(s)]:
            del published[sid]
    if not published:
        return []
    sids = list(published)
    highs: dict[str, int] = {}
    for i in range(0, len(sids), 500):
        part = sids[i : i + 500]
        marks = ",".join("?" * len(part))
        for row in conn.execute(
            f"SELECT session_id, MAX(seq) FROM events WHERE session_id IN ({marks}) GROUP BY session_id", part
        ).fetchall():
            highs[str(row[0])] = int(row[1])
    spans = {sid: (published[sid] + 1, high) for sid, high in highs.items() if high > published[sid]}
    return relay(conn, published, spans, interest)


class Listener:
    """The ``LISTEN`` thread: batches other nodes' notifications and hands them to ``deliver``
    (which runs them on the store thread); reconnects by itself, asking for a catch-up after."""

    #: How long :meth:`start` waits for the first ``LISTEN`` (the database was just reached).
    START_WAIT = 10.0

    def __init__(
        self,
        connect: Callable[[], Any],
        node_id: str,
        deliver: Callable[[dict[str, tuple[int, int]] | None], None],
        *,
        poll_seconds: float = 5.0,
    ) -> None:
        self._connect = connect
        self.node_id = node_id
        self._deliver = deliver
        self.poll_seconds = poll_seconds
        self._stop = threading.Event()
        #: Set once ``LISTEN`` has run on the thread's connection (see :meth:`start`).
        self.listening = threading.Event()
        self._conn: psycopg.Connection[Any] | None = None
        self._thread = threading.Thread(target=self._run, name="goald-pg-listen", daemon=True)

    def start(self, wait: float | None = None) -> bool:
        """Start the thread and wait (blocking, up to ``wait`` seconds, :attr:`START_WAIT` by
        default) until it listens; whether it does. A commit made before the first ``LISTEN`` is
        notified to no one here, and a session whose events this node never published is not
        covered by the slow poll: a store that returned before listening could miss the first
        commit of a session for good. (If the wait runs out the thread goes on trying, and catches
        up on the sessions it knows once it listens.)"""
        self._thread.start()
        return self.listening.wait(self.START_WAIT if wait is None else wait)

    def stop(self) -> None:
        """Stop the thread and close its connection."""
        self._stop.set()
        # Wake the thread out of its wait for a notification (else closing a store waits up to
        # that wait's 0.5 s): an empty payload, which every listener ignores. Best effort: with
        # the database gone the wait ends by its timeout as before.
        try:
            with self._connect() as conn:
                conn.execute(f"NOTIFY {CHANNEL}")
        except pg_errors():
            pass
        self._thread.join(timeout=5)

    def _run(self) -> None:
        failing_since: float | None = None
        while not self._stop.is_set():
            try:
                with self._connect() as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.listening.set()
                    if failing_since is not None:
                        logger.info("listening for other nodes' commits again")
                        failing_since = None
                    self._deliver(None)  # whatever was committed while not listening
                    self._listen(conn)
            except pg_errors() as exc:
                if failing_since is None:
                    failing_since = time.monotonic()
                    logger.warning("lost the connection that listens for other nodes' commits: {}", exc)
                self._stop.wait(1.0)

    def _listen(self, conn: psycopg.Connection[Any]) -> None:
        last_poll = time.monotonic()
        while not self._stop.is_set():
            spans: dict[str, tuple[int, int]] = {}
            for note in conn.notifies(timeout=0.5, stop_after=1):
                self._add(spans, note.payload)
            # Whatever else has arrived meanwhile goes in the same batch.
            for note in conn.notifies(timeout=0.0):
                self._add(spans, note.payload)
            if spans:
                self._deliver(spans)
            if time.monotonic() - last_poll >= self.poll_seconds:
                last_poll = time.monotonic()
                self._deliver(None)

    def _add(self, spans: dict[str, tuple[int, int]], payload: str) -> None:
        try:
            data = json.loads(payload)
        except ValueError:
            return
        if not isinstance(data, dict) or data.get("n") == self.node_id:
            return
        for sid, span in (data.get("s") or {}).items():
            first, last = int(span[0]), int(span[1])
            have = spans.get(sid)
            spans[sid] = (min(first, have[0]), max(last, have[1])) if have else (first, last)


__all__ = [
    "CHANNEL",
    "Listener",
    "Marks",
    "catch_up",
    "fill_gaps",
    "follow",
    "needed",
    "payloads",
    "relay",
    "stored_top",
]
