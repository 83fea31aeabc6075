"""Goal figures for reporting (the daemon's metrics): one small row per goal, no whole goal loaded.

A goal started by a schedule has the idempotency key ``<schedule id>@<instant>``
(``daemon.schedule.firing``); :class:`GoalFact` carries that schedule id so the daemon can label
spend by schedule, a label set as small as the number of schedules.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.db import Conn


@dataclass(frozen=True)
class GoalFact:
    """What the metrics need of one goal."""

    status: str
    guard_id: str
    #: The schedule whose fire created the goal (``None``: created otherwise).
    schedule_id: str | None
    rounds: int


def _schedule_of(idempotency_key: str | None) -> str | None:
    head, at, _ = (idempotency_key or "").partition("@")
    return head if at and head.startswith("sch_") else None


def goal_facts(conn: Conn) -> list[GoalFact]:
    """One :class:`GoalFact` per goal (in a read)."""
    rows = conn.execute("SELECT status, guard_id, idempotency_key, rounds FROM goals").fetchall()
    return [GoalFact(str(r[0]), str(r[1]), _schedule_of(r[2]), int(r[3])) for r in rows]
