"""A person's changes to a goal, each one transaction: pause, cancel, fail, resume, edit, delete.

These are the transaction functions behind :class:`~goals.engine.GoalEngine`'s person-facing
methods, as :func:`goals.creation.create_goal` is behind ``create``: each reads the goal inside its
transaction, changes it through the one status transition (:func:`goals.store.set_status`), keeps
its spend guard's limits in step, saves it against the revision it read (a goal changed meanwhile
raises :class:`~goals.errors.StaleDecision` and nothing is written) and records the change as a
durable ``goal/changed`` or ``goal/edited`` event with who asked. The engine runs them and then does
what lives in memory (the guard's limits, the goal's timers, waking the evaluation); keeping the
transactions here leaves the engine to its loop and its evaluation.

:func:`log_change` is the one log line of a committed status change, whoever made it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from loguru import logger

from agent import AgentStatus, Tx, delete_session, read_events, update_guard
from goals.budgets import budget_spent, guard_limits, with_status
from goals.continuation import render
from goals.decision import PolicyInput
from goals.errors import InvalidGoal
from goals.facts import interval_facts
from goals.locks import claim_workdir
from goals.model import Budgets, Goal, GoalStatus, StopReason, VerifyCommand
from goals.payloads import Caller
from goals.policy import decide
from goals.questions import withdraw_on_change
from goals.store import (
    cancel_continuation,
    continuation_queued,
    delete_goal_row,
    emit_changed,
    emit_edited,
    issue_continuation,
    load_goal,
    resolve_goal_id,
    save_goal,
    set_status,
)

#: What ``progress`` says when an edit leaves the progress command as it is.
Unchanged = Literal["unchanged"]


def change_status(
    tx: Tx,
    goal_ref: str,
    status: GoalStatus,
    reason: str,
    cancel_reason: str,
    now: datetime,
    caller: Caller | None = None,
) -> tuple[Goal, GoalStatus]:
    """Move the goal to ``status`` (pause, cancel, fail) and cancel its queued continuation with
    ``cancel_reason``; returns the saved goal and its status before."""
    goal = load_goal(tx, resolve_goal_id(tx.conn, goal_ref))
    before = goal.status
    goal = set_status(tx, goal, status, reason, now)
    if before is GoalStatus.WAITING:
        goal = withdraw_on_change(tx, goal, status, now)
    cancel_continuation(tx, goal, cancel_reason)
    saved = save_goal(tx, goal, goal.revision)
    emit_changed(tx, before, saved, caller)
    return saved, before


def resume_goal(
    tx: Tx,
    goal_ref: str,
    now: datetime,
    *,
    budgets: Budgets | None = None,
    reopen: bool = False,
    caller: Caller | None = None,
) -> tuple[Goal, GoalStatus]:
    """Resume a paused or exhausted goal (``reopen``: an ended one too); returns the saved goal and
    its status before. Its streaks start again, and an idle session gets the next continuation.

    Raises:
        InvalidGoal: an exhausted (or reopened) goal whose budgets are still spent.
    """
    goal = load_goal(tx, resolve_goal_id(tx.conn, goal_ref))
    before = goal.status
    st = tx.state(goal.session_id)
    if before is GoalStatus.PAUSED and st.status is AgentStatus.IDLE and st.last_seq > goal.evaluated_seq:
        # The session went idle after the pause, and the engine has not counted that interval
        # yet: count it here (the paused goal's bookkeeping), so a round that ran is counted
        # once and the next continuation gets the next number.
        events = read_events(tx.conn, goal.session_id, goal.evaluated_seq, limit=1_000_000, upto=st.last_seq)
        goal = decide(PolicyInput(goal, interval_facts(goal, events, st.last_seq), now)).goal
    if budgets is not None:
        goal = goal.model_copy(update={"budgets": budgets})
    if before is GoalStatus.EXHAUSTED or (reopen and not before.live):
        spent = budget_spent(goal, now)
        if spent is not None:
            raise InvalidGoal(f"the goal is still out of budget ({spent.value}): raise that budget to resume")
        # An ended goal let go of its work directory; another may have taken it since.
        claim_workdir(tx, goal)
    goal = resumed(goal, now, reopen=reopen)
    pending = goal.memory.pending_claim is not None
    if st.status is AgentStatus.IDLE and not continuation_queued(tx, goal) and not pending:
        text = render(goal, goal.rounds + 1, now, rerun=goal.infra_streak > 0)
        goal = issue_continuation(tx, goal, goal.rounds + 1, text)
    update_guard(tx, goal.guard_id, guard_limits(goal, now))
    saved = save_goal(tx, goal, goal.revision)
    emit_changed(tx, before, saved, caller)
    return saved, before


def resumed(goal: Goal, now: datetime, *, reopen: bool = False) -> Goal:
    """``goal`` made active again by a person (pure; :func:`resume_goal` checks and writes it): its
    reason and cause go (:func:`goals.budgets.with_status`), its streaks, refused claims, backoff,
    stall warning and last error start again, not its infrastructure streak (a pause is no round,
    and the round it cut is run again as a retry)."""
    goal = with_status(goal, GoalStatus.ACTIVE, None, now, reopen=reopen)
    return goal.model_copy(
        update={
            "stall_streak": 0,
            "error_streak": 0,
            "blocked_streak": 0,
            "refused_claims": 0,
            "not_before": None,
            "memory": goal.memory.model_copy(update={"warned_stall": False, "last_error": None}),
        }
    )


def paused_for(goal: Goal, reason: str | None) -> bool:
    """Whether ``goal`` was paused for ``reason`` (any reason when ``None``); a reason such as
    ``model_error: ...`` matches ``model_error``."""
    got = goal.status_reason or ""
    return reason is None or got == reason or got.startswith(reason + ":")


def check_edit(objective: str | None, title: str | None) -> None:
    """Refuse a blank objective or title before anything is read.

    Raises:
        InvalidGoal: naming the blank field.
    """
    if objective is not None and not objective.strip():
        raise InvalidGoal("objective must not be empty: say what the goal should achieve")
    if title is not None and not title.strip():
        raise InvalidGoal("title must not be blank: give a title, or none to use the objective's first line")


def edit_goal(
    tx: Tx,
    goal_ref: str,
    now: datetime,
    *,
    objective: str | None = None,
    title: str | None = None,
    budgets: Budgets | None = None,
    verify: list[VerifyCommand] | None = None,
    progress: VerifyCommand | Unchanged | None = "unchanged",
    caller: Caller | None = None,
) -> Goal:
    """Change the fields given (``progress=None`` removes the progress command); returns the saved
    goal. What changed is recorded in a ``goal/edited`` event with ``caller``.

    Raises:
        InvalidGoal: a progress command for a goal without a work directory.
    """
    goal = load_goal(tx, resolve_goal_id(tx.conn, goal_ref))
    changes: dict[str, Any] = {}
    if objective is not None:
        changes["objective"] = objective
    if title is not None:
        changes["title"] = title
    if budgets is not None:
        changes["budgets"] = budgets
    if verify is not None:
        changes["verify"] = verify
    if progress != "unchanged":
        if progress is not None and not goal.workdir:
            raise InvalidGoal("a progress command needs a work directory: this goal has none to run it in")
        changes["progress"] = progress
    edited = goal.model_copy(update=changes)
    update_guard(tx, edited.guard_id, guard_limits(edited, now))
    saved = save_goal(tx, edited, edited.revision)
    emit_edited(tx, goal, saved, caller)
    return saved


def delete_goal(tx: Tx, goal_id: str, session_id: str | None) -> int:
    """Delete an ended goal's row and (given ``session_id``) that session with its events; returns
    how many sessions went.

    Raises:
        InvalidGoal: the goal is live. StaleDecision: it changed since it was read.
    """
    delete_goal_row(tx, load_goal(tx, goal_id))
    return 0 if session_id is None else delete_session(tx, session_id)


#: Status reasons that need a person (a key to fix, a model to change): logged at warning.
_WARN_REASONS = (StopReason.AUTH_ERROR, StopReason.MODEL_ERROR)


def log_change(before: GoalStatus | None, goal: Goal) -> None:
    """Log a committed status change with structured fields (goal id, key, status, reason), at
    info; a pause for an authentication or model error at warning, so that ``journalctl -p
    warning`` shows it. Nothing is logged when the status did not change."""
    if before is goal.status:
        return
    reason = goal.status_reason or ""
    needs_person = goal.status is GoalStatus.PAUSED and reason.startswith(_WARN_REASONS)
    detail = f" (last error: {goal.memory.last_error})" if needs_person and goal.memory.last_error else ""
    logger.bind(goal_id=goal.id, goal_key=goal.key, status=goal.status.value, reason=reason or None).log(
        "WARNING" if needs_person else "INFO",
        "goal {} ({}): {} -> {}{}{}",
        goal.id,
        goal.key or goal.title[:60],
        before.value if before is not None else "new",
        goal.status.value,
        f" ({reason})" if reason else "",
        detail,
    )


def log_deleted(goal: Goal, sessions: int) -> None:
    """Log a goal's deletion, with how many sessions went with it."""
    logger.bind(goal_id=goal.id, goal_key=goal.key, status="deleted", reason=None).info(
        "goal {} ({}) deleted with {} session(s)", goal.id, goal.key or goal.title[:60], sessions
    )
