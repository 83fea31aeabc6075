"""The tools a goal's agent gets: ``goal_progress``, ``goal_complete``, ``goal_blocked``, ``ask_operator``.

Each records a durable event in the goal's session; the engine reads those events at the next
whole-agent idle. None of them changes the goal's status by itself: a completion claim is only a
claim until the verification commands pass, and a question (``ask_operator``) is asked when the
engine decides the turn's idle (its row and the goal's ``waiting`` status commit together there).
Each records through the running driver (:meth:`agent.tools.base.ToolContext.transact`: after the
answer that made the call, fenced by the session's lease), and the first three on the goal as this
process last wrote it, checked in the same write (:mod:`goals.known`).

The tool policy of a goal's session lives here too (:func:`goal_policy`, :func:`policy_for_session`):
whatever a goal's allowlist or the daemon's default says, the goal tools stay allowed, since
without them the agent could never report progress or claim completion.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, model_validator

from agent import Tool, ToolContext, ToolOutput, ToolPolicy, Tx
from agent.tools.base import Approver
from goals.approvals import approve_for_goal
from goals.errors import InvalidGoal, StaleDecision
from goals.known import forget, known_goal, remember, still_at
from goals.model import GoalStatus, QuestionId
from goals.store import GOAL_BLOCKED, GOAL_CLAIM, GOAL_PROGRESS, GOAL_QUESTION, live_goal_of_session


class ProgressArgs(BaseModel):
    """Arguments of ``goal_progress``."""

    note: str = Field(min_length=1, max_length=2000, description="What changed since the last note")


class CompleteArgs(BaseModel):
    """Arguments of ``goal_complete``."""

    summary: str = Field(min_length=1, max_length=4000, description="What was done")
    evidence: str = Field(min_length=1, max_length=8000, description="How you checked that the objective is met")


class BlockedArgs(BaseModel):
    """Arguments of ``goal_blocked``."""

    reason: str = Field(min_length=1, max_length=2000, description="Why you cannot proceed")


class AskArgs(BaseModel):
    """Arguments of ``ask_operator``."""

    question: str = Field(
        min_length=1, max_length=4000, description="The question, whole: the operator reads only this"
    )
    options: list[str] = Field(
        default=[], max_length=10, description="Answers to choose from, if the question has a fixed set (at most 10)"
    )
    default: str | None = Field(
        default=None,
        max_length=2000,
        description="The answer used if nobody answers by the deadline (one of the options, if any)",
    )
    timeout_seconds: float | None = Field(
        default=None, ge=60, le=30 * 86_400, description="How long to wait for an answer (default: a day)"
    )

    @model_validator(mode="after")
    def _shape(self) -> AskArgs:
        for option in self.options:
            if not option.strip() or len(option) > 200:
                raise ValueError("each option must be 1 to 200 characters of text")
        if self.options and self.default is not None and self.default not in self.options:
            raise ValueError("default must be one of the options")
        return self


class _GoalTool:
    #: Bound to the goal's own session: a subagent is never given these (see agent.subagents).
    subagent_inherits = False

    async def _record(
        self, ctx: ToolContext, event_type: str, data: dict[str, str]
    ) -> tuple[str, int, int, bool] | None:
        """Emit the call's event for the session's live goal: ``(goal id, blocked streak, blocked
        rounds, paused)``; ``None`` when the session has no live goal. On the goal as this process
        last wrote it, checked in the same write (:mod:`goals.known`), else read."""
        if ctx.store is None:
            return None
        store = ctx.store
        known = known_goal(store, ctx.session_id)

        def run(tx: Tx) -> tuple[str, int, int, bool] | None:
            if known is not None:
                still_at(tx, known, StaleDecision)
            goal = known or live_goal_of_session(tx, ctx.session_id)
            if goal is None:
                return None
            if known is None:
                remember(tx, goal)  # the next record goes without the read
            tx.emit(ctx.session_id, event_type, {"goalId": goal.id, "turnId": ctx.turn_id, **data})
            return goal.id, goal.blocked_streak, goal.rules.blocked_rounds, goal.status is GoalStatus.PAUSED

        # The session's goal row and events only: the session's own lock (agent.store.Store.transact);
        # after the answer that made the call, if the driver deferred it (ToolContext.transact).
        try:
            return await ctx.transact(run)
        except StaleDecision:  # changed elsewhere since: nothing was written; read it this time
            forget(store, ctx.session_id)
            known = None
            return await ctx.transact(run)


class GoalProgress(_GoalTool, Tool[ProgressArgs]):
    """Note progress."""

    name = "goal_progress"
    description = "Record a short note of the progress made toward the goal."
    Args = ProgressArgs
    repeat_safe = True
    effects_in_store = True  # its record, through ToolContext.transact

    async def run(self, args: ProgressArgs, ctx: ToolContext) -> ToolOutput:
        found = await self._record(ctx, GOAL_PROGRESS, {"note": args.note})
        if found is None:
            return ToolOutput("this session has no active goal", True)
        return ToolOutput("progress noted")


class GoalComplete(_GoalTool, Tool[CompleteArgs]):
    """Claim completion."""

    name = "goal_complete"
    description = (
        "Claim that the goal's objective is met, with a summary and the evidence. The goal's verification "
        "commands run when this turn ends; the claim is refused if one fails."
    )
    Args = CompleteArgs
    repeat_safe = True
    effects_in_store = True  # its record, through ToolContext.transact

    async def run(self, args: CompleteArgs, ctx: ToolContext) -> ToolOutput:
        found = await self._record(ctx, GOAL_CLAIM, {"summary": args.summary, "evidence": args.evidence})
        if found is None:
            return ToolOutput("this session has no active goal", True)
        if found[3]:
            return ToolOutput(
                "claim recorded; the goal is paused, so it will be verified when the goal is resumed. "
                "Finish your turn now."
            )
        return ToolOutput("claim recorded; it will be verified when this turn ends. Finish your turn now.")


class GoalBlocked(_GoalTool, Tool[BlockedArgs]):
    """Report being blocked."""

    name = "goal_blocked"
    description = "Report that you cannot make progress, and why. Repeated in consecutive rounds, it pauses the goal."
    Args = BlockedArgs
    repeat_safe = True
    effects_in_store = True  # its record, through ToolContext.transact

    async def run(self, args: BlockedArgs, ctx: ToolContext) -> ToolOutput:
        found = await self._record(ctx, GOAL_BLOCKED, {"reason": args.reason})
        if found is None:
            return ToolOutput("this session has no active goal", True)
        _, streak, rounds, _ = found
        k = min(streak + 1, rounds)
        if k >= rounds:
            return ToolOutput(f"noted ({k}/{rounds}); the goal will be paused as blocked when this turn ends")
        return ToolOutput(f"noted ({k}/{rounds}); keep trying")


class AskOperator(Tool[AskArgs]):
    """Ask the goal's operator a question and wait for the answer."""

    name = "ask_operator"
    description = (
        "Ask the goal's operator a question you cannot decide alone (a choice with consequences, missing "
        "information). Your turn ends; the goal waits, and the answer comes as a message, possibly hours "
        "later. Give options when the answers are a fixed set, and a default used if nobody answers in time."
    )
    Args = AskArgs
    repeat_safe = True
    effects_in_store = True  # its record, through ToolContext.transact
    subagent_inherits = False

    async def run(self, args: AskArgs, ctx: ToolContext) -> ToolOutput:
        qid = QuestionId.new()

        def run(tx: Tx) -> str | None:
            goal = live_goal_of_session(tx, ctx.session_id)
            if goal is None:
                return "this session has no active goal"
            if goal.status is GoalStatus.WAITING:
                q = goal.memory.question
                return f"question {q.id if q else ''} is still open: wait for its answer (end your turn)"
            if goal.status is not GoalStatus.ACTIVE:
                return f"the goal is {goal.status.value}: no question can be asked now; end your turn"
            data = {"goalId": goal.id, "turnId": ctx.turn_id, "questionId": str(qid), "text": args.question}
            tx.emit(
                ctx.session_id,
                GOAL_QUESTION,
                {**data, "options": args.options, "default": args.default, "timeoutSeconds": args.timeout_seconds},
            )
            return None

        if ctx.store is None:
            return ToolOutput("this session has no active goal", True)
        refused = await ctx.transact(run)
        if refused is not None:
            return ToolOutput(refused, True)
        return ToolOutput(
            f"question {qid} recorded: the operator is asked when this turn ends. Finish your turn now; "
            "the answer will come as a message."
        )


GOAL_TOOL_NAMES = ("goal_progress", "goal_complete", "goal_blocked", "ask_operator")


def goal_tools() -> list[Tool[ProgressArgs] | Tool[CompleteArgs] | Tool[BlockedArgs] | Tool[AskArgs]]:
    """The goal tools (they find their goal through the session at call time)."""
    return [GoalProgress(), GoalComplete(), GoalBlocked(), AskOperator()]


def approver_for_session(row_config: dict[str, Any]) -> Approver | None:
    """The approver of a session's calls its policy asks about: a goal's session asks its operator
    (:func:`goals.approvals.approve_for_goal`); any other has nobody to ask (such calls are denied)."""
    return approve_for_goal if row_config.get("goal") else None


def tools_for_goal_sessions(row_config: dict[str, Any]) -> list[Any]:
    """The goal tools for a session whose config marks it as a goal's."""
    return list(goal_tools()) if row_config.get("goal") else []


def goal_policy(entries: list[str] | None) -> ToolPolicy | None:
    """The tool policy of a goal's allowlist (``None``: the default applies); goal tools are always allowed.

    Raises:
        InvalidGoal: a malformed entry.
    """
    if entries is None:
        return None
    try:
        return ToolPolicy.from_entries(entries).allowing(*GOAL_TOOL_NAMES)
    except ValueError as exc:
        raise InvalidGoal(f"tools: {exc}") from None


def policy_for_session(row_config: dict[str, Any], default: ToolPolicy | None = None) -> ToolPolicy | None:
    """The tool policy of a session: its own (a goal's allowlist), else ``default``.

    A goal's session may always use the goal tools, whatever the default says: without them it
    could never report progress or claim completion.
    """
    stored = row_config.get("policy")
    policy = ToolPolicy.model_validate(stored) if stored is not None else default
    if policy is not None and row_config.get("goal"):
        policy = policy.allowing(*GOAL_TOOL_NAMES)
    return policy
