"""Session rows: the runtime's functions over the ``sessions`` table.

Every read or change of a session row from outside the runtime goes through these (the goal engine
attaches a goal's guard and settings to a session, the daemon lists sessions and finds the chain of
parents a subagent's call runs under), so the table has one owner. The transaction functions take a
:class:`~agent.store.Tx`, so a caller composes them with its own writes in one commit; the readers
take a connection or a ``Tx``, so they run inside a read snapshot or a transaction alike.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict

from agent.db import Conn
from agent.errors import NotFound
from agent.events import EventType
from agent.ids import SessionId
from agent.tx import Tx

#: How far :func:`session_chain` follows ``parent_session_id`` (a guard against a corrupt loop).
MAX_CHAIN = 64


class SessionRow(BaseModel):
    """A stored session."""

    model_config = ConfigDict(frozen=True)

    id: SessionId
    parent_session_id: str | None = None
    depth: int = 0
    model: str | None = None
    workdir: str | None = None
    guard_id: str | None = None
    config: dict[str, Any] = {}
    created_at: str


def _conn(tx_or_conn: Tx | Conn) -> Conn:
    return tx_or_conn.conn if isinstance(tx_or_conn, Tx) else tx_or_conn


def _row(row: Any) -> SessionRow:
    data = dict(row)
    data["config"] = json.loads(data["config"] or "{}")
    return SessionRow.model_validate(data)


def create_session(
    tx: Tx,
    *,
    model: str | None = None,
    workdir: str | None = None,
    parent_session_id: str | None = None,
    guard_id: str | None = None,
    config: dict[str, Any] | None = None,
    session_id: SessionId | None = None,
) -> SessionId:
    """Insert a session row and its ``session/created`` event.

    Raises:
        NotFound: the parent session or the spend guard does not exist.
    """
    sid = session_id or SessionId.new()
    depth = 0
    if parent_session_id is not None:
        parent = tx.one("SELECT depth FROM sessions WHERE id=?", (parent_session_id,))
        if parent is None:
            raise NotFound(f"no parent session {parent_session_id}")
        depth = int(parent["depth"]) + 1
    columns = "INSERT INTO sessions(id, parent_session_id, depth, model, workdir, guard_id, config, created_at)"
    values = (sid, parent_session_id, depth, model, workdir, guard_id, json.dumps(config or {}), tx.now)
    if guard_id is None:
        tx.write(f"{columns} VALUES (?,?,?,?,?,?,?,?)", values)
    else:
        # Only if the guard exists, checked where the insert runs (no round trip of its own).
        tx.write(
            f"{columns} SELECT ?,?,?,?,?,?,?,? WHERE EXISTS (SELECT 1 FROM guards WHERE id=?)",
            (*values, guard_id),
            one_row=lambda: NotFound(f"no spend guard {guard_id}"),
        )
    tx.born(sid)
    data: dict[str, Any] = {"model": model, "workdir": workdir, "depth": depth}
    if parent_session_id is not None:
        data["parentSessionId"] = parent_session_id
    tx.emit(sid, EventType.SESSION_CREATED, data)
    return sid


def load_session(tx_or_conn: Tx | Conn, session_id: str) -> SessionRow:
    """The stored session ``session_id``.

    Raises:
        NotFound: no such session.
    """
    row = _conn(tx_or_conn).execute("SELECT * FROM sessions WHERE id=?", (session_id,)).fetchone()
    if row is None:
        raise NotFound(f"no session {session_id}")
    return _row(row)


def update_session(
    tx: Tx, session_id: str, *, guard_id: str | None = None, config: dict[str, Any] | None = None
) -> SessionRow:
    """Give a session a spend guard and/or set top-level keys of its config; returns the new row.

    A key in ``config`` replaces the stored key of that name; other stored keys stay. An agent
    already loaded keeps what it was built with (its owner updates it, as the goal engine does).

    Raises:
        NotFound: no such session, or no such spend guard.
    """
    row = load_session(tx, session_id)
    if guard_id is not None and tx.one("SELECT 1 FROM guards WHERE id=?", (guard_id,)) is None:
        raise NotFound(f"no spend guard {guard_id}")
    merged = {**row.config, **(config or {})}
    tx.execute(
        "UPDATE sessions SET guard_id=?, config=? WHERE id=?",
        (guard_id if guard_id is not None else row.guard_id, json.dumps(merged), session_id),
    )
    return row.model_copy(update={"guard_id": guard_id or row.guard_id, "config": merged})


def sessions_near_query(exact: list[str], low: str, high: str) -> tuple[str, tuple[str, ...]]:
    """The read of the sessions whose work directory is one of ``exact`` or sorts in ``[low, high)``
    (a directory and everything under it: ``low = path + "/"``, ``high = path + "0"``), oldest first,
    and its parameters, to send with other reads (:meth:`agent.tx.Tx.reads`); :func:`session_rows`
    reads its rows."""
    marks = ", ".join("?" * len(exact))
    sql = (
        f"SELECT * FROM sessions WHERE workdir IS NOT NULL"
        f" AND (workdir IN ({marks}) OR (workdir >= ? AND workdir < ?)) ORDER BY id"
    )
    return sql, (*exact, low, high)


def session_rows(rows: list[Any]) -> list[SessionRow]:
    """Stored sessions from rows of the ``sessions`` table."""
    return [_row(r) for r in rows]


def list_sessions(tx_or_conn: Tx | Conn, prefix: str = SessionId.prefix, limit: int = 100) -> list[SessionRow]:
    """Sessions whose id starts with ``prefix``, newest first, at most ``limit``."""
    rows = (
        _conn(tx_or_conn)
        .execute(
            "SELECT * FROM sessions WHERE id >= ? AND id < ? ORDER BY id DESC LIMIT ?",
            (prefix, prefix + "\uffff", limit),
        )
        .fetchall()
    )
    return [_row(r) for r in rows]


def session_chain(tx_or_conn: Tx | Conn, session_id: str) -> list[SessionId]:
    """``session_id`` and its parents, up to the root session: ``[session, parent, …, root]``.

    Empty when the session does not exist; at most :data:`MAX_CHAIN` + 1 long.
    """
    rows = (
        _conn(tx_or_conn)
        .execute(
            "WITH RECURSIVE chain(id, parent, depth) AS ("
            " SELECT id, parent_session_id, 0 FROM sessions WHERE id=?"
            " UNION ALL SELECT s.id, s.parent_session_id, chain.depth + 1 FROM sessions s"
            " JOIN chain ON s.id = chain.parent WHERE chain.depth < ?)"
            " SELECT id FROM chain ORDER BY depth",
            (session_id, MAX_CHAIN),
        )
        .fetchall()
    )
    return [SessionId(r["id"]) for r in rows]


def delete_session(tx: Tx, session_id: str) -> int:
    """Delete a session with its subagent sessions and everything they hold (events, inbox, turns,
    model calls); returns how many sessions went. The caller makes sure none of them is live or
    holds queued work (an ended goal's session, say): this removes history for good.

    Raises:
        NotFound: no such session.
    """
    load_session(tx, session_id)
    rows = tx.conn.execute(
        "WITH RECURSIVE tree(id, depth) AS (SELECT id, 0 FROM sessions WHERE id=?"
        " UNION ALL SELECT s.id, tree.depth + 1 FROM sessions s JOIN tree ON s.parent_session_id = tree.id"
        " WHERE tree.depth < ?) SELECT id FROM tree",
        (session_id, MAX_CHAIN),
    ).fetchall()
    ids = [str(r["id"]) for r in rows]
    for sid in ids:
        tx.execute("DELETE FROM events WHERE session_id=?", (sid,))
        tx.execute("DELETE FROM inbox WHERE session_id=?", (sid,))
        tx.execute("DELETE FROM model_calls WHERE session_id=?", (sid,))
        tx.execute("DELETE FROM turns WHERE session_id=?", (sid,))
        tx.execute("DELETE FROM sessions WHERE id=?", (sid,))
        tx.forget(sid)
    return len(ids)
