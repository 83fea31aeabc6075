"""A goal's own row, out as plain data and back in (``goald goal export`` / ``import``).

Only a goal that has ended moves (completed, failed, cancelled, exhausted): a live one is being
driven by its daemon's engine, which would not learn of a copy, and moving it mid-round could not
be a consistent snapshot. Import refuses a goal id, ``key`` or idempotency key the store already
holds (nothing is overwritten) and a column this schema does not know.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent import Tx
from agent.db import Conn
from agent.transfer import table_columns
from goals.errors import GoalConflict, GoalNotFound, InvalidGoal
from goals.queries import resolve_goal_id

#: Statuses a goal may move in.
ENDED = ("completed", "failed", "cancelled", "exhausted")


def export_goal_row(conn: Conn, goal_ref: str) -> dict[str, Any]:
    """The goal's row as ``{column: value}`` (in a read); ``goal_ref`` is a key, an id or a unique
    id prefix, as every goal verb takes (:func:`goals.queries.resolve_goal_id`).

    Raises:
        GoalNotFound: no such goal.
        InvalidGoal: the goal is still live, or the reference is malformed or ambiguous.
    """
    goal_id = resolve_goal_id(conn, goal_ref)
    cursor = conn.execute("SELECT * FROM goals WHERE id=?", (goal_id,))
    row = cursor.fetchone()
    if row is None:
        raise GoalNotFound(f"no goal {goal_id}")
    data = dict(zip([d[0] for d in cursor.description], row, strict=True))
    if data["status"] not in ENDED:
        raise InvalidGoal(
            f"goal {goal_id} is {data['status']}: only an ended goal moves ({', '.join(ENDED)}); cancel it first"
        )
    return data


def import_goal_row(tx: Tx, row: Mapping[str, Any]) -> str:
    """Insert an exported goal row (in the caller's transaction); returns its id.

    Raises:
        InvalidGoal: a live status, or a column this goald does not know.
        GoalConflict: the id, key or idempotency key is already used here.
    """
    if row.get("status") not in ENDED:
        raise InvalidGoal(f"the goal's status is {row.get('status')!r}: only an ended goal moves ({', '.join(ENDED)})")
    have = table_columns(tx.conn, "goals")
    extra = set(row) - have
    if extra:
        raise InvalidGoal(f"the goal has column(s) {sorted(extra)} this goald does not know")
    for column in ("id", "key", "idempotency_key"):
        value = row.get(column)
        if value is not None and tx.one(f"SELECT 1 FROM goals WHERE {column}=?", (value,)) is not None:
            raise GoalConflict(f"a goal with {column} {value!r} already exists here; nothing was imported")
    cols = sorted(row)
    tx.execute(f"INSERT INTO goals({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})", [row[c] for c in cols])
    return str(row["id"])
