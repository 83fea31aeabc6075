"""Reading one interval of a goal's session into the policy's facts.

The engine decides at whole-agent idle from the session's events in ``(evaluated_seq, end_seq]``;
:func:`interval_facts` folds those events into an :class:`~goals.policy.Interval`, the only view of
the session the pure policy gets. It is a pure function of the goal and the events, so the engine
(at an idle) and a resume (counting the round a pause interrupted) read an interval the same way.

What it reads, and why:

* The goal's own continuation by ``MessageId`` only (queued, admitted, cancelled): never the
  outcome of the turn that took it, which a later follow-up may have joined.
* Spend: every charged model call (answers, failures, charges without an answer, the context's
  compaction summaries), so the budget counts what the provider billed.
* Tool calls, as a digest of name, arguments and result, leaving out the goal tools: the policy's
  stall rule compares them round to round (the same call with the same result is no progress).
* The last turn's end (reason, error kind, error) and whether the provider's breaker was open.
* Model answers committed (an interrupted partial answer is not one), and the tokens charged in
  full for calls a crash or a stop left without an outcome: the infrastructure's share, shown apart.
* The goal tools' reports: claims, progress notes, blocked reports and questions of this goal.
"""

from __future__ import annotations

import hashlib
import json

from agent import (
    AssistantMessage,
    ContextCompacted,
    Event,
    MessageAdmitted,
    MessageCancelled,
    MessageQueued,
    ModelCharged,
    ModelFailed,
    Payload,
    ToolResult,
    ToolUseBlock,
    TurnEnded,
)
from goals.decision import AskedQuestion, Claim, ContinuationFate, Interval
from goals.model import Goal
from goals.payloads import GoalBlockedReported, GoalClaimed, GoalProgressNoted, GoalQuestionAsked
from goals.tools import GOAL_TOOL_NAMES


def interval_facts(goal: Goal, events: list[Event], end_seq: int) -> Interval:
    """Gather the policy's facts from the session's events of one interval."""
    fate = ContinuationFate.NONE
    cancel_reason = None
    tokens, cost, turns = 0, 0.0, 0
    claims: list[Claim] = []
    blocked: list[str] = []
    questions: list[AskedQuestion] = []
    notes: list[str] = []
    calls: list[str] = []
    uses: dict[str, tuple[str, str]] = {}
    last_reason = last_kind = last_error = None
    breaker_open = False
    answers = interrupted_tokens = 0
    cid = goal.continuation_id
    for ev in events:
        spent_tokens, spent_cost = charged(ev.payload)
        tokens, cost = tokens + spent_tokens, cost + spent_cost
        match ev.payload:
            case MessageQueued() as queued if queued.message_id == cid:
                fate = ContinuationFate.QUEUED
            case MessageAdmitted() as admitted if admitted.message_id == cid:
                fate = ContinuationFate.ADMITTED
            case MessageCancelled() as gone if gone.message_id == cid:
                fate, cancel_reason = ContinuationFate.CANCELLED, gone.reason
            case AssistantMessage() as answer:
                answers += 0 if answer.interrupted else 1
                for block in answer.content:
                    if isinstance(block, ToolUseBlock) and block.name not in GOAL_TOOL_NAMES:
                        uses[block.id] = (block.name, json.dumps(block.input, sort_keys=True))
            case ToolResult() as result if result.tool_use_id in uses:
                calls.append(_call_digest(*uses.pop(result.tool_use_id), result.content))
            case ModelFailed() as failed:
                breaker_open = breaker_open or failed.breaker_open
            case ModelCharged() as charge if charge.subagent_session_id is None:
                interrupted_tokens += charge.tokens
            case TurnEnded() as ended:
                turns += 1
                last_reason, last_kind, last_error = ended.reason.value, ended.error_kind, ended.error
            case GoalClaimed() as claim if claim.goal_id == goal.id:
                claims.append(Claim(summary=claim.summary, evidence=claim.evidence))
            case GoalProgressNoted() as progress if progress.goal_id == goal.id:
                notes.append(progress.note)
            case GoalBlockedReported() as report if report.goal_id == goal.id:
                blocked.append(report.reason)
            case GoalQuestionAsked() as asked if asked.goal_id == goal.id:
                questions.append(
                    AskedQuestion(
                        id=asked.question_id,
                        text=asked.text,
                        options=asked.options,
                        default=asked.default,
                        timeout_seconds=asked.timeout_seconds,
                        kind=asked.kind,
                        subject=asked.subject,
                    )
                )
            case _:
                pass
    return Interval(
        end_seq=end_seq,
        continuation_fate=fate,
        cancel_reason=cancel_reason,
        tokens=tokens,
        cost=cost,
        claims=claims,
        blocked=blocked,
        questions=questions,
        notes=notes,
        tool_calls=calls,
        turns=turns,
        last_end_reason=last_reason,
        last_error_kind=last_kind,
        last_error=last_error,
        breaker_open=breaker_open,
        answers=answers,
        interrupted_tokens=interrupted_tokens,
    )


def charged(payload: Payload) -> tuple[int, float]:
    """The tokens and cost one event charges (``(0, 0.0)`` for an event that charges nothing)."""
    match payload:
        case AssistantMessage() | ModelFailed() as call:
            return (call.usage.total if call.usage is not None else 0), call.cost
        case ModelCharged() as charge:
            return charge.tokens, charge.cost
        case ContextCompacted() as compacted:
            # A summary call of the context's compaction is charged like any other call.
            return (compacted.usage.total if compacted.usage is not None else 0), compacted.cost
        case _:
            return 0, 0.0


def _call_digest(name: str, args: str, result: str) -> str:
    """A tool call and its result, as a short digest the stall rule compares."""
    return hashlib.sha256(f"{name}\0{args}\0{result}".encode()).hexdigest()[:12]


__all__ = ["charged", "interval_facts"]
