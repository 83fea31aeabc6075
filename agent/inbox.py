"""The inbox: transaction functions that enqueue, cancel and admit messages.

Each function takes a :class:`~agent.store.Tx`, so callers compose them with their own writes in
one transaction (the goal engine records its continuation on the goal in the same commit).

Durable invariant kept by these functions together with :mod:`agent.turns`: a session's status is
``running`` exactly when it has an open turn or a queued waking message. Enqueuing a waking
message flips an idle session to ``running`` in the enqueue's own transaction, and the driver
commits ``idle`` only in a transaction that finds no waking message queued; since the store runs
transactions one at a time, a message made durable at any instant is either seen by the driver's
check or flips the status itself (no stranded input). The check reads the queue, or finds it as
this node's writes left it (:attr:`agent.tx.SessionState.queue`): every change of the queue is an
event, so a write opened on a known state that is still current finds every message queued since.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from agent.db import Conn, integrity_errors
from agent.errors import Conflict, InvalidInput, NotFound
from agent.events import EventType
from agent.ids import MessageId
from agent.messages import (
    CancelReason,
    Content,
    Delivery,
    Fate,
    Source,
    content_from_json,
    content_json,
    transition_fate,
)
from agent.payloads import AgentStatus
from agent.tx import Tx

_WAKING = (Delivery.FOLLOWUP.value, Delivery.STEER.value)


class Enqueued(BaseModel):
    """What an enqueue wrote (or found, for a repeated id)."""

    model_config = ConfigDict(frozen=True)

    message_id: MessageId
    seq: int
    created: bool


class Admitted(BaseModel):
    """A message as a turn admitted it."""

    model_config = ConfigDict(frozen=True)

    message_id: MessageId
    delivery: Delivery
    source: Source
    content: Content
    seq: int


def enqueue(
    tx: Tx,
    session_id: str,
    content: Content,
    *,
    delivery: Delivery = Delivery.FOLLOWUP,
    message_id: MessageId | None = None,
    source: Source | None = None,
    pending_key: str | None = None,
    yields_to_followup: bool = False,
) -> Enqueued:
    """Make a message durable as queued; wake the session if the delivery wakes.

    A repeated ``message_id`` for the same session returns the original receipt and writes
    nothing. A waking follow-up cancels queued ``yields_to_followup`` messages as ``superseded``.

    Raises:
        NotFound: the session does not exist.
        Conflict: the id belongs to another session, or ``pending_key`` is already queued.
    """
    source = source or Source()
    if message_id is not None:
        # Only a caller-supplied id can repeat; a fresh one needs no look-up.
        earlier = _receipt(tx, session_id, message_id)
        if earlier is not None:
            return earlier
    mid = message_id or MessageId.new()
    tx.state(session_id)  # raises NotFound for an unknown session
    data: dict[str, Any] = {
        "messageId": mid,
        "delivery": delivery.value,
        "source": source.model_dump(mode="json", exclude_none=True),
    }
    if pending_key is not None:
        data["pendingKey"] = pending_key
    event = tx.emit(session_id, EventType.MESSAGE_QUEUED, data)
    row = _insert(tx, mid, session_id, content, delivery, source, pending_key, yields_to_followup, event.seq)
    if delivery is Delivery.FOLLOWUP and not yields_to_followup:
        _supersede(tx, session_id, by=mid)
    _known(tx, session_id, lambda queue: (*queue, row))
    if delivery.wakes:
        tx.set_status(session_id, AgentStatus.RUNNING)
    return Enqueued(message_id=mid, seq=event.seq, created=True)


def _insert(
    tx: Tx,
    mid: MessageId,
    session_id: str,
    content: Content,
    delivery: Delivery,
    source: Source,
    pending_key: str | None,
    yields_to_followup: bool,
    queued_seq: int,
) -> dict[str, Any]:
    """The inbox row of a message queued at ``queued_seq``; a second queued ``pending_key`` is a
    Conflict (on PostgreSQL raised by the round trip that carries the row: the transaction's next
    statement or its ``COMMIT``, :meth:`agent.tx.Tx.write`). Returns the row as :func:`queued`
    reads it (what the session's known queue holds)."""

    def refused(exc: Exception) -> BaseException | None:
        # SQLite names the column (inbox.pending_key), PostgreSQL the index (inbox_pending_key).
        if pending_key is not None and isinstance(exc, integrity_errors()) and "pending_key" in str(exc):
            return Conflict(f"a message with pending key {pending_key!r} is already queued")
        return None

    row = queued_row(mid, content, delivery, source, yields_to_followup)
    tx.write(
        "INSERT INTO inbox(id, session_id, delivery, source_kind, source_ref, content, pending_key,"
        " yields_to_followup, queued_seq, created_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
        (
            mid,
            session_id,
            *(row[c] for c in ("delivery", "source_kind", "source_ref", "content")),
            pending_key,
            row["yields_to_followup"],
            queued_seq,
            tx.now,
        ),
        refused=refused,
    )
    return row


def queued_row(
    mid: MessageId, content: Content, delivery: Delivery, source: Source, yields_to_followup: bool
) -> dict[str, Any]:
    """A queued message's row as :func:`queued` reads it (what a session's known queue holds)."""
    return {
        "id": mid,
        "delivery": delivery.value,
        "source_kind": source.kind.value,
        "source_ref": source.ref,
        "content": content_json(content),
        "fate": Fate.QUEUED.value,
        "yields_to_followup": int(yields_to_followup),
    }


def _receipt(tx: Tx, session_id: str, message_id: MessageId) -> Enqueued | None:
    """The receipt of ``message_id`` if it was enqueued before (``None``: it is new).

    Raises:
        Conflict: it was enqueued in another session.
    """
    existing = tx.one("SELECT session_id, queued_seq FROM inbox WHERE id=?", (message_id,))
    if existing is None:
        return None
    if existing["session_id"] != session_id:
        raise Conflict(f"message id {message_id} was already used in another session")
    return Enqueued(message_id=message_id, seq=existing["queued_seq"], created=False)


def _supersede(tx: Tx, session_id: str, *, by: MessageId) -> None:
    """Cancel the session's queued ``yields_to_followup`` messages as ``superseded`` by ``by``."""
    known = tx.state(session_id).queue
    if known is not None and not any(r["yields_to_followup"] for r in known):
        return  # none is queued, as this node's writes left the queue
    superseded = tx.all(
        "UPDATE inbox SET fate='cancelled', cancel_reason=?, ended_at=? WHERE session_id=? AND fate='queued'"
        " AND yields_to_followup=1 RETURNING id",
        (CancelReason.SUPERSEDED.value, tx.now, session_id),
    )
    _known(tx, session_id, lambda queue: _without(queue, {r["id"] for r in superseded}))
    for row in sorted(superseded, key=lambda r: str(r["id"])):
        tx.emit(
            session_id,
            EventType.MESSAGE_CANCELLED,
            {"messageId": row["id"], "reason": CancelReason.SUPERSEDED.value, "by": by},
        )


def cancel(
    tx: Tx,
    session_id: str,
    message_id: MessageId,
    reason: str = CancelReason.CANCELLED,
    caller: Mapping[str, int | str] | None = None,
) -> int:
    """Cancel one queued message with ``reason``; returns the event's sequence number. ``caller``
    (the person's ``uid``/``pid`` or ``web`` name, when a person asked) is kept in the event.

    Raises:
        InvalidInput: ``reason`` is empty.
        NotFound: no such message in this session.
        InvalidTransition: the message was already admitted or cancelled.
    """
    if not reason.strip():
        raise InvalidInput("a cancel reason must not be empty")
    row = tx.one("SELECT fate FROM inbox WHERE id=? AND session_id=?", (message_id, session_id))
    if row is None:
        raise NotFound(f"no message {message_id} in session {session_id}")
    transition_fate(Fate(row["fate"]), Fate.CANCELLED)
    tx.execute(
        "UPDATE inbox SET fate='cancelled', cancel_reason=?, ended_at=? WHERE id=?", (reason, tx.now, message_id)
    )
    event = tx.emit(
        session_id, EventType.MESSAGE_CANCELLED, {**(caller or {}), "messageId": message_id, "reason": reason}
    )
    _known(tx, session_id, lambda queue: _without(queue, {message_id}))
    settle_idle(tx, session_id)
    return event.seq


def cancel_all(
    tx: Tx, session_id: str, reason: str = CancelReason.DISCARDED, caller: Mapping[str, int | str] | None = None
) -> list[MessageId]:
    """Cancel every queued message of the session with ``reason`` (``caller``: as :func:`cancel`)."""
    rows = tx.all(
        "UPDATE inbox SET fate='cancelled', cancel_reason=?, ended_at=? WHERE session_id=? AND fate='queued'"
        " RETURNING id, queued_seq",
        (reason, tx.now, session_id),
    )
    ids = [MessageId(r["id"]) for r in sorted(rows, key=lambda r: int(r["queued_seq"]))]
    for mid in ids:
        tx.emit(session_id, EventType.MESSAGE_CANCELLED, {**(caller or {}), "messageId": mid, "reason": reason})
    tx.state(session_id).queue = ()  # every queued message was cancelled
    settle_idle(tx, session_id)
    return ids


def cancel_pending(tx: Tx, pending_key: str, reason: str) -> list[MessageId]:
    """Cancel the queued message that holds ``pending_key``, if any, with ``reason``.

    At most one queued message holds a key (a partial unique index), so the list has at most one
    id. Each goes through the fate transition check, gets its ``message/cancelled`` event, and its
    session commits ``idle`` if nothing else keeps it running.

    Raises:
        InvalidInput: ``reason`` is empty.
    """
    if not reason.strip():
        raise InvalidInput("a cancel reason must not be empty")
    rows = tx.all("SELECT id, session_id, fate FROM inbox WHERE pending_key=? AND fate='queued'", (pending_key,))
    for row in rows:
        transition_fate(Fate(row["fate"]), Fate.CANCELLED)
        tx.execute(
            "UPDATE inbox SET fate='cancelled', cancel_reason=?, ended_at=? WHERE id=?", (reason, tx.now, row["id"])
        )
        tx.emit(row["session_id"], EventType.MESSAGE_CANCELLED, {"messageId": row["id"], "reason": reason})
        _known(tx, str(row["session_id"]), functools.partial(_without, ids={str(row["id"])}))
    for session_id in sorted({str(r["session_id"]) for r in rows}):
        settle_idle(tx, session_id)
    return [MessageId(r["id"]) for r in rows]


def is_pending(tx_or_conn: Tx | Conn, pending_key: str) -> bool:
    """Whether a message holding ``pending_key`` is queued."""
    conn = tx_or_conn.conn if isinstance(tx_or_conn, Tx) else tx_or_conn
    row = conn.execute("SELECT 1 FROM inbox WHERE pending_key=? AND fate='queued' LIMIT 1", (pending_key,)).fetchone()
    return row is not None


def queued_waking(conn: Conn, session_id: str) -> bool:
    """:func:`has_waking` in a read (a connection rather than a transaction)."""
    row = conn.execute(
        "SELECT 1 FROM inbox WHERE session_id=? AND fate='queued' AND delivery IN (?, ?) LIMIT 1",
        (session_id, *_WAKING),
    ).fetchone()
    return row is not None


def sessions_with_work(conn: Conn) -> set[str]:
    """The top-level sessions that need a driver: a waking message queued, or a turn left open."""
    queued = conn.execute(
        "SELECT DISTINCT i.session_id FROM inbox i JOIN sessions s ON s.id = i.session_id"
        " WHERE i.fate='queued' AND i.delivery IN (?, ?) AND s.parent_session_id IS NULL",
        _WAKING,
    ).fetchall()
    open_turns = conn.execute(
        "SELECT DISTINCT t.session_id FROM turns t JOIN sessions s ON s.id = t.session_id"
        " WHERE t.end_reason IS NULL AND s.parent_session_id IS NULL"
    ).fetchall()
    return {str(r[0]) for r in queued} | {str(r[0]) for r in open_turns}


def has_waking(tx: Tx, session_id: str) -> bool:
    """Whether a waking (follow-up or steer) message is queued for the session (the queue read,
    unless this node's writes left it known: :attr:`agent.tx.SessionState.queue`)."""
    return wakes(queued(tx, session_id))


#: A queue longer than this is read when needed rather than kept known (what a state holds is small).
KNOWN_QUEUE = 64


def _known(tx: Tx, session_id: str, change: Callable[[tuple[dict[str, Any], ...]], tuple[dict[str, Any], ...]]) -> None:
    """Apply ``change`` to the session's queue as this transaction knows it, if it is known."""
    st = tx.state(session_id)
    if st.queue is not None:
        queue = change(st.queue)
        st.queue = queue if len(queue) <= KNOWN_QUEUE else None


def _without(queue: tuple[dict[str, Any], ...], ids: set[str]) -> tuple[dict[str, Any], ...]:
    return tuple(r for r in queue if r["id"] not in ids)


def settle_idle(tx: Tx, session_id: str, *, none_waking: bool = False) -> bool:
    """Commit ``idle`` if the session has no open turn and no waking message queued
    (``none_waking``: the caller read the queue in this transaction and found none).

    Returns whether the session is idle afterwards.
    """
    st = tx.state(session_id)
    if st.open_turn is not None:
        return False
    if st.status == AgentStatus.IDLE:
        return True
    if not none_waking and has_waking(tx, session_id):
        return False
    tx.set_status(session_id, AgentStatus.IDLE)
    return True


def queued(tx: Tx, session_id: str) -> list[Any]:
    """Every message queued for the session, in order (the rows :func:`admit` takes): as this
    node's writes left them when they are known, else read (and known from then on)."""
    st = tx.state(session_id)
    if st.queue is not None:
        return list(st.queue)
    rows = tx.all(
        "SELECT id, delivery, source_kind, source_ref, content, fate, yields_to_followup FROM inbox"
        " WHERE session_id=? AND fate='queued' ORDER BY queued_seq",
        (session_id,),
    )
    st.queue = tuple(dict(r) for r in rows) if len(rows) <= KNOWN_QUEUE else None
    return rows


def wakes(rows: list[Any]) -> bool:
    """Whether one of ``rows`` (:func:`queued`) is a waking message (a follow-up or a steer)."""
    return any(row["delivery"] in _WAKING for row in rows)


def admit(tx: Tx, session_id: str, turn_id: str, *, waking: bool, rows: list[Any] | None = None) -> list[Admitted]:
    """Admit queued messages into ``turn_id``: every queued one when ``waking`` (``rows``: as
    :func:`queued` read them in this transaction), else steer and context.

    Admission is durable (the ``message/admitted`` event carries the content) before any model
    sees it.
    """
    if waking:
        rows = queued(tx, session_id) if rows is None else rows
    elif (known := tx.state(session_id).queue) is not None:
        rows = [r for r in known if r["delivery"] in (Delivery.STEER.value, Delivery.CONTEXT.value)]
    else:
        rows = tx.all(
            "SELECT id, delivery, source_kind, source_ref, content, fate FROM inbox WHERE session_id=?"
            " AND fate='queued' AND delivery IN ('steer', 'context') ORDER BY queued_seq",
            (session_id,),
        )
    admitted: list[Admitted] = []
    for row in rows:
        transition_fate(Fate(row["fate"]), Fate.ADMITTED)
        planned = admitted_of(row, 0)
        event = tx.emit(
            session_id,
            EventType.MESSAGE_ADMITTED,
            {
                "messageId": row["id"],
                "turnId": turn_id,
                "delivery": row["delivery"],
                "source": planned.source.model_dump(mode="json", exclude_none=True),
                "content": [b.model_dump(mode="json") for b in planned.content],
            },
        )
        admitted.append(planned.model_copy(update={"seq": event.seq}))
    if waking:
        tx.state(session_id).queue = ()  # every queued message is admitted
    else:
        _known(tx, session_id, lambda queue: _without(queue, {a.message_id for a in admitted}))
    if admitted:
        tx.write(
            "UPDATE inbox SET fate='admitted', turn_id=?, ended_at=? WHERE id IN ("
            + ",".join("?" * len(admitted))
            + ")",
            (turn_id, tx.now, *(a.message_id for a in admitted)),
        )
    return admitted


def admitted_of(row: Mapping[str, Any], seq: int) -> Admitted:
    """A queued message's row (:func:`queued`) as a turn admits it, its event numbered ``seq``."""
    return Admitted(
        message_id=MessageId(row["id"]),
        delivery=Delivery(row["delivery"]),
        source=Source(kind=row["source_kind"], ref=row["source_ref"]),
        content=content_from_json(row["content"]),
        seq=seq,
    )


def get_message(tx_or_conn: Tx | Conn, message_id: str) -> dict[str, Any] | None:
    """The inbox row of ``message_id`` as a plain dict (for inspection and tests)."""
    conn = tx_or_conn.conn if isinstance(tx_or_conn, Tx) else tx_or_conn
    row = conn.execute("SELECT * FROM inbox WHERE id=?", (message_id,)).fetchone()
    return dict(row) if row is not None else None
