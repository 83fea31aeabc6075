"""How the scheduler reaches the goal engine: a fire creates a goal from the schedule's template.

The goal and the instant's ``fired`` run row are written in one transaction: the fire's claim
(:class:`daemon.schedule.claims.FireClaim`) is recorded in the goal's creation transaction, so of
several daemons firing the same instant exactly one makes its goal, and a crash leaves either both
or neither. The goal's idempotency key stays ``<schedule id>@<scheduled instant>`` (a goal made
before the claim existed is found again, not made twice). Firing needs the engine, the
work-directory service, the default model and the secret redaction hook, and nothing else of the
host: it is given exactly those.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from daemon.schedule.claims import FireClaim
from daemon.schedule.model import Schedule
from daemon.workdirs import Workdirs
from daemon.worktrees import make_worktree
from goals import GoalEngine, GoalSpec, SandboxSpec


@dataclass(frozen=True)
class GoalFiring:
    """What a fire needs to create its goal."""

    engine: GoalEngine
    workdirs: Workdirs
    default_model: str
    #: Redact a goal sandbox's secrets from the new session's tool output.
    learn_secrets: Callable[[SandboxSpec], None]

    async def fire(self, schedule: Schedule, at: datetime, claim: FireClaim) -> str:
        """Create the goal of one fire, claiming the instant in the same transaction; returns its id.

        Raises:
            FireTaken: another node (or an earlier pass) handled the instant; nothing was made.
        """
        template: dict[str, Any] = dict(schedule.goal)
        stamp = at.strftime("%Y%m%dT%H%M%S")
        # A trigger's instants are whole seconds; two manual runs within one second are told apart.
        unique = stamp + (f"-{at.microsecond:06d}" if at.microsecond else "")
        repo = template.get("repo")
        workdir = self.workdirs.resolve(None if repo else template.pop("workdir", None), f"{schedule.id}-{unique}")
        template.setdefault("title", f"{schedule.key or schedule.id} {stamp}")
        template.setdefault("model", self.default_model)
        base_commit = None
        if repo:
            # Each fire works on a worktree of its own, on a branch of its own (daemon.worktrees).
            branch = template.get("branch") or f"goald/{schedule.key or schedule.id}/{unique}"
            template["branch"] = branch
            base_commit = await make_worktree(Path(repo), template.get("base") or "HEAD", branch, workdir)
            self.workdirs.hand_tree(workdir)
        spec = GoalSpec.model_validate(
            {**template, "workdir": str(workdir), "idempotency_key": f"{schedule.id}@{at.isoformat()}"}
        )
        self.learn_secrets(spec.sandbox)
        goal = await self.engine.create(
            spec, also=lambda tx, made: claim.record(tx, str(made.id)), base_commit=base_commit
        )
        return str(goal.id)

    async def goal_status(self, goal_id: str) -> str | None:
        """The status of a schedule's previous goal."""
        return await goal_status(self.engine, goal_id)

    async def cancel_goal(self, goal_id: str) -> None:
        """Cancel a schedule's previous goal."""
        await cancel_goal(self.engine, goal_id)


async def goal_status(engine: GoalEngine, goal_id: str) -> str | None:
    """The status of a schedule's previous goal (``None`` if it is gone)."""
    try:
        return str((await engine.get(goal_id)).status.value)
    except LookupError:
        return None


async def cancel_goal(engine: GoalEngine, goal_id: str) -> None:
    """Cancel a schedule's previous goal (concurrency ``replace``)."""
    await engine.cancel(goal_id, reason="replaced by the next scheduled run")
