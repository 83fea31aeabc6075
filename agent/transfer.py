"""Moving sessions between stores: every row of a session tree, out as plain data and back in.

A goal moves between daemons with its history (``goald goal export`` / ``import``); the runtime's
part is the session it ran on, the sessions its subagents ran on (the ``parent_session_id``
tree), their events, inbox, turns and model calls, and the spend guards they used. Rows travel
as ``{column: value}`` objects, so a document written by an older schema (fewer columns) still
imports, its missing columns taking their defaults; a column this schema does not have is refused
by name. Import writes inside the caller's transaction and refuses, before writing anything, a
session or guard id the store already holds: nothing is merged, nothing overwritten.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agent.db import Conn, is_postgres
from agent.errors import Conflict, InvalidInput
from agent.tx import Tx

#: The runtime's tables a session tree has rows in, in the order they are written back.
TABLES = ("guards", "sessions", "inbox", "turns", "events", "model_calls")
Rows = dict[str, list[dict[str, Any]]]


def _tree(conn: Conn, root: str) -> list[str]:
    rows = conn.execute(
        "WITH RECURSIVE tree(id) AS (SELECT id FROM sessions WHERE id=?"
        " UNION SELECT s.id FROM sessions s JOIN tree ON s.parent_session_id = tree.id) SELECT id FROM tree",
        (root,),
    ).fetchall()
    return [str(r[0]) for r in rows]


def _dicts(cursor: Any) -> list[dict[str, Any]]:
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def export_session_tree(conn: Conn, root: str) -> Rows:
    """Every row of session ``root`` and its descendants, by table (in a read).

    Raises:
        InvalidInput: ``root`` is not a session of this store.
    """
    ids = _tree(conn, root)
    if not ids:
        raise InvalidInput(f"no session {root}")
    marks = ",".join("?" * len(ids))
    out: Rows = {
        "sessions": _dicts(conn.execute(f"SELECT * FROM sessions WHERE id IN ({marks}) ORDER BY id", ids)),
        "inbox": _dicts(conn.execute(f"SELECT * FROM inbox WHERE session_id IN ({marks}) ORDER BY id", ids)),
        "turns": _dicts(conn.execute(f"SELECT * FROM turns WHERE session_id IN ({marks}) ORDER BY id", ids)),
        "events": _dicts(
            conn.execute(f"SELECT * FROM events WHERE session_id IN ({marks}) ORDER BY session_id, seq", ids)
        ),
        "model_calls": _dicts(
            conn.execute(f"SELECT * FROM model_calls WHERE session_id IN ({marks}) ORDER BY id", ids)
        ),
    }
    guards = sorted({s["guard_id"] for s in out["sessions"] if s.get("guard_id")})
    gmarks = ",".join("?" * len(guards))
    out["guards"] = _dicts(conn.execute(f"SELECT * FROM guards WHERE id IN ({gmarks})", guards)) if guards else []
    return out


def table_columns(conn: Conn, table: str) -> set[str]:
    """The names of ``table``'s columns (empty: no such table), on either store: SQLite's
    ``PRAGMA table_info``, PostgreSQL's ``information_schema``. ``table`` is a constant of the
    caller's, never input (SQLite's pragma cannot take it as a parameter)."""
    if is_postgres(conn):
        rows = conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema()"
            " AND table_name = ?",
            (table,),
        ).fetchall()
        return {str(r[0]) for r in rows}
    return {str(r[1]) for r in conn.execute(f"PRAGMA table_info({table})").fetchall()}


def import_session_tree(tx: Tx, rows: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """Write an exported session tree into this store (in the caller's transaction); returns the
    session ids.

    Raises:
        InvalidInput: an unknown table or column, or rows that do not belong to the tree's sessions.
        Conflict: a session or guard id that this store already holds.
    """
    unknown = set(rows) - set(TABLES)
    if unknown:
        raise InvalidInput(f"unknown table(s) {sorted(unknown)}; expected {list(TABLES)}")
    sessions = [str(s.get("id")) for s in rows.get("sessions", [])]
    if not sessions:
        raise InvalidInput("the document has no session")
    for table in TABLES:
        have = table_columns(tx.conn, table)
        for row in rows.get(table, []):
            extra = set(row) - have
            if extra:
                raise InvalidInput(f"{table} rows have column(s) {sorted(extra)} this goald does not know")
            if table in ("inbox", "turns", "events", "model_calls") and row.get("session_id") not in sessions:
                raise InvalidInput(f"a {table} row belongs to session {row.get('session_id')!r}, not to the document's")
    marks = ",".join("?" * len(sessions))
    taken = tx.all(f"SELECT id FROM sessions WHERE id IN ({marks})", sessions)
    if taken:
        raise Conflict(f"session {taken[0][0]} already exists in this store; nothing was imported")
    guards = [str(g.get("id")) for g in rows.get("guards", [])]
    if guards:
        gmarks = ",".join("?" * len(guards))
        held = tx.all(f"SELECT id FROM guards WHERE id IN ({gmarks})", guards)
        if held:
            raise Conflict(f"spend guard {held[0][0]} already exists in this store; nothing was imported")
    for table in TABLES:
        for row in rows.get(table, []):
            cols = sorted(row)
            tx.execute(
                f"INSERT INTO {table}({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                [row[c] for c in cols],
            )
    return sessions
