"""The writes to goal rows, and the transaction functions that change a goal with its continuation.

Goals live in the same file as sessions and inboxes so that a decision, ``evaluated_seq``, the
counters and the continuation commit in **one** transaction (invariant 10). The continuation uses
the runtime's generic ``pending_key`` (at most one queued continuation per goal, by constraint) and
``yields_to_followup`` (a person's follow-up supersedes it).

The ``goals`` table's other parts have their own modules: the schema (:mod:`goals.schema`), the
mapping of a goal to a row (:mod:`goals.rows`) and the reads (:mod:`goals.queries`). Their public
names are re-exported here too, so ``goals.store`` stays the one place to import the table's
functions from.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from agent import Delivery, MessageId, Source, SourceKind, Tx, cancel_pending, enqueue, is_pending, parse_content
from agent.db import Conn, integrity_errors
from agent.inbox import queued_row
from goals.budgets import with_status
from goals.errors import GoalConflict, InvalidGoal, StaleDecision
from goals.known import remember
from goals.model import Goal, GoalStatus, transition
from goals.notices import notify_status
from goals.payloads import Caller
from goals.queries import (
    AMBIGUOUS_SHOWN,
    ENDED_STATUSES,
    goal_by_idempotency_key,
    goal_by_key,
    goal_counts,
    goal_on_branch,
    goal_retention,
    goals_of_session,
    latest_goal_of_session,
    list_goals,
    live_goal_of_chain,
    live_goal_of_session,
    live_goal_sandboxes_with_secrets,
    live_goal_sessions,
    live_goals,
    load_goal,
    resolve_goal_id,
    schedule_of,
    session_node_label,
    sessions_due_for_pruning,
    workdirs_due_for_removal,
)
from goals.rows import COLUMNS, conn_of, goal_from_row, row_values
from goals.schema import MIGRATIONS

GOAL_CHANGED = "goal/changed"
#: A person edited the goal: the fields changed, each before and after, and who asked.
GOAL_EDITED = "goal/edited"
GOAL_PROGRESS = "goal/progress"
GOAL_CLAIM = "goal/claim"
GOAL_BLOCKED = "goal/blocked"
GOAL_VERIFIED = "goal/verified"
#: A paused goal counted a turn that ran while it was paused (its counters; its status stays).
GOAL_COUNTED = "goal/counted"
#: The work directory's walk met a bound (files counted by size and time, reading cut short).
GOAL_FINGERPRINT = "goal/fingerprint"
#: The agent asked its operator a question (``ask_operator``), and a question closed.
GOAL_QUESTION = "goal/question"
GOAL_ANSWERED = "goal/answered"


#: PostgreSQL's names of the goals table's unique indexes, as SQLite's errors name their columns.
_INDEX_COLUMNS = {
    "goals_live_session": "goals.session_id",
    "goals_key_key": "goals.key",
    "goals_idempotency_key_key": "goals.idempotency_key",
}


def _refusal(exc: Exception) -> str:
    """A constraint error's text, naming the column as SQLite does (``UNIQUE constraint failed:
    goals.key``) on either store: PostgreSQL names the index instead, and the work-directory
    triggers raise the same ``goals.workdir …`` text on both."""
    text = str(exc)
    index = getattr(getattr(exc, "diag", None), "constraint_name", None)
    if index in _INDEX_COLUMNS:
        text += f" ({_INDEX_COLUMNS[index]})"
    return text


def insert_goal(tx: Tx, goal: Goal) -> None:
    """Insert a new goal row (on PostgreSQL sent with the transaction's next statement or its
    ``COMMIT``: a refusal is raised there, as the :class:`GoalConflict` it means)."""
    values = row_values(goal)

    def refused(exc: Exception) -> BaseException | None:
        if not isinstance(exc, integrity_errors()):
            return None
        text = _refusal(exc)
        if "goals.session_id" in text:
            return GoalConflict(
                f"session {goal.session_id} already has an active or paused goal: cancel that goal first,"
                " or give the new goal a session of its own"
            )
        if "goals.key" in text:
            return GoalConflict(f"a goal with key {goal.key!r} already exists: use another key")
        return _workdir_held(goal, exc)

    tx.write(
        f"INSERT INTO goals({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})",
        [values[c] for c in COLUMNS],
        refused=refused,
    )
    remember(tx, goal)


def _workdir_held(goal: Goal, exc: Exception) -> GoalConflict | None:
    """The refusal of a goal row whose work directory another live goal holds (``None``: another)."""
    if isinstance(exc, integrity_errors()) and "goals.workdir" in _refusal(exc):
        return GoalConflict(
            f"work directory {goal.workdir} is held by another active or paused goal: wait for it to end, or cancel it"
        )
    return None


def save_goal(tx: Tx, goal: Goal, expected_revision: int) -> Goal:
    """Write ``goal`` if the stored revision is still ``expected_revision``; returns the saved goal.
    On PostgreSQL the update and its check go with the transaction's next statement or its
    ``COMMIT`` (:meth:`agent.tx.Tx.write`): the errors below are raised there.

    Raises:
        StaleDecision: someone changed the goal since it was read.
        GoalConflict: its work directory is held by another live goal.
    """
    saved = goal.model_copy(update={"revision": expected_revision + 1, "updated_at": datetime.fromisoformat(tx.now)})
    values = row_values(saved)
    cols = [c for c in COLUMNS if c not in ("id", "created_at")]
    tx.write(
        f"UPDATE goals SET {', '.join(f'{c}=?' for c in cols)} WHERE id=? AND revision=?",
        [*(values[c] for c in cols), goal.id, expected_revision],
        refused=lambda exc: _workdir_held(goal, exc),
        one_row=lambda: StaleDecision(f"goal {goal.id} changed since it was read"),
    )
    remember(tx, saved)
    return saved


def delete_goal_row(tx: Tx, goal: Goal) -> None:
    """Delete an ended goal's row (completed, failed, cancelled or exhausted).

    Raises:
        InvalidGoal: the goal is active or paused (cancel it first).
        StaleDecision: it changed since it was read.
    """
    if goal.status.live:
        raise InvalidGoal(f"goal {goal.id} is {goal.status.value}: cancel it before deleting it")
    cur = tx.execute("DELETE FROM goals WHERE id=? AND revision=?", (goal.id, goal.revision))
    if cur.rowcount != 1:
        raise StaleDecision(f"goal {goal.id} changed since it was read")


def emit_changed(tx: Tx, before: GoalStatus | None, goal: Goal, caller: Caller | None = None) -> None:
    """Record a status change as a ``goal/changed`` event in the goal's session (and, for a status
    worth telling someone, its notification in the outbox: :mod:`goals.notices`)."""
    if before is goal.status:
        return
    notify_status(tx, before, goal)
    tx.emit(
        goal.session_id,
        GOAL_CHANGED,
        {
            "goalId": goal.id,
            "from": before.value if before else None,
            "status": goal.status.value,
            "reason": goal.status_reason,
            "rounds": goal.rounds,
            "tokens": goal.tokens,
            "cost": goal.cost,
            # Who asked, when a person did through the control socket (uid and pid from the kernel).
            **(caller or {}),
        },
    )


def emit_counted(tx: Tx, before: Goal, goal: Goal) -> None:
    """Record, as a ``goal/counted`` event, that a goal whose status stays counted spend or rounds
    (a paused goal recording the round running at the pause, or a person's message's turn):
    subscribers see the new counters without polling. Nothing when the counters did not move."""
    if (before.rounds, before.tokens, before.cost) == (goal.rounds, goal.tokens, goal.cost):
        return
    tx.emit(
        goal.session_id,
        GOAL_COUNTED,
        {
            "goalId": goal.id,
            "status": goal.status.value,
            "rounds": goal.rounds,
            "tokens": goal.tokens,
            "cost": goal.cost,
        },
    )


def emit_edited(tx: Tx, before: Goal, after: Goal, caller: Caller | None = None) -> None:
    """Record what an edit changed as a ``goal/edited`` event (nothing when nothing changed)."""
    old, new = before.model_dump(mode="json"), after.model_dump(mode="json")
    fields = ("objective", "title", "budgets", "verify", "progress")
    changes = {f: {"before": old.get(f), "after": new.get(f)} for f in fields if old.get(f) != new.get(f)}
    if changes:
        tx.emit(after.session_id, GOAL_EDITED, {"goalId": after.id, "changes": changes, **(caller or {})})


def pending_key(goal_id: str) -> str:
    """The inbox ``pending_key`` of a goal's continuation."""
    return f"goal:{goal_id}"


def continuation_ref(goal: Goal, round_no: int) -> str:
    """The source ref of ``goal``'s continuation for ``round_no``: ``<goal id>#<round>``, and for a
    round run again after the infrastructure's trouble ``#<round>/retry<n>`` (``n``: the goal's
    ``infra_streak``), so that each continuation admitted has a ref of its own."""
    if goal.infra_streak > 0 and round_no == goal.continuation_round:
        return f"{goal.id}#{round_no}/retry{goal.infra_streak}"
    return f"{goal.id}#{round_no}"


def issue_continuation(tx: Tx, goal: Goal, round_no: int, text: str) -> Goal:
    """Enqueue the goal's continuation for ``round_no`` and record it on the goal (same transaction)."""
    receipt = enqueue(
        tx,
        goal.session_id,
        parse_content(text),
        source=_continuation_source(goal, round_no),
        pending_key=pending_key(goal.id),
        yields_to_followup=True,
    )
    return goal.model_copy(update={"continuation_id": receipt.message_id, "continuation_round": round_no})


def continuation_row(goal: Goal, round_no: int, text: str) -> dict[str, Any]:
    """The inbox row :func:`issue_continuation` queues, as the session's queue holds it (its id a
    stand-in: the commit gives it one)."""
    source = _continuation_source(goal, round_no)
    return queued_row(MessageId.new(), parse_content(text), Delivery.FOLLOWUP, source, True)


def _continuation_source(goal: Goal, round_no: int) -> Source:
    return Source(kind=SourceKind.GOAL, ref=continuation_ref(goal, round_no))


def cancel_continuation(tx: Tx, goal: Goal, reason: str) -> None:
    """Cancel the goal's continuation if it is still queued (through the inbox's fate transition)."""
    cancel_pending(tx, pending_key(goal.id), reason)


def continuation_queued(tx_or_conn: Tx | Conn, goal: Goal) -> bool:
    """Whether the goal's continuation is queued."""
    return is_pending(tx_or_conn, pending_key(goal.id))


def set_status(
    tx: Tx, goal: Goal, status: GoalStatus, reason: str | None, now: datetime, *, reopen: bool = False
) -> Goal:
    """Apply a person's status change (pause/resume/cancel/reopen) through the one transition function."""
    transition(goal.status, status, reopen=reopen)
    return with_status(goal, status, reason, now, reopen=reopen)


# -- retention's marks (what :mod:`goals.retention` records on the goal rows) ------------------------


def mark_history_pruned(tx: Tx, goal_id: str) -> None:
    """Record that the goal's session history was pruned (the goal row itself is kept whole)."""
    tx.execute("UPDATE goals SET history_pruned_at=? WHERE id=? AND history_pruned_at IS NULL", (tx.now, goal_id))


def mark_workdir_removed(tx: Tx, goal_id: str, *, kept: bool = False) -> None:
    """Record that retention is done with the goal's work directory: removed, or ``kept`` (the
    configuration keeps it, or goald did not make it), so it is not considered again."""
    tx.execute(
        "UPDATE goals SET workdir_removed_at=? WHERE id=? AND workdir_removed_at IS NULL",
        ("kept" if kept else tx.now, goal_id),
    )


__all__ = [
    "AMBIGUOUS_SHOWN",
    "ENDED_STATUSES",
    "GOAL_ANSWERED",
    "GOAL_BLOCKED",
    "GOAL_CHANGED",
    "GOAL_CLAIM",
    "GOAL_COUNTED",
    "GOAL_EDITED",
    "GOAL_FINGERPRINT",
    "GOAL_PROGRESS",
    "GOAL_QUESTION",
    "GOAL_VERIFIED",
    "MIGRATIONS",
    "cancel_continuation",
    "conn_of",
    "continuation_queued",
    "continuation_ref",
    "delete_goal_row",
    "emit_changed",
    "emit_counted",
    "emit_edited",
    "goal_by_idempotency_key",
    "goal_by_key",
    "goal_counts",
    "goal_from_row",
    "goal_on_branch",
    "goal_retention",
    "goals_of_session",
    "insert_goal",
    "issue_continuation",
    "latest_goal_of_session",
    "list_goals",
    "live_goal_of_chain",
    "live_goal_of_session",
    "live_goal_sandboxes_with_secrets",
    "live_goal_sessions",
    "live_goals",
    "load_goal",
    "mark_history_pruned",
    "mark_workdir_removed",
    "pending_key",
    "resolve_goal_id",
    "save_goal",
    "schedule_of",
    "session_node_label",
    "sessions_due_for_pruning",
    "set_status",
    "workdirs_due_for_removal",
]
