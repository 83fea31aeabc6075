"""A decision's commit: the goal row, the verification's record and any continuation, in one write.

The engine decides outside the store (its verification commands run between its read and its
decision) and commits the decision only if the session is still at the idle it was taken at
(:func:`commit`). A decision that queues a continuation for a session whose driver is here and
waiting is handed to that driver instead (:meth:`agent.driver.Agent.open_after`): it commits first
in the write that opens the turn admitting the continuation and reserves its first call — the
decision, the continuation, the opening and the reservation in one round trip (``docs/
architecture.md``, "Where a round's round trips go now"). Its checks are the same, made in that
write; a decision that is stale there rolls it back whole (:class:`~goals.errors.StaleDecision`
comes back to the engine as from its own commit), and one the driver could not open a turn for is
committed here, as any other.
"""

from __future__ import annotations

from datetime import datetime
from functools import partial
from typing import Any

from agent import AgentStatus, Runtime, StaleOpening, Tx
from goals.decision import Decision, DecisionKind
from goals.errors import StaleDecision
from goals.fingerprint_limits import WalkStats
from goals.measure import Measured
from goals.model import Goal
from goals.questions import insert_question
from goals.store import (
    GOAL_FINGERPRINT,
    GOAL_VERIFIED,
    continuation_row,
    emit_changed,
    emit_counted,
    issue_continuation,
    save_goal,
)


async def commit_decision(rt: Runtime, goal: Goal, status_seq: int, decision: Decision, measured: Measured) -> Goal:
    """Commit ``decision`` for ``goal`` at the idle numbered ``status_seq``: with the opening of the
    turn its continuation starts, when that session's driver can take it, else on its own.

    Raises:
        StaleDecision: the session has moved on since; nothing is written.
    """
    write = partial(fenced_commit, goal=goal, status_seq=status_seq, decision=decision, measured=measured)
    new = decision.goal
    if decision.continuation is not None and decision.round is not None and decision.question is None:
        agent = rt.live_agents.get(goal.session_id)
        # The guard the driver reserves with is the goal's as it was: only a decision that changes
        # neither the goal's status nor its budgets (no guard to bring in line after it) is handed.
        if agent is not None and new.status is goal.status and new.budgets == goal.budgets:
            row = continuation_row(new, decision.round, decision.continuation)
            handed = agent.open_after(write, [row])
            if handed is not None:
                try:
                    saved: Goal = await handed
                    return saved
                except StaleOpening:
                    pass  # no turn was opened with it: nothing was written; committed here
    result: Goal = await rt.store.transact(write, session=goal.session_id)
    return result


def fenced_commit(tx: Tx, goal: Goal, status_seq: int, decision: Decision, measured: Measured) -> Goal:
    """:func:`commit`, by the node that holds the session's lease only (a decision drives the session:
    :meth:`agent.tx.Tx.fence`)."""
    tx.fence(goal.session_id)
    return commit(tx, goal, status_seq, decision, measured)


def commit(tx: Tx, goal: Goal, status_seq: int, decision: Decision, measured: Measured) -> Goal:
    """Write ``decision`` for ``goal`` (with the verification's record and any continuation) if its
    session is still at the idle it was taken at (``status_seq``).

    Raises:
        StaleDecision: the session has moved on since; nothing is written.
    """
    cur = tx.state(goal.session_id)
    if cur.status is not AgentStatus.IDLE or cur.status_seq != status_seq or cur.open_turn is not None:
        raise StaleDecision("the session is no longer at that idle")
    new = decision.goal
    verification = measured.verification
    if verification is not None:
        tx.emit(
            goal.session_id,
            GOAL_VERIFIED,
            {
                "goalId": goal.id,
                "passed": all(r.passed for r in verification),
                "reused": measured.verification_reused,
                "results": [r.model_dump(mode="json") for r in verification],
            },
        )
    if measured.walk is not None and measured.walk.bounded:
        tx.emit(goal.session_id, GOAL_FINGERPRINT, walk_data(goal, measured.walk))
    if decision.continuation is not None and decision.round is not None:
        new = issue_continuation(tx, new, decision.round, decision.continuation)
    if decision.question is not None:
        insert_question(tx, new, decision.question, datetime.fromisoformat(tx.now))
    saved = save_goal(tx, new, goal.revision)
    emit_changed(tx, goal.status, saved)
    if decision.kind is DecisionKind.BOOKKEEP:
        emit_counted(tx, goal, saved)
    return saved


def walk_data(goal: Goal, walk: WalkStats) -> dict[str, Any]:
    """A ``goal/fingerprint`` event's data: the bounds the work directory's walk met, in words and figures."""
    return {
        "goalId": goal.id,
        "text": walk.summary(),
        "filesByTime": walk.files_by_time,
        "files": walk.files,
        "bytesRead": walk.bytes_read,
        "contentBytes": walk.content_bytes,
        "fileBytes": walk.file_bytes,
        "diskBytes": walk.disk_bytes,
        "cut": walk.cut,
        "truncated": walk.truncated,
        "seconds": round(walk.seconds, 3),
    }
