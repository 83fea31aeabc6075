"""Budget arithmetic of a goal: which budget is spent, the spend guard's limits, the model-error
backoff, and a status change that counts the wall time.

Pure functions of a goal and a given ``now``, like the policy that uses them; the engine and a
person's changes (:mod:`goals.operations`) use them too, to keep the goal's spend guard in step with
its budgets. Wall time is counted while the goal is active only, so every status change goes
through :func:`with_status`, which closes the active stretch.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from agent import Limits
from goals.model import Goal, GoalStatus, StopReason, transition


def budget_spent(goal: Goal, now: datetime) -> StopReason | None:
    """Which budget, if any, is spent."""
    b = goal.budgets
    if b.max_rounds is not None and goal.rounds >= b.max_rounds:
        return StopReason.ROUND_LIMIT
    if b.max_tokens_total is not None and goal.tokens >= b.max_tokens_total:
        return StopReason.TOKEN_BUDGET
    if b.max_cost is not None and goal.cost >= b.max_cost - 1e-12:
        return StopReason.COST_BUDGET
    if b.max_wall_seconds is not None and goal.wall_used >= b.max_wall_seconds:
        return StopReason.WALL_TIME
    if b.deadline is not None and now >= b.deadline:
        return StopReason.DEADLINE
    return None


def time_ends(goal: Goal) -> datetime | None:
    """When an active goal's time runs out: the earlier of its deadline and the end of its wall
    time (counted while active); ``None`` when it has neither, or is not active."""
    if goal.status is not GoalStatus.ACTIVE:
        return None
    b = goal.budgets
    ends = [b.deadline] if b.deadline is not None else []
    if b.max_wall_seconds is not None and goal.active_since is not None:
        ends.append(goal.active_since + timedelta(seconds=max(b.max_wall_seconds - goal.wall_used, 0.0)))
    return min(ends, default=None)


def guard_limits(goal: Goal, now: datetime) -> Limits:
    """The spend guard's limits for a goal: its token and cost budgets, and the earlier of its
    deadline and the end of its wall time (counted while active)."""
    b = goal.budgets
    deadline = b.deadline
    if b.max_wall_seconds is not None and goal.status is GoalStatus.ACTIVE:
        wall_end = now + timedelta(seconds=max(b.max_wall_seconds - goal.wall_used, 0.0))
        deadline = wall_end if deadline is None else min(deadline, wall_end)
    return Limits(max_tokens=b.max_tokens_total, max_cost=b.max_cost, deadline=deadline)


def refusal_reason(error: str | None) -> StopReason:
    """Classify the spend guard's refusal text."""
    text = (error or "").lower()
    if text.startswith("deadline"):
        return StopReason.DEADLINE
    if text.startswith("cost"):
        return StopReason.COST_BUDGET
    if text.startswith("wall"):
        return StopReason.WALL_TIME
    return StopReason.TOKEN_BUDGET


def wall_ends_first(goal: Goal, now: datetime) -> bool:
    """Whether the goal's wall time ends before its deadline (the guard folds both into one)."""
    b = goal.budgets
    if b.max_wall_seconds is None:
        return False
    return b.deadline is None or now + timedelta(seconds=b.max_wall_seconds - goal.wall_used) <= b.deadline


def backoff(goal: Goal, errors: int) -> float:
    """Seconds to wait after ``errors`` model errors in a row."""
    r = goal.rules
    return float(min(r.error_backoff_max_seconds, r.error_backoff_seconds * (2 ** max(errors - 1, 0))))


def with_status(
    goal: Goal,
    status: GoalStatus,
    reason: str | None,
    now: datetime,
    *,
    reopen: bool = False,
    cause: str | None = None,
) -> Goal:
    """``goal`` moved to ``status`` with ``reason`` (a legal transition, or only the reason when the
    status stays), its wall time counted up to ``now`` when it leaves ``active``. ``cause`` is the
    words of the event behind it (``memory.cause``): whatever explained the state before goes."""
    memory = goal.memory.model_copy(update={"cause": cause})
    if status is goal.status:
        return goal.model_copy(update={"status_reason": reason, "memory": memory})
    transition(goal.status, status, reopen=reopen)
    wall = goal.wall_used
    if goal.status is GoalStatus.ACTIVE and goal.active_since is not None:
        wall += max((now - goal.active_since).total_seconds(), 0.0)
    return goal.model_copy(
        update={
            "status": status,
            "status_reason": reason,
            "wall_used": wall,
            "active_since": now if status is GoalStatus.ACTIVE else None,
            "memory": memory,
        }
    )


__all__ = [
    "backoff",
    "budget_spent",
    "guard_limits",
    "refusal_reason",
    "time_ends",
    "wall_ends_first",
    "with_status",
]
