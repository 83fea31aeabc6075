"""The outbox: notifications for the outside world, written in the transaction of the change they report.

Why an outbox in the runtime's store: a notification sent *after* a change commits is lost when the
process dies in between, and one sent *before* reports a change that may never commit. A row written
by the changing transaction itself (:func:`put`) exists exactly when the change does; a sender then
delivers the rows at least once, from durable state, across restarts. The runtime owns the tables
(every package writes through these functions inside its own transaction: the goal engine when a
goal pauses, the daemon's scheduler when a run is missed); what the rows mean and where they go is
the daemon's business.

Three tables:

* ``outbox``: one row per notification (``ntf_`` id, kind, JSON payload, an optional *group* key
  naming its cause). A row is *sealed* into a message (``message_id``) before anything is sent.
* ``outbox_deliveries``: one row per (message, sink) with its state (``pending`` → ``delivered``
  or ``failed`` after the last attempt), attempt count and the time of the next attempt.
* ``outbox_attempts``: every attempt, with its time, outcome, HTTP status or error and duration.

Grouping: rows with the same group key are sealed into **one** message once the oldest of them has
waited ``window`` seconds (a 401 that pauses a thousand goals is one message with the count); a row
without a group key is sealed at once. A message's id is its first notification's id, fixed at
sealing, so every attempt at every sink carries the same id (receivers de-duplicate on it).

At-least-once, precisely: a delivery is recorded in a transaction after the sink answered; a crash
between the two repeats the delivery (same id) after the restart. Nothing else repeats one.

The sender learns of new rows without polling: :func:`put` sets the store's outbox signal
(:func:`signal_of`) after its transaction commits.
"""

from __future__ import annotations

import asyncio
import enum
import json
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from agent.db import Conn
from agent.ids import TypedId
from agent.store import Store
from agent.tx import Tx

#: The name whose lock the outbox's own writes hold (:meth:`agent.store.Store.transact`'s ``named``):
#: sealing notifications, recording a delivery's attempts, pruning. On PostgreSQL they run one at a
#: time across the cluster (a message sealed once, each attempt recorded once) with the writer lock
#: only shared: the sessions' writes, which add notifications, go on meanwhile; a notification
#: committed while a seal runs waits for the next one.
LOCK = "outbox"

#: How many notification payloads a grouped message carries in full (the ids and count are all there).
GROUP_PAYLOADS = 20


class NotificationId(TypedId):
    """A notification's id (also the id of the message it leads)."""

    prefix = "ntf_"


class DeliveryState(enum.StrEnum):
    """One message's delivery to one sink."""

    #: Not delivered yet: attempted at ``next_at`` (again).
    PENDING = "pending"
    #: The sink accepted it (recorded after its answer).
    DELIVERED = "delivered"
    #: Every allowed attempt failed; it is not tried again.
    FAILED = "failed"


# -- writing (inside any package's transaction) ---------------------------------------------------

_signals: weakref.WeakKeyDictionary[Store, asyncio.Event] = weakref.WeakKeyDictionary()
_woken: weakref.WeakSet[Tx] = weakref.WeakSet()


def signal_of(store: Store) -> asyncio.Event:
    """The event set after every commit that wrote an outbox row (the sender waits on it)."""
    event = _signals.get(store)
    if event is None:
        event = _signals[store] = asyncio.Event()
    return event


def _wake(store: Store) -> None:
    event = _signals.get(store)
    if event is not None:
        event.set()


def put(tx: Tx, kind: str, payload: dict[str, Any], *, group: str | None = None) -> NotificationId:
    """Write one notification in the caller's transaction; it exists exactly if that commits.

    ``group``: the key of its cause; notifications with one key within the window are one message.
    """
    nid = NotificationId.new()
    body = {**payload, "id": nid, "kind": kind, "time": tx.now}
    tx.execute(
        "INSERT INTO outbox(id, kind, grp, payload, created_at) VALUES (?,?,?,?,?)",
        (nid, kind, group, json.dumps(body, separators=(",", ":"), ensure_ascii=False, default=str), tx.now),
    )
    if tx not in _woken:
        _woken.add(tx)
        store = tx.store
        tx.after_commit(lambda: _wake(store))
    return nid


# -- sealing and delivering (the sender's transactions) -------------------------------------------


def _iso(dt: datetime) -> str:
    return dt.astimezone(UTC).isoformat(timespec="microseconds")


def has_unsealed(conn: Conn) -> bool:
    """Whether a notification waits to be sealed (in a read: no lock, so a sender that finds none
    opens no write, which on PostgreSQL would hold the whole cluster's writes for its round trips)."""
    return conn.execute("SELECT 1 FROM outbox WHERE message_id IS NULL LIMIT 1").fetchone() is not None


def seal(tx: Tx, window: float, sinks_for: Callable[[str], Sequence[str]], limit: int = 5000) -> float | None:
    """Seal unsealed notifications into messages, with a pending delivery per sink ``sinks_for(kind)``.

    A notification without a group is sealed now; a group once its oldest row has waited ``window``
    seconds. Returns the seconds until the next group is due (``None``: nothing waits).
    """
    now = datetime.fromisoformat(tx.now)
    cutoff = _iso(now - timedelta(seconds=window))
    rows = tx.all("SELECT id, kind, grp, created_at FROM outbox WHERE message_id IS NULL ORDER BY id LIMIT ?", (limit,))
    messages: list[list[Any]] = []
    groups: dict[str, list[Any]] = {}
    for r in rows:
        if r["grp"] is None:
            messages.append([r])
        else:
            groups.setdefault(r["grp"], []).append(r)
    wait: float | None = None
    for members in groups.values():
        oldest = members[0]["created_at"]
        if oldest <= cutoff:
            messages.append(members)
        else:
            due = (datetime.fromisoformat(oldest) - datetime.fromisoformat(cutoff)).total_seconds()
            wait = due if wait is None else min(wait, due)
    for members in messages:
        leader = members[0]["id"]
        ids = [m["id"] for m in members]
        for chunk in range(0, len(ids), 500):
            part = ids[chunk : chunk + 500]
            tx.execute(f"UPDATE outbox SET message_id=? WHERE id IN ({','.join('?' * len(part))})", (leader, *part))
        for sink in sinks_for(members[0]["kind"]):
            tx.execute(
                "INSERT INTO outbox_deliveries(message_id, sink, state, next_at) VALUES (?,?,?,?)"
                " ON CONFLICT (message_id, sink) DO NOTHING",
                (leader, sink, DeliveryState.PENDING.value, tx.now),
            )
    if len(rows) == limit:
        return 0.0  # more unsealed rows than one step seals: go on at once
    return wait


@dataclass(frozen=True)
class Message:
    """What one delivery sends: the leading notification's payload, every id it carries and the count."""

    id: str
    kind: str
    group: str | None
    count: int
    ids: list[str]
    #: The first :data:`GROUP_PAYLOADS` notifications' payloads (the leader's first).
    payloads: list[dict[str, Any]]
    created_at: str


@dataclass(frozen=True)
class Due:
    """One pending delivery whose time has come."""

    message: Message
    sink: str
    attempts: int


def _message(conn: Conn, message_id: str) -> Message:
    rows = conn.execute(
        "SELECT id, kind, grp, payload, created_at FROM outbox WHERE message_id=? ORDER BY id", (message_id,)
    ).fetchall()
    first = rows[0]
    return Message(
        id=message_id,
        kind=first["kind"],
        group=first["grp"],
        count=len(rows),
        ids=[r["id"] for r in rows],
        payloads=[json.loads(r["payload"]) for r in rows[:GROUP_PAYLOADS]],
        created_at=first["created_at"],
    )


def due(conn: Conn, now: datetime, sinks: Iterable[str], limit: int = 200) -> list[Due]:
    """Pending deliveries to ``sinks`` due at ``now``, oldest message first, at most ``limit``."""
    names = list(sinks)
    if not names:
        return []
    rows = conn.execute(
        "SELECT message_id, sink, attempts FROM outbox_deliveries WHERE state='pending' AND next_at <= ?"
        f" AND sink IN ({','.join('?' * len(names))}) ORDER BY message_id LIMIT ?",
        (_iso(now), *names, limit),
    ).fetchall()
    cache: dict[str, Message] = {}
    out = []
    for r in rows:
        mid = r["message_id"]
        if mid not in cache:
            cache[mid] = _message(conn, mid)
        out.append(Due(cache[mid], r["sink"], int(r["attempts"])))
    return out


def next_due(conn: Conn, sinks: Iterable[str]) -> datetime | None:
    """When the earliest pending delivery to ``sinks`` is due (``None``: none is pending)."""
    names = list(sinks)
    if not names:
        return None
    row = conn.execute(
        f"SELECT MIN(next_at) FROM outbox_deliveries WHERE state='pending' AND sink IN ({','.join('?' * len(names))})",
        names,
    ).fetchone()
    return datetime.fromisoformat(row[0]) if row is not None and row[0] is not None else None


@dataclass(frozen=True)
class Attempt:
    """The outcome of one delivery attempt."""

    ok: bool
    status: int | None = None
    error: str | None = None
    seconds: float = 0.0
    #: A failure no retry can mend (a secret the configuration names has no value): recorded
    #: ``failed`` at once and logged once, not retried for hours.
    permanent: bool = False


def record(tx: Tx, message_id: str, sink: str, attempt_no: int, outcome: Attempt, retry_at: datetime | None) -> None:
    """Record attempt ``attempt_no``; the delivery becomes delivered (ok), pending until ``retry_at``,
    or failed (no ``retry_at``)."""
    tx.execute(
        "INSERT INTO outbox_attempts(message_id, sink, attempt, at, ok, status, error, seconds)"
        " VALUES (?,?,?,?,?,?,?,?) ON CONFLICT (message_id, sink, attempt) DO UPDATE SET at=excluded.at,"
        " ok=excluded.ok, status=excluded.status, error=excluded.error, seconds=excluded.seconds",
        (message_id, sink, attempt_no, tx.now, int(outcome.ok), outcome.status, outcome.error, outcome.seconds),
    )
    if outcome.ok:
        state, next_at, delivered = DeliveryState.DELIVERED, tx.now, tx.now
    elif retry_at is not None:
        state, next_at, delivered = DeliveryState.PENDING, _iso(retry_at), None
    else:
        state, next_at, delivered = DeliveryState.FAILED, tx.now, None
    tx.execute(
        "UPDATE outbox_deliveries SET state=?, attempts=?, next_at=?, last_error=?, delivered_at=?"
        " WHERE message_id=? AND sink=?",
        (state.value, attempt_no, next_at, outcome.error, delivered, message_id, sink),
    )


def attempts(conn: Conn, message_id: str) -> list[dict[str, Any]]:
    """Every recorded attempt of a message, by sink and number."""
    rows = conn.execute(
        "SELECT sink, attempt, at, ok, status, error, seconds FROM outbox_attempts WHERE message_id=?"
        " ORDER BY sink, attempt",
        (message_id,),
    ).fetchall()
    return [dict(r) | {"ok": bool(r["ok"])} for r in rows]


def backlog(conn: Conn) -> dict[str, int]:
    """Unsealed notifications and deliveries by state (for health and metrics)."""
    unsealed = conn.execute("SELECT COUNT(*) FROM outbox WHERE message_id IS NULL").fetchone()[0]
    counts = {s.value: 0 for s in DeliveryState}
    for r in conn.execute("SELECT state, COUNT(*) FROM outbox_deliveries GROUP BY state"):
        counts[r[0]] = int(r[1])
    return {"unsealed": int(unsealed), **counts}


def prune(tx: Tx, before: datetime, limit: int = 500) -> int:
    """Delete messages older than ``before`` with no pending delivery (their rows, deliveries and
    attempts); returns how many messages went."""
    leaders = [
        r[0]
        for r in tx.all(
            "SELECT o.id FROM outbox o WHERE o.message_id = o.id AND o.created_at < ? AND NOT EXISTS"
            " (SELECT 1 FROM outbox_deliveries d WHERE d.message_id = o.id AND d.state = 'pending') LIMIT ?",
            (_iso(before), limit),
        )
    ]
    for mid in leaders:
        tx.execute("DELETE FROM outbox_attempts WHERE message_id=?", (mid,))
        tx.execute("DELETE FROM outbox_deliveries WHERE message_id=?", (mid,))
        tx.execute("DELETE FROM outbox WHERE message_id=?", (mid,))
    return len(leaders)
