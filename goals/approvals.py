"""Approvals: a call the tool policy asks about becomes a question to the goal's operator.

A goal's policy may say ``ask`` for a tool or a shell pattern (:mod:`agent.tools.policy`). Such a
call reaches :func:`approve_for_goal`, the goal sessions' approver: a call the operator approved for
this goal runs; one approved once runs and uses the approval up; any other becomes an approval
question (a ``goal/question`` event of kind ``approval``, decided at the turn's idle like
``ask_operator``: :mod:`goals.questions`) with the exact command line, the options "approve once",
"approve for this goal" and "deny", and the call is not run. The answer comes back as the goal's
next message; an approval is what the call was for (:attr:`agent.tools.policy.Ask.key`), so the
same call made again runs. A line that is not one simple command is shown whole and said to be
compound, with why. ``goal show`` lists the goal's standing approvals; ``goald goal revoke`` removes one.
"""

from __future__ import annotations

from agent import Tx
from agent.tools.base import ToolContext, ToolOutput
from agent.tools.policy import Ask
from goals.errors import InvalidGoal
from goals.model import Goal, GoalStatus, QuestionId
from goals.payloads import Caller
from goals.store import GOAL_EDITED, GOAL_QUESTION, live_goal_of_session, load_goal, resolve_goal_id, save_goal

APPROVE_ONCE = "approve once"
APPROVE_GOAL = "approve for this goal"
DENY = "deny"
OPTIONS = [APPROVE_ONCE, APPROVE_GOAL, DENY]
#: How much of a command line an approval question quotes (the rest is said to be cut).
QUOTED = 2000


def question_text(ask: Ask) -> str:
    """The approval question: the exact call, and whether the line is one simple command."""
    if ask.command is not None:
        line = ask.command if len(ask.command) <= QUOTED else ask.command[:QUOTED] + f"… ({len(ask.command)} chars)"
        text = f"Approve this shell command?\n{line}"
        if ask.compound is not None:
            text += f"\nIt is not one simple command ({ask.compound}): approving approves the whole line."
        return text
    return f"Approve this call of {ask.tool}?\n{ask.args[:QUOTED]}"


async def approve_for_goal(ask: Ask, ctx: ToolContext) -> ToolOutput | None:
    """The goal sessions' approver (see the module docstring): ``None`` runs the call."""
    if ctx.store is None:
        return ToolOutput(f"denied by policy: {ask.reason}; nobody can be asked here", True)
    qid = QuestionId.new()

    def run(tx: Tx) -> ToolOutput | None:
        goal = live_goal_of_session(tx, ctx.session_id)
        if goal is None or goal.status is not GoalStatus.ACTIVE:
            return ToolOutput(f"denied by policy: {ask.reason}; the goal is not active, so nobody is asked", True)
        if ask.key in goal.memory.approvals:
            return None
        if ask.key in goal.memory.approved_once:
            rest = list(goal.memory.approved_once)
            rest.remove(ask.key)
            memory = goal.memory.model_copy(update={"approved_once": rest})
            save_goal(tx, goal.model_copy(update={"memory": memory}), goal.revision)
            return None
        tx.emit(
            ctx.session_id,
            GOAL_QUESTION,
            {
                "goalId": goal.id,
                "turnId": ctx.turn_id,
                "questionId": str(qid),
                "text": question_text(ask),
                "options": OPTIONS,
                "default": None,
                "timeoutSeconds": None,
                "kind": "approval",
                "subject": ask.key,
            },
        )
        return ToolOutput(
            f"not run: {ask.reason}. The operator is asked to approve it (question {qid}) when this turn ends. "
            "Finish your turn now; the answer will come as a message.",
            True,
        )

    return await ctx.transact(run)


def granted(goal: Goal, subject: str | None, answer: str | None) -> Goal:
    """``goal`` with the approval an answer gives (``approve once`` or ``for this goal``); unchanged by ``deny``."""
    if subject is None or answer not in (APPROVE_ONCE, APPROVE_GOAL):
        return goal
    mem = goal.memory
    if answer == APPROVE_GOAL:
        update = {"approvals": [*mem.approvals, subject] if subject not in mem.approvals else mem.approvals}
    else:
        update = {"approved_once": [*mem.approved_once, subject]}
    return goal.model_copy(update={"memory": mem.model_copy(update=update)})


def approval_message(subject: str | None, answer: str | None, by: str) -> str:
    """What the goal's agent hears of an approval's answer."""
    what = subject or "the call"
    if answer == APPROVE_ONCE:
        return f"The operator ({by}) approved once: {what}. Make the same call again to run it (once)."
    if answer == APPROVE_GOAL:
        return f"The operator ({by}) approved for this goal: {what}. The same call runs from now on without asking."
    return (
        f"The operator ({by}) denied: {what}. Do not make this call; find another way or report that you are blocked."
    )


def revoke_approval(tx: Tx, goal_ref: str, subject: str | None, caller: Caller | None = None) -> Goal:
    """Remove one standing approval of the goal (``subject``; ``None``: all of them); returns the goal.

    Raises:
        InvalidGoal: the goal has no such approval.
    """
    goal = load_goal(tx, resolve_goal_id(tx.conn, goal_ref))
    before = list(goal.memory.approvals)
    if subject is None:
        after: list[str] = []
    elif subject in before:
        after = [s for s in before if s != subject]
    else:
        listed = "; ".join(before) or "none"
        raise InvalidGoal(f"goal {goal.key or goal.id} has no approval {subject!r} (it has: {listed})")
    saved = save_goal(
        tx, goal.model_copy(update={"memory": goal.memory.model_copy(update={"approvals": after})}), goal.revision
    )
    tx.emit(
        goal.session_id,
        GOAL_EDITED,
        {"goalId": goal.id, "changes": {"approvals": {"before": before, "after": after}}, **(caller or {})},
    )
    return saved


__all__ = [
    "APPROVE_GOAL",
    "APPROVE_ONCE",
    "DENY",
    "OPTIONS",
    "approval_message",
    "approve_for_goal",
    "granted",
    "question_text",
    "revoke_approval",
]
