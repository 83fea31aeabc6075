"""How the scheduler reaches the goal engine: a fire creates a goal from the schedule's template.

The goal's idempotency key is ``<schedule id>@<scheduled instant>``, so a fire is exactly-once
even when the daemon dies between creating the goal and recording the run: the retried fire
finds the goal it already made.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from goals import GoalEngine, GoalSpec

if TYPE_CHECKING:
    from daemon.host import Host


async def fire_goal(host: Host, schedule: Any, at: datetime) -> str:
    """Create the goal of one fire; returns its id."""
    assert host.engine is not None
    template: dict[str, Any] = dict(schedule.goal)
    stamp = at.strftime("%Y%m%dT%H%M%S")
    workdir = host.workdir_for(template.pop("workdir", None), f"{schedule.id}-{stamp}")
    template.setdefault("title", f"{schedule.key or schedule.id} {stamp}")
    template.setdefault("model", host.settings.default_model)
    spec = GoalSpec.model_validate(
        {**template, "workdir": str(workdir), "idempotency_key": f"{schedule.id}@{at.isoformat()}"}
    )
    host.learn_secrets(spec.sandbox)  # redacted from the new session's tool output
    goal = await host.engine.create(spec)
    return str(goal.id)


async def goal_status(engine: GoalEngine, goal_id: str) -> str | None:
    """The status of a schedule's previous goal (``None`` if it is gone)."""
    try:
        return str((await engine.get(goal_id)).status.value)
    except LookupError:
        return None


async def cancel_goal(engine: GoalEngine, goal_id: str) -> None:
    """Cancel a schedule's previous goal (concurrency ``replace``)."""
    await engine.cancel(goal_id, reason="replaced by the next scheduled run")
