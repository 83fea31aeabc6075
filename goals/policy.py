"""The goal engine's decision, as a pure function of its inputs.

At each whole-agent idle of a goal's session the engine gathers the facts of the interval since it
last looked (:class:`Interval`, read from the session's events), the work directory's fingerprint,
and the result of any verification it ran, and calls :func:`decide`. Nothing here reads a clock,
a file or the store; every input is an argument, so the rules are tested as a table.

The rules, in order:

1. A goal that is not live changes nothing; a paused goal only counts tokens.
2. Its own continuation still queued: nothing. Cancelled as ``superseded`` (a person's follow-up
   went first): re-issued with the same round number. Cancelled otherwise: paused, with the reason.
3. An unrecoverable fault (the goal's model is no longer known, the work directory vanished): failed.
4. A completion claim: with no verification commands, or with all passing, completed; otherwise
   refused (the output goes into the next continuation), and after K refusals paused ``unverified``.
5. ``goal_blocked`` called in B consecutive rounds: paused ``blocked`` with the model's words.
6. A budget spent (rounds, tokens, cost, wall time, deadline, or the guard refused a call): exhausted.
7. The interval ended on a model error: an authentication error pauses at once; an error of a
   provider outage (its circuit breaker was open or opened in the interval) is not counted: the
   goal waits the base backoff and goes on (its next call waits for the breaker), so one long
   outage leaves no goal paused; otherwise the goal waits (``not_before``, exponential backoff)
   and after M errors in a row pauses ``model_error``.
8. No progress in N rounds: the next continuation warns; in N+1, paused ``stalled``. Progress is a
   changed work-directory fingerprint or a new distinct ``goal_progress`` note; tool calls alone
   are not (a model that runs the same ``list_dir`` every round makes none).
9. Otherwise, one continuation for the next round.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict

from agent import ModelErrorKind
from goals.continuation import render
from goals.model import Goal, GoalStatus, StopReason, VerifyResult, transition

MAX_NOTES = 10
MAX_SEEN_CALLS = 64
MAX_VERIFY_OUTPUT = 4000


class ContinuationFate(enum.StrEnum):
    """What became of the goal's latest continuation within the interval."""

    #: No event of it in the interval (it was accounted for earlier, or there is none).
    NONE = "none"
    QUEUED = "queued"
    ADMITTED = "admitted"
    CANCELLED = "cancelled"


class Claim(BaseModel):
    """A ``goal_complete`` call."""

    model_config = ConfigDict(frozen=True)

    summary: str
    evidence: str


class Interval(BaseModel):
    """Facts of the session's events in ``(evaluated_seq, end_seq]``."""

    model_config = ConfigDict(frozen=True)

    end_seq: int
    continuation_fate: ContinuationFate = ContinuationFate.NONE
    cancel_reason: str | None = None
    tokens: int = 0
    cost: float = 0.0
    claims: list[Claim] = []
    blocked: list[str] = []
    notes: list[str] = []
    tool_calls: list[str] = []
    turns: int = 0
    last_end_reason: str | None = None
    last_error_kind: str | None = None
    last_error: str | None = None
    #: A model error of the interval came while the provider's circuit breaker was open (an outage).
    breaker_open: bool = False


class DecisionKind(enum.StrEnum):
    """What the engine does."""

    NOTHING = "nothing"
    BOOKKEEP = "bookkeep"
    CONTINUE = "continue"
    REISSUE = "reissue"
    WAIT = "wait"
    COMPLETE = "complete"
    PAUSE = "pause"
    EXHAUST = "exhaust"
    FAIL = "fail"


@dataclass(frozen=True)
class PolicyInput:
    """Everything :func:`decide` may look at."""

    goal: Goal
    interval: Interval
    now: datetime
    fingerprint: str | None = None
    workdir_exists: bool = True
    verification: list[VerifyResult] | None = None
    verification_reused: bool = False
    #: An unrecoverable fault found by the engine (e.g. the goal's model is no longer configured).
    fault: str | None = None


@dataclass(frozen=True)
class Decision:
    """The new goal state and, if any, the continuation to enqueue with it."""

    kind: DecisionKind
    goal: Goal
    continuation: str | None = None
    round: int | None = None
    notes: list[str] = field(default_factory=list)


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


def backoff(goal: Goal, errors: int) -> float:
    """Seconds to wait after ``errors`` model errors in a row."""
    r = goal.rules
    return float(min(r.error_backoff_max_seconds, r.error_backoff_seconds * (2 ** max(errors - 1, 0))))


def _with_status(goal: Goal, status: GoalStatus, reason: str | None, now: datetime) -> Goal:
    if status is goal.status:
        return goal.model_copy(update={"status_reason": reason})
    transition(goal.status, status)
    wall = goal.wall_used
    if goal.status is GoalStatus.ACTIVE and goal.active_since is not None:
        wall += max((now - goal.active_since).total_seconds(), 0.0)
    return goal.model_copy(
        update={
            "status": status,
            "status_reason": reason,
            "wall_used": wall,
            "active_since": now if status is GoalStatus.ACTIVE else None,
        }
    )


def _verify_text(results: list[VerifyResult]) -> str:
    parts = []
    for r in results:
        state = "timed out" if r.timed_out else f"exit {r.exit_code}"
        parts.append(f"$ {r.cmd}  ({state})\n{r.output_tail}")
    text = "\n".join(parts)
    return text[-MAX_VERIFY_OUTPUT:]


def decide(inp: PolicyInput) -> Decision:
    """Decide what the goal does at this idle. Pure: see the module docstring."""
    g, iv, now = inp.goal, inp.interval, inp.now
    if not g.status.live:
        return Decision(DecisionKind.NOTHING, g)

    # Bookkeeping that holds whatever is decided.
    wall = g.wall_used
    active_since = g.active_since
    if g.status is GoalStatus.ACTIVE and active_since is not None:
        wall += max((now - active_since).total_seconds(), 0.0)
        active_since = now
    is_round = iv.continuation_fate is ContinuationFate.ADMITTED
    notes = list(g.memory.notes)
    new_notes = []
    for note in iv.notes:
        if note.strip() and note not in notes:
            notes.append(note)
            new_notes.append(note)
    notes = notes[-MAX_NOTES:]
    g = g.model_copy(
        update={
            "tokens": g.tokens + iv.tokens,
            "cost": g.cost + iv.cost,
            "evaluated_seq": max(g.evaluated_seq, iv.end_seq),
            "wall_used": wall,
            "active_since": active_since,
            "rounds": g.rounds + (1 if is_round else 0),
            "memory": g.memory.model_copy(update={"notes": notes}),
        }
    )
    if g.status is GoalStatus.PAUSED:
        return Decision(DecisionKind.BOOKKEEP, g)

    def pause(reason: str, **memory: object) -> Decision:
        mem = g.memory.model_copy(update=memory) if memory else g.memory
        return Decision(DecisionKind.PAUSE, _with_status(g.model_copy(update={"memory": mem}), GoalStatus.PAUSED,
                                                         reason, now))

    # 2. The continuation's fate.
    if iv.continuation_fate is ContinuationFate.QUEUED:
        return Decision(DecisionKind.BOOKKEEP, g)
    if iv.continuation_fate is ContinuationFate.CANCELLED:
        if iv.cancel_reason == "superseded":
            round_no = g.continuation_round or (g.rounds + 1)
            return Decision(DecisionKind.REISSUE, g, render(g, round_no, now,
                            stall_warning=g.memory.warned_stall), round_no)
        return pause(f"continuation cancelled: {iv.cancel_reason or 'no reason given'}")

    # 3. Unrecoverable faults: the model is gone, the work directory vanished.
    if inp.fault is not None:
        return Decision(DecisionKind.FAIL, _with_status(g, GoalStatus.FAILED, inp.fault, now))
    if not inp.workdir_exists:
        return Decision(DecisionKind.FAIL, _with_status(g, GoalStatus.FAILED, StopReason.WORKDIR_MISSING, now))

    # 4. Completion claims.
    if iv.claims:
        claim = iv.claims[-1]
        results = inp.verification or []
        unverifiable = bool(g.verify) and inp.verification is None
        if not unverifiable and all(r.passed for r in results):
            done = g.model_copy(
                update={
                    "result_summary": claim.summary,
                    "evidence": claim.evidence,
                    "memory": g.memory.model_copy(update={"verify_results": results, "verify_output": None}),
                }
            )
            return Decision(DecisionKind.COMPLETE, _with_status(done, GoalStatus.COMPLETED, StopReason.VERIFIED, now))
        output = _verify_text(results)
        if unverifiable:
            output = "the verification commands could not run: the goal has no work directory"
        if inp.verification_reused:
            output = "(the work directory has not changed since the last failed check)\n" + output
        g = g.model_copy(
            update={
                "refused_claims": g.refused_claims + 1,
                "memory": g.memory.model_copy(
                    update={"verify_results": results, "verify_output": output, "verify_fingerprint": inp.fingerprint}
                ),
            }
        )
        if g.refused_claims >= g.rules.max_refused_claims:
            return pause(StopReason.UNVERIFIED)

    # 5. Blocked.
    if is_round:
        streak = g.blocked_streak + 1 if iv.blocked else 0
        g = g.model_copy(update={"blocked_streak": streak})
        if streak >= g.rules.blocked_rounds:
            return pause(f"{StopReason.BLOCKED}: {iv.blocked[-1]}")

    # 6. Budgets.
    spent = budget_spent(g, now)
    if spent is None and iv.last_end_reason == "budget":
        # The guard folds the wall-time limit into its deadline, so its refusal text alone cannot
        # tell a spent wall time from a passed deadline: the goal's own budgets say which it is.
        spent = refusal_reason(iv.last_error)
    if spent is not None:
        return Decision(DecisionKind.EXHAUST, _with_status(g, GoalStatus.EXHAUSTED, spent, now))

    # 7. Model errors.
    if iv.last_end_reason == "error":
        text = iv.last_error or "model error"
        if iv.last_error_kind == ModelErrorKind.AUTH:
            return pause(StopReason.AUTH_ERROR, last_error=text)
        if iv.breaker_open:
            # The provider is down for every goal alike; counting would pause them all overnight.
            g = g.model_copy(update={"memory": g.memory.model_copy(update={"last_error": text})})
            wait_until = now + timedelta(seconds=backoff(g, 1))
            return Decision(DecisionKind.WAIT, g.model_copy(update={"not_before": wait_until}))
        errors = g.error_streak + 1
        g = g.model_copy(update={"error_streak": errors, "memory": g.memory.model_copy(update={"last_error": text})})
        if errors >= g.rules.max_model_errors:
            return pause(f"{StopReason.MODEL_ERROR}: {text}")
        wait = g.model_copy(update={"not_before": now + timedelta(seconds=backoff(g, errors))})
        return Decision(DecisionKind.WAIT, wait)
    if iv.turns:
        g = g.model_copy(update={"error_streak": 0})

    # 8. Stalls (rounds only).
    warn = g.memory.warned_stall
    if is_round:
        seen = list(g.memory.seen_calls)
        novel = [c for c in iv.tool_calls if c not in seen]
        changed = inp.fingerprint is not None and inp.fingerprint != g.memory.fingerprint
        # Tool calls are recorded (what the agent tried) but never count as progress by themselves:
        # a call repeated with the same arguments and result would otherwise defeat the rule.
        progress = changed or bool(new_notes)
        streak = 0 if progress else g.stall_streak + 1
        for c in novel:
            if c not in seen:
                seen.append(c)
        memory = g.memory.model_copy(update={"seen_calls": seen[-MAX_SEEN_CALLS:], "fingerprint": inp.fingerprint})
        g = g.model_copy(update={"stall_streak": streak, "memory": memory})
        if streak >= g.rules.stall_rounds + 1:
            return pause(StopReason.STALLED)
        warn = streak >= g.rules.stall_rounds
        g = g.model_copy(update={"memory": g.memory.model_copy(update={"warned_stall": warn})})

    # A pending backoff holds the next round back.
    if g.not_before is not None and now < g.not_before:
        return Decision(DecisionKind.WAIT, g)

    # 9. The next round.
    round_no = g.rounds + 1
    g = g.model_copy(update={"not_before": None})
    return Decision(DecisionKind.CONTINUE, g, render(g, round_no, now, stall_warning=warn), round_no)
