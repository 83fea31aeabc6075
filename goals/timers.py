"""The engine's timers: when an active goal must be decided even though no idle came.

A goal is looked at again, at the latest, when its ``not_before`` passes (the wait after a model
error, or the retry of a failed evaluation), at its deadline, and at the end of its wall time
(counted from ``active_since``). Those times are durable on the goal row; :func:`due_of` reads
them, and :class:`GoalTimers` keeps the earliest per goal in memory and calls ``fire`` once it
has passed. A fired timer only asks for an evaluation, which reads the durable state and may
decide nothing; the in-memory table is rebuilt from the rows at start.

The loop wakes at the nearest due time, and at least every ``interval`` seconds, since the
clock is injected (tests and a suspended machine may move it without a wake-up).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from goals.budgets import time_ends
from goals.model import Goal, GoalStatus

Clock = Callable[[], datetime]


@dataclass(frozen=True)
class Reminders:
    """How a waiting goal's question is repeated to its operator: every ``every`` seconds after it
    was asked, at most ``most`` times (never after its deadline)."""

    every: float
    most: int


def next_reminder(goal: Goal, reminders: Reminders | None) -> datetime | None:
    """When the question a waiting ``goal`` waits on is to be repeated next (``None``: not again)."""
    q = goal.memory.question
    if reminders is None or q is None or q.asked_at is None or q.reminders >= reminders.most:
        return None
    due = q.asked_at + timedelta(seconds=reminders.every * (q.reminders + 1))
    return due if due < q.deadline else None


def due_of(goal: Goal, reminders: Reminders | None = None) -> datetime | None:
    """When an active ``goal`` must be decided at the latest, and a waiting one at its question's
    next reminder or deadline (``None``: neither, or no time set)."""
    if goal.status is GoalStatus.WAITING:
        if goal.memory.question is None:
            return None
        return min(d for d in (goal.memory.question.deadline, next_reminder(goal, reminders)) if d is not None)
    if goal.status is not GoalStatus.ACTIVE:
        return None
    due = [d for d in (goal.not_before, time_ends(goal)) if d is not None]
    return min(due, default=None)


class GoalTimers:
    """The earliest due time of each goal, and the loop that fires them."""

    def __init__(self, clock: Clock, interval: float, fire: Callable[[str], None]) -> None:
        self.clock = clock
        self.interval = interval
        self._fire = fire
        self._due: dict[str, datetime] = {}

    def set(self, goal_id: str, due: datetime | None) -> None:
        """Fire ``goal_id`` at ``due`` (``None``: not at all), replacing its earlier time."""
        if due is None:
            self._due.pop(goal_id, None)
        else:
            self._due[goal_id] = due

    def no_later_than(self, goal_id: str, due: datetime) -> None:
        """Fire ``goal_id`` at ``due`` unless it is due earlier already."""
        self._due[goal_id] = min(self._due.get(goal_id, due), due)

    def drop(self, goal_id: str) -> None:
        """Forget ``goal_id``'s time."""
        self._due.pop(goal_id, None)

    async def run(self) -> None:
        """Fire every time that has passed, forever (cancel to stop)."""
        while True:
            now = self.clock()
            for goal_id, due in list(self._due.items()):
                if due <= now:
                    self._due.pop(goal_id, None)
                    self._fire(goal_id)
            nearest = min(self._due.values(), default=None)
            wait = self.interval
            if nearest is not None:
                wait = min(wait, max((nearest - now).total_seconds(), 0.01))
            await asyncio.sleep(wait)


__all__ = ["GoalTimers", "Reminders", "due_of", "next_reminder"]
