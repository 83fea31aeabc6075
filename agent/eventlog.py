"""Reading a session's stored events: a window of its sequence, and where the stored part begins.

Plain functions of a SQLite connection, run on the store's thread (in :meth:`Store.read
<agent.store.Store.read>`, or in a transaction through ``tx.conn``), so a reader composes them with
its own queries without another hop. Retention may have pruned a session's oldest events: what is
stored is one contiguous run from :func:`first_kept_seq` on.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from agent.db import Conn
from agent.events import Event


def read_events(
    conn: Conn,
    session_id: str,
    after_seq: int,
    *,
    limit: int = 1000,
    types: Sequence[str] | None = None,
    upto: int | None = None,
) -> list[Event]:
    """Stored events of a session with ``after_seq < seq <= upto``, in order, at most ``limit``
    (on the store thread: in a read, or in a transaction through ``tx.conn``)."""
    high = upto if upto is not None else 2**62
    if types:
        marks = ",".join("?" * len(types))
        rows = conn.execute(
            "SELECT seq, type, data, at FROM events WHERE session_id=? AND seq>? AND seq<=?"
            f" AND type IN ({marks}) ORDER BY seq LIMIT ?",
            (session_id, after_seq, high, *types, limit),
        ).fetchall()
    else:
        rows = conn.execute(
            "SELECT seq, type, data, at FROM events WHERE session_id=? AND seq>? AND seq<=? ORDER BY seq LIMIT ?",
            (session_id, after_seq, high, limit),
        ).fetchall()
    return events_of_rows(session_id, rows)


def events_after_query(session_id: str, after: tuple[str, Sequence[Any]], upto: int) -> tuple[str, tuple[Any, ...]]:
    """A read of the session's events with ``after < seq <= upto``, in order, as a statement and its
    parameters (for :meth:`agent.tx.Tx.reads`), where ``after`` is an SQL expression and its
    parameters: a scalar subquery of the caller's own table, read in the same statement."""
    expr, params = after
    sql = f"SELECT seq, type, data, at FROM events WHERE session_id=? AND seq > ({expr}) AND seq<=? ORDER BY seq"
    return sql, (session_id, *params, upto)


def events_of_rows(session_id: str, rows: Sequence[Any]) -> list[Event]:
    """A session's events from their rows (``seq``, ``type``, ``data``, ``at``), in the rows' order."""
    return [
        Event(session_id=session_id, seq=r["seq"], type=r["type"], data=json.loads(r["data"]), at=r["at"]) for r in rows
    ]


def first_kept_seq(conn: Conn, session_id: str) -> int | None:
    """The lowest sequence number still stored for the session (``None``: it has no events)."""
    row = conn.execute("SELECT MIN(seq) FROM events WHERE session_id=?", (session_id,)).fetchone()
    return int(row[0]) if row is not None and row[0] is not None else None
