"""Spend guard rows: the runtime's functions over the ``guards`` table.

A guard row holds a budget's limits (tokens, cost, deadline, wall time) and when its wall time
started; what was spent is not stored on it but summed from the calls charged to it
(:func:`agent.calls.usage_of_guard`), so a crash never leaves a counter behind its calls. Every
read or change of a guard row goes through these functions (the goal engine creates and updates
a goal's guard inside its own transactions), so the table has one owner. The live, in-memory
:class:`~agent.spend.SpendGuard` shared by a guard's sessions is the runtime's
(:meth:`agent.runtime.Runtime.guard`), loaded with :func:`load_guard`.
"""

from __future__ import annotations

from datetime import datetime

from agent.calls import guard_usage_query, usage_of_row
from agent.errors import NotFound
from agent.ids import GuardId
from agent.spend import Limits, SpendGuard
from agent.tx import Tx


def create_guard(tx: Tx, limits: Limits, guard_id: GuardId | None = None) -> GuardId:
    """Insert a spend guard row."""
    gid = guard_id or GuardId.new()
    tx.write(
        "INSERT INTO guards(id, max_tokens, max_cost, deadline, max_wall_seconds, wall_started_at, created_at)"
        " VALUES (?,?,?,?,?,?,?)",
        (
            gid,
            limits.max_tokens,
            limits.max_cost,
            limits.deadline.isoformat() if limits.deadline else None,
            limits.max_wall_seconds,
            tx.now,
            tx.now,
        ),
    )
    return gid


def update_guard(tx: Tx, guard_id: str, limits: Limits) -> None:
    """Change a guard's limits."""
    cur = tx.execute(
        "UPDATE guards SET max_tokens=?, max_cost=?, deadline=?, max_wall_seconds=? WHERE id=?",
        (
            limits.max_tokens,
            limits.max_cost,
            limits.deadline.isoformat() if limits.deadline else None,
            limits.max_wall_seconds,
            guard_id,
        ),
    )
    if cur.rowcount == 0:
        raise NotFound(f"no spend guard {guard_id}")


def load_guard(tx: Tx, guard_id: str) -> SpendGuard:
    """A guard row as a :class:`~agent.spend.SpendGuard`, with what its calls have spent so far.

    Raises:
        NotFound: no such guard.
    """
    tx.last_read()  # the COMMIT goes with the reads: a load writes nothing
    rows, usage = tx.reads(("SELECT * FROM guards WHERE id=?", (guard_id,)), guard_usage_query(guard_id))
    if not rows:
        raise NotFound(f"no spend guard {guard_id}")
    row = rows[0]
    tokens, cost = usage_of_row(usage[0] if usage else None)
    limits = Limits(
        max_tokens=row["max_tokens"],
        max_cost=row["max_cost"],
        deadline=datetime.fromisoformat(row["deadline"]) if row["deadline"] else None,
        max_wall_seconds=row["max_wall_seconds"],
    )
    started = datetime.fromisoformat(row["wall_started_at"]) if row["wall_started_at"] else None
    return SpendGuard(
        id=GuardId(guard_id), limits=limits, spent_tokens=tokens, spent_cost=cost, wall_started_at=started
    )


__all__ = ["create_guard", "load_guard", "update_guard"]
