"""Creating a goal: one transaction writes the goal row, its spend guard and its session, claims
its work directory and enqueues round 1's continuation, so a goal never exists half made.

The session is a new one, or the existing session the spec names, which then becomes the goal's:
it takes the goal's guard, the goal tools and the goal's tool allowlist, and the goal works where
that session works when the spec gives no work directory. The goal's cursor starts at the
session's last event, so what the session did before is not counted as the goal's first round.
A repeated ``idempotency_key`` returns the goal first created with it, writing nothing.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from agent import SessionId, ToolPolicy, Tx, create_guard, create_session, load_session, update_session
from goals.budgets import guard_limits
from goals.continuation import render
from goals.errors import GoalConflict, InvalidGoal
from goals.locks import claim_workdir
from goals.model import Goal, GoalId, GoalMemory, GoalSpec, GoalStatus
from goals.payloads import Caller
from goals.store import (
    emit_changed,
    goal_by_idempotency_key,
    goal_by_key,
    insert_goal,
    issue_continuation,
    live_goal_of_session,
)


def create_goal(
    tx: Tx,
    spec: GoalSpec,
    *,
    goal_id: GoalId,
    workdir: Path | None,
    baseline: str | None,
    policy: ToolPolicy | None,
    now: datetime,
    caller: Caller | None = None,
    base_commit: str | None = None,
) -> tuple[Goal, bool]:
    """Create the goal of ``spec`` in ``tx``; ``(goal, created)``, where a repeated idempotency key
    returns the goal first created with it and ``created`` false.

    Raises:
        GoalConflict: the key is taken, or the session given already has a live goal.
        InvalidGoal: verification or progress commands without a work directory.
    """
    if spec.idempotency_key is not None:
        earlier = goal_by_idempotency_key(tx, spec.idempotency_key)
        if earlier is not None:
            return earlier, False
    if spec.key is not None and goal_by_key(tx, spec.key) is not None:
        raise GoalConflict(f"a goal with key {spec.key!r} already exists: use another key")
    draft = _draft(spec, goal_id, workdir, baseline, now).model_copy(update={"base_commit": base_commit})
    guard_id = create_guard(tx, guard_limits(draft, now))
    draft, sid = _bind_session(tx, draft, spec, policy, guard_id)
    if spec.verify and draft.workdir is None:
        raise InvalidGoal("verification commands need a work directory: give the goal a workdir")
    if spec.progress is not None and draft.workdir is None:
        raise InvalidGoal("a progress command needs a work directory: give the goal a workdir")
    goal = draft.model_copy(update={"session_id": sid, "guard_id": guard_id})
    claim_workdir(tx, goal)
    emit_changed(tx, None, goal, caller)
    goal = goal.model_copy(update={"evaluated_seq": tx.state(sid).last_seq})
    goal = issue_continuation(tx, goal, 1, render(goal, 1, now))
    insert_goal(tx, goal)
    return goal, True


def _draft(spec: GoalSpec, goal_id: GoalId, workdir: Path | None, baseline: str | None, now: datetime) -> Goal:
    """A new goal of ``spec`` (every field of the spec, as given), before it has its session and guard."""
    return Goal.model_validate(
        {
            **{name: getattr(spec, name) for name in GoalSpec.model_fields},
            "id": goal_id,
            "title": spec.title or spec.objective.strip().splitlines()[0][:80],
            "status": GoalStatus.ACTIVE,
            "session_id": "ses_pending",
            "guard_id": "grd_pending",
            "workdir": str(workdir) if workdir else None,
            "memory": GoalMemory(fingerprint=baseline),
            "active_since": now,
            "created_at": now,
            "updated_at": now,
        }
    )


def _bind_session(
    tx: Tx, draft: Goal, spec: GoalSpec, policy: ToolPolicy | None, guard_id: str
) -> tuple[Goal, SessionId]:
    """The new goal's session: ``spec``'s existing one, made the goal's (its guard, the goal tools,
    the goal's allowlist), or a new one; the goal works where an existing session works.

    Raises:
        GoalConflict: that session already has a live goal.
    """
    if spec.session_id is not None:
        sid = SessionId.parse(spec.session_id)
        srow = load_session(tx, sid)
        tx.state(sid)  # the session's lock before it changes (a creation holds goals.locks.CLAIMS only)
        if draft.workdir is None and srow.workdir:
            # The goal works where its session works (its verification runs there too).
            draft = draft.model_copy(update={"workdir": srow.workdir})
        if live_goal_of_session(tx, sid) is not None:
            raise GoalConflict(
                f"session {sid} already has an active or paused goal: cancel that goal first,"
                " or give the new goal a session of its own"
            )
        # The session becomes the goal's: the goal's guard, the goal tools, the goal's allowlist.
        attach: dict[str, Any] = {"goal": True}
        if policy is not None:
            attach["policy"] = policy.model_dump(mode="json")
        update_session(tx, sid, guard_id=guard_id, config=attach)
    else:
        config: dict[str, Any] = {"goal": True}
        if policy is not None:
            config["policy"] = policy.model_dump(mode="json")
        sid = create_session(tx, model=spec.model, workdir=draft.workdir, guard_id=guard_id, config=config)
    return draft, sid


def check_workdir(raw: str | None, allowed_roots: list[Path] | None) -> Path | None:
    """The goal's work directory as given, resolved: absolute, inside ``allowed_roots`` (when
    there are any) and an existing directory.

    Raises:
        InvalidGoal: naming what is wrong with it.
    """
    if raw is None:
        return None
    path = Path(raw).expanduser()
    if not path.is_absolute():
        raise InvalidGoal(f"workdir {raw!r} must be an absolute path: give the full path")
    path = path.resolve()
    if allowed_roots is not None and not any(
        path == root.resolve() or path.is_relative_to(root.resolve()) for root in allowed_roots
    ):
        roots = ", ".join(str(r) for r in allowed_roots) or "none configured"
        raise InvalidGoal(f"workdir {raw!r} is outside the allowed work-directory roots ({roots})")
    if not path.is_dir():
        raise InvalidGoal(f"workdir {raw!r} does not exist or is not a directory: create it first")
    return path


__all__ = ["check_workdir", "create_goal"]
