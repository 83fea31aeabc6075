"""Folding an interval's facts into the goal, before :func:`goals.policy.decide` picks an outcome.

An active goal's completion claim, verified or refused (:func:`fold_claim`: first, since a claim that
completes the goal makes its interval a round whatever cut it); what holds whatever is decided
(:func:`bookkeep`: spend, the cursor, wall time, rounds, notes); then every other fact of an active
goal's interval (:func:`fold_interval`: the blocked, error and stall streaks), returned as
:class:`Facts` for the outcome rules.
Pure, like the policy: every input is an argument. Why the facts are folded before the precedence
is read is the policy's docstring.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent import ModelErrorKind
from goals.decision import Claim, ContinuationFate, Interval, PolicyInput
from goals.model import Goal, GoalStatus, VerifyResult

#: The error kind of a turn whose request cannot be made to fit the model's window (agent.step): the
#: goal pauses with the error as its reason, ``context_too_small: ...`` with the figures.
CONTEXT_TOO_SMALL = "context_too_small"

MAX_NOTES = 10
MAX_SEEN_CALLS = 64
MAX_VERIFY_OUTPUT = 4000


def _verify_text(results: list[VerifyResult]) -> str:
    parts = []
    for r in results:
        state = "timed out" if r.timed_out else f"exit {r.exit_code}"
        if r.out_of_time:
            state = "stopped: the goal's time ran out" if r.timed_out else "not run: the goal's time ran out"
        parts.append(f"$ {r.cmd}  ({state})\n{r.output_tail}")
    text = "\n".join(parts)
    return text[-MAX_VERIFY_OUTPUT:]


def fold_claim(g: Goal, inp: PolicyInput) -> tuple[Goal, bool]:
    """Fold the interval's completion claim (if any) into the goal: ``(goal, verified)``."""
    iv = inp.interval
    pending = g.memory.pending_claim
    if iv.claims:
        claim = iv.claims[-1]
    elif pending is not None:
        claim = Claim(summary=pending.summary, evidence=pending.evidence)
    else:
        return g, False
    if pending is not None:  # decided now, with the interval's own claim or as itself
        g = g.model_copy(update={"memory": g.memory.model_copy(update={"pending_claim": None})})
    results = inp.verification or []
    missing = not inp.workdir_exists
    unverifiable = missing or (bool(g.verify) and inp.verification is None)
    if not unverifiable and all(r.passed for r in results):
        done = g.model_copy(
            update={
                "result_summary": claim.summary,
                "evidence": claim.evidence,
                "memory": g.memory.model_copy(update={"verify_results": results, "verify_output": None}),
            }
        )
        return done, True
    output = _verify_text(results)
    if missing:
        output = "the claim could not be verified: the work directory is gone"
    elif unverifiable:
        output = "the verification commands could not run: the goal has no work directory"
    if inp.verification_reused:
        output = "(the work directory has not changed since the last failed check)\n" + output
    # A check the goal's time cut short judged nothing: the claim is refused (the spent budget
    # ends the goal), but not counted, and its result is never reused for unchanged content.
    out_of_time = any(r.out_of_time for r in results)
    refused = g.model_copy(
        update={
            "refused_claims": g.refused_claims + (0 if out_of_time else 1),
            "memory": g.memory.model_copy(
                update={
                    "verify_results": results,
                    "verify_output": output,
                    "verify_fingerprint": None if out_of_time else inp.fingerprint,
                }
            ),
        }
    )
    return refused, False


def infrastructure(iv: Interval, completes: bool = False) -> bool:
    """Whether the interval ended on the infrastructure's trouble, not the model's (rule 8): its last
    turn was interrupted, or failed before any model answer with an error the provider's breaker
    counts (or while it was open). An authentication error or a window too small is never one, nor
    an interval whose claim ``completes`` the goal (rule 2): cut after its claim, it is not run
    again, so it is what it was (a round, if it was one)."""
    if completes:
        return False
    if iv.last_end_reason == "interrupted":
        return True
    if iv.last_end_reason != "error" or iv.answers:
        return False
    kind = iv.last_error_kind
    if kind in (ModelErrorKind.AUTH, CONTEXT_TOO_SMALL):
        return False
    return iv.breaker_open or _retryable(kind)


def _retryable(kind: str | None) -> bool:
    """Whether ``kind`` is a failure the provider's breaker counts (the provider's, not the request's)."""
    try:
        return kind is not None and ModelErrorKind(kind).retryable
    except ValueError:  # "internal", "empty", a kind of the turn itself
        return False


def bookkeep(g: Goal, inp: PolicyInput, completes: bool = False) -> tuple[Goal, list[str]]:
    """What holds whatever is decided: spend, the cursor, wall time, rounds (an interval of the
    infrastructure's trouble is not one: rule 8; ``completes``: its claim completes the goal, see
    :func:`infrastructure`) and notes; returns the goal and the interval's new notes."""
    iv, now = inp.interval, inp.now
    admitted = iv.continuation_fate is ContinuationFate.ADMITTED
    infra = infrastructure(iv, completes)
    wall = g.wall_used
    active_since = g.active_since
    if g.status is GoalStatus.ACTIVE and active_since is not None:
        wall += max((now - active_since).total_seconds(), 0.0)
        active_since = now
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
            "rounds": g.rounds + (1 if admitted and not infra and not _refused_unstarted(iv) else 0),
            "infra_streak": g.infra_streak + 1 if infra else (0 if admitted else g.infra_streak),
            "infra_rounds": g.infra_rounds + (1 if infra and admitted else 0),
            "interrupted_tokens": g.interrupted_tokens + iv.interrupted_tokens,
            "memory": g.memory.model_copy(update={"notes": notes}),
        }
    )
    return g, new_notes


def _refused_unstarted(iv: Interval) -> bool:
    """The spend guard refused the turn's first call: the model did no work, so it is not a round."""
    return iv.last_end_reason == "budget" and iv.answers == 0 and iv.tokens == 0


@dataclass(frozen=True)
class Facts:
    """The interval's facts as the outcome rules read them (folded into the goal already)."""

    verified: bool
    #: The continuation was superseded by a person's follow-up (re-issued, same round number).
    superseded: bool
    #: The continuation was cancelled for another reason.
    cancelled: bool
    #: The interval ended on a model error, and whether it counts towards the error streak.
    error: bool
    counted_error: bool
    error_text: str
    stalled: bool
    #: The interval ended on the infrastructure's trouble (rule 8): not a round, nothing counted.
    infra: bool = False


def fold_interval(g: Goal, inp: PolicyInput, new_note: bool, verified: bool) -> tuple[Goal, Facts]:
    """Fold every other fact of an active goal's interval into it (its claim is folded, ``verified``
    or not: :func:`fold_claim`): the blocked, error and stall streaks."""
    iv = inp.interval
    infra = infrastructure(iv, verified)
    is_round = iv.continuation_fate is ContinuationFate.ADMITTED and not infra
    superseded = iv.continuation_fate is ContinuationFate.CANCELLED and iv.cancel_reason == "superseded"
    if iv.blocked:
        g = g.model_copy(update={"blocked_streak": g.blocked_streak + 1})
    elif is_round:
        g = g.model_copy(update={"blocked_streak": 0})
    error = iv.last_end_reason == "error"
    interrupted = iv.last_end_reason == "interrupted"
    error_text = iv.last_error or ("the turn was interrupted" if interrupted else "model error")
    counted_error = error and not infra and iv.last_error_kind != ModelErrorKind.AUTH and not iv.breaker_open
    if error:
        g = g.model_copy(
            update={
                "error_streak": g.error_streak + (1 if counted_error else 0),
                "memory": g.memory.model_copy(update={"last_error": error_text}),
            }
        )
    elif iv.turns and not infra:  # the model worked: the last error is behind it
        g = g.model_copy(update={"error_streak": 0, "memory": g.memory.model_copy(update={"last_error": None})})
    stalled = False
    if is_round and not error:
        g, stalled = _stall(g, inp, new_note)
    cancelled = iv.continuation_fate is ContinuationFate.CANCELLED and not superseded
    return g, Facts(verified, superseded, cancelled, error, counted_error, error_text, stalled, infra)


def _stall(g: Goal, inp: PolicyInput, new_note: bool) -> tuple[Goal, bool]:
    """Fold one round's observed progress into the stall streak: ``(goal, paused as stalled)``."""
    iv = inp.interval
    seen = list(g.memory.seen_calls)
    for c in iv.tool_calls:
        if c not in seen:
            seen.append(c)
    fp_changed = inp.fingerprint is not None and inp.fingerprint != g.memory.fingerprint
    progress_changed = inp.progress is not None and inp.progress != g.memory.progress
    # Tool calls are recorded (what the agent tried) but never count as progress by themselves: a
    # call repeated with the same arguments and result would otherwise defeat the rule. Notes
    # neither: they only put the pause off, by at most N rounds.
    streak = 0 if fp_changed or progress_changed else g.stall_streak + 1
    n = g.rules.stall_rounds
    stalled = streak >= 2 * n + 1 or (streak >= n + 1 and not new_note)
    memory = g.memory.model_copy(
        update={
            "seen_calls": seen[-MAX_SEEN_CALLS:],
            # A walk cut short (or no work directory) observed nothing: the last fingerprint stays.
            "fingerprint": inp.fingerprint if inp.fingerprint is not None else g.memory.fingerprint,
            "progress": inp.progress if inp.progress is not None else g.memory.progress,
            "warned_stall": streak >= n,
        }
    )
    return g.model_copy(update={"stall_streak": streak, "memory": memory}), stalled
