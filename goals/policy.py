"""The goal engine's decision, as a pure function of its inputs.

At each whole-agent idle of a goal's session the engine gathers the facts of the interval since it
last looked (:class:`Interval`, read from the session's events), what it can observe of the work
(the work directory's fingerprint, the output of the goal's ``progress`` command), and the result
of any verification it ran, and calls :func:`decide`. Nothing here reads a clock, a file or the
store; every input is an argument, so the rules are tested as a table.

**Every fact of the interval is decided, whatever else the interval holds.** :func:`decide` first
folds every fact into the goal (tokens, rounds, notes; a claim verified or refused; the blocked,
error and stall streaks), and only then picks the outcome by precedence. So no rule can skip
another's fact by returning first: a refused claim is counted and its output kept for the next
continuation even when the interval also exhausted a budget; a verified claim completes the goal
even when a person's follow-up superseded the continuation in the same interval. The precedence:

1. A goal that is not live changes nothing; a paused (or waiting) goal only counts (tokens, rounds, notes) and
   keeps a completion claim pending (``memory.pending_claim``): it is decided, as rule 2 or 5
   says, at the first idle after the goal is resumed (the engine runs the verification then).
   Its own continuation still queued cannot happen at a real idle (a queued waking message keeps
   the session running): nothing is decided, and the interval is read again, whole, at the next.
2. A completion claim whose verification passed (or that has no verification commands):
   completed. It beats every other fact: the objective is met. An interval the infrastructure cut
   after its claim is therefore no interval of rule 8: it is not run again, and a round counts as
   the round it was. The reason is ``verified`` only when verification commands ran and passed; a
   goal without any completes ``no_verification`` (shown as ``completed (unverified: no
   verification)``): the model's word alone is never "verified".
3. An unrecoverable fault (the goal's model is no longer known, the work directory vanished): failed.
   A claim in the same interval is counted as refused (it could not be verified). Then a work
   directory that holds more on disk than the goal's disk limit (as its walk measured it): paused
   ``disk_limit``, with the figures (``disk_limit: the work directory holds 1.2 GiB, over its 1 GiB
   limit``); nothing of the goal runs until a person frees space (or raises the limit) and resumes it.
4. The continuation cancelled other than ``superseded``: paused, with the reason.
5. K claims refused: paused ``unverified``.
6. ``goal_blocked`` called in B consecutive rounds: paused ``blocked`` with the model's words. A
   call in an interval that is not a round (a person's follow-up) counts too; a round without one
   ends the streak.
6b. The agent asked its operator a question (``ask_operator``): the goal waits (``waiting``, the
   question as its reason) until it is answered, its default is used at its deadline, or it is
   withdrawn (:mod:`goals.questions`); nothing runs or is charged meanwhile. A waiting goal's
   intervals (a person's message) only count, as a paused goal's do.
7. A budget spent (rounds, tokens, cost, wall time, deadline, or the guard refused a call): exhausted.
   A turn whose first call the guard refused is not a round (the model did no work); a token
   budget smaller than that one call's reservation is exhausted ``token_budget_too_small``, not spent.
8. **Infrastructure trouble is not the goal's.** The interval's last turn was interrupted (the
   daemon died or stopped, a lease moved, the store went away), or failed before any model answer
   with an error the provider's breaker counts (unreachable, refused, timed out, overloaded,
   rate-limited) or while the breaker was open: the round is not counted (``rounds`` stays, nor is
   the stall or error streak touched) and is run again with the same round number, at once after
   an interruption, after the base backoff after a provider's failure. ``infra_streak`` counts
   such intervals in a row (a counted round ends it), ``infra_rounds`` the rounds re-run; past
   ``rules.infra_retries`` in a row the goal tries once every ``error_backoff_max_seconds``. It
   waits, active, with the cause (``memory.cause``): never paused, never exhausted by it. The
   tokens charged in full for calls a crash left without an outcome stay charged (the call may
   have been billed) and are counted apart too (``interrupted_tokens``).
9. The interval ended on a model error: an authentication error pauses at once, and so does a
   request that cannot be made to fit the model's window (``context_too_small``); an error of a
   provider outage (its circuit breaker was open or opened in the interval) is not counted: the
   goal waits the base backoff and goes on (its next call waits for the breaker), so one long
   outage leaves no goal paused; otherwise the goal waits (``not_before``, exponential backoff)
   and after M errors in a row pauses ``model_error``.
10. Stalls, judged on rounds (a round that ended on a model error is the error rule's). **Progress
   is what the daemon can observe**: a changed work-directory fingerprint, or a changed output of
   the goal's ``progress`` command. A round without either extends the stall streak; at N the next
   continuation warns; at N+1 the goal is paused ``stalled``, unless the round brought a new
   ``goal_progress`` note: a note is the model's own word, like a completion claim, so it may
   delay the pause by at most N more rounds (at 2N+1 the goal is paused whatever it notes). Tool
   calls never count (a model that runs the same ``list_dir`` every round makes none).
11. A backoff still pending: wait. Otherwise one continuation: for the next round, or, when a
    person's follow-up superseded the continuation, re-issued with the same round number.

What explains the outcome is written with it: ``status_reason``, and ``memory.cause`` for the
event's own words (an authentication error's text, the guard's refusal, the error a wait waits
out), cleared by every other outcome, so that :func:`goals.why.why` never shows an old one.

The decision's input and output types are in :mod:`goals.decision`, the budget arithmetic (which
budget is spent, the guard's limits, the backoff, a status change that counts wall time) in
:mod:`goals.budgets`; both are re-exported here. The folding of the facts into the goal (rule 1's
bookkeeping, the claim, the streaks) is :mod:`goals.fold`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from agent import ModelErrorKind
from goals.budgets import backoff, budget_spent, guard_limits, refusal_reason, wall_ends_first, with_status
from goals.continuation import render
from goals.decision import Claim, ContinuationFate, Decision, DecisionKind, Interval, PolicyInput
from goals.fingerprint_limits import size_text
from goals.fold import CONTEXT_TOO_SMALL, Facts, bookkeep, fold_claim, fold_interval
from goals.model import Goal, GoalStatus, PendingClaim, StopReason
from goals.questions import waiting_on
from goals.why import TOKEN_BUDGET_TOO_SMALL, WAIT_INTERRUPTED, WAIT_PROVIDER, call_reservation


def decide(inp: PolicyInput) -> Decision:
    """Decide what the goal does at this idle. Pure: see the module docstring.

    Every fact is folded into the goal first (:func:`goals.fold.fold_claim`,
    :func:`goals.fold.bookkeep`, :func:`goals.fold.fold_interval`); then the first
    rule of :data:`RULES` that applies, in the docstring's order of precedence, gives the outcome.
    """
    g = inp.goal
    if not g.status.live or inp.interval.continuation_fate is ContinuationFate.QUEUED:
        return Decision(DecisionKind.NOTHING, g)
    if g.status in (GoalStatus.PAUSED, GoalStatus.WAITING):
        g, _ = bookkeep(g, inp)
        if inp.interval.claims:
            # Kept, not dropped: the model was told its claim would be verified. Resume decides it.
            claim = inp.interval.claims[-1]
            pending = PendingClaim(summary=claim.summary, evidence=claim.evidence)
            g = g.model_copy(update={"memory": g.memory.model_copy(update={"pending_claim": pending})})
        return Decision(DecisionKind.BOOKKEEP, g)
    g, verified = fold_claim(g, inp)  # first: a claim that completes the goal makes the interval a round
    g, new_notes = bookkeep(g, inp, completes=verified)
    g, facts = fold_interval(g, inp, bool(new_notes), verified)
    for rule in RULES:
        decision = rule(g, inp, facts)
        if decision is not None:
            return decision
    raise AssertionError("the last rule always decides")


# -- The outcome rules, by precedence (the module docstring's rules 2 to 11). ---------------------

Rule = Callable[[Goal, PolicyInput, Facts], "Decision | None"]


def _pause(g: Goal, reason: str, now: datetime, cause: str | None = None) -> Decision:
    return Decision(DecisionKind.PAUSE, with_status(g, GoalStatus.PAUSED, reason, now, cause=cause))


def _wait(g: Goal, until: datetime, cause: str) -> Decision:
    """Wait until ``until``, active, with the words of what it waits out (``memory.cause``)."""
    memory = g.memory.model_copy(update={"cause": cause})
    return Decision(DecisionKind.WAIT, g.model_copy(update={"not_before": until, "memory": memory}))


def _completed(g: Goal, inp: PolicyInput, facts: Facts) -> Decision | None:
    """Rule 2: a verified claim completes the goal."""
    if not facts.verified:
        return None
    # Truthful labels: ``verified`` only when verification commands ran and passed.
    reason = StopReason.VERIFIED if g.memory.verify_results else StopReason.NO_VERIFICATION
    return Decision(DecisionKind.COMPLETE, with_status(g, GoalStatus.COMPLETED, reason, inp.now))


def _failed(g: Goal, inp: PolicyInput, facts: Facts) -> Decision | None:
    """Rule 3: an unrecoverable fault, or the work directory gone, fails it."""
    if inp.fault is not None:
        return Decision(DecisionKind.FAIL, with_status(g, GoalStatus.FAILED, inp.fault, inp.now))
    if not inp.workdir_exists:
        return Decision(DecisionKind.FAIL, with_status(g, GoalStatus.FAILED, StopReason.WORKDIR_MISSING, inp.now))
    return None


def disk_over(disk_bytes: int | None, limit: int | None) -> str | None:
    """The ``disk_limit`` pause reason, with the figures, when ``disk_bytes`` is over ``limit``."""
    if disk_bytes is None or limit is None or disk_bytes <= limit:
        return None
    held, cap = size_text(disk_bytes), size_text(limit)
    return f"{StopReason.DISK_LIMIT}: the work directory holds {held}, over its {cap} limit"


def _over_disk(g: Goal, inp: PolicyInput, facts: Facts) -> Decision | None:
    """Rule 3, second part: a work directory over the goal's disk limit pauses it ``disk_limit``."""
    reason = disk_over(inp.disk_bytes, inp.disk_limit)
    return _pause(g, reason, inp.now) if reason is not None else None


def _cancelled(g: Goal, inp: PolicyInput, facts: Facts) -> Decision | None:
    """Rule 4: the continuation cancelled (not superseded) pauses it, with the reason."""
    if not facts.cancelled:
        return None
    return _pause(g, f"continuation cancelled: {inp.interval.cancel_reason or 'no reason given'}", inp.now)


def _unverified(g: Goal, inp: PolicyInput, facts: Facts) -> Decision | None:
    """Rule 5: K claims refused pause it ``unverified``."""
    return _pause(g, StopReason.UNVERIFIED, inp.now) if g.refused_claims >= g.rules.max_refused_claims else None


def _blocked(g: Goal, inp: PolicyInput, facts: Facts) -> Decision | None:
    """Rule 6: ``goal_blocked`` in B consecutive rounds pauses it ``blocked``."""
    blocked = inp.interval.blocked
    if blocked and g.blocked_streak >= g.rules.blocked_rounds:
        return _pause(g, f"{StopReason.BLOCKED}: {blocked[-1]}", inp.now)
    return None


def _asked(g: Goal, inp: PolicyInput, facts: Facts) -> Decision | None:
    """Rule 6b: the agent asked its operator a question (``ask_operator``): the goal waits for the
    answer (its row is written with this decision). The last question of the interval is asked."""
    if not inp.interval.questions:
        return None
    asked = inp.interval.questions[-1]
    return Decision(DecisionKind.ASK, waiting_on(g, asked, inp.now), question=asked)


def _exhausted(g: Goal, inp: PolicyInput, facts: Facts) -> Decision | None:
    """Rule 7: a budget spent, or the guard's refusal, exhausts it."""
    iv, now = inp.interval, inp.now
    spent = budget_spent(g, now)
    if spent is None and iv.last_end_reason == "budget":
        # The guard folds the wall-time limit into its deadline, so its refusal text alone cannot
        # tell a spent wall time from a passed deadline: the goal's own budgets say which it is.
        spent = refusal_reason(iv.last_error)
        if spent is StopReason.DEADLINE and wall_ends_first(g, now):
            # Refused (or cut) before the end because too little time was left for a call.
            spent = StopReason.WALL_TIME
    if spent is None:
        return None
    # The guard's refusal says what the call would have cost and what was left: the goal's cause.
    cause = iv.last_error if iv.last_end_reason == "budget" else None
    reason: str = spent
    budget, reserves = g.budgets.max_tokens_total, call_reservation(cause)
    if spent is StopReason.TOKEN_BUDGET and budget is not None and reserves is not None and reserves > budget:
        reason = TOKEN_BUDGET_TOO_SMALL  # not spent: no call could ever be paid for
    return Decision(DecisionKind.EXHAUST, with_status(g, GoalStatus.EXHAUSTED, reason, now, cause=cause))


def _infrastructure(g: Goal, inp: PolicyInput, facts: Facts) -> Decision | None:
    """Rule 8: the infrastructure's trouble: the round is run again (not counted), at once after an
    interruption, after the base backoff after a provider's failure, and once every
    ``error_backoff_max_seconds`` past ``infra_retries`` in a row; never a pause."""
    if not facts.infra:
        return None
    r = g.rules
    interrupted = inp.interval.last_end_reason == "interrupted"
    if g.infra_streak > r.infra_retries:
        wait = r.error_backoff_max_seconds
    elif interrupted:
        wait = 0.0
    else:
        wait = backoff(g, 1)
    if wait <= 0:
        return _next_round(g, inp, facts)
    code = WAIT_INTERRUPTED if interrupted else WAIT_PROVIDER
    return _wait(g, inp.now + timedelta(seconds=wait), f"{code}: {facts.error_text}")


def _model_error(g: Goal, inp: PolicyInput, facts: Facts) -> Decision | None:
    """Rule 9: a model error pauses (authentication, a window too small, or M in a row) or waits a backoff."""
    if not facts.error:
        return None
    if inp.interval.last_error_kind == ModelErrorKind.AUTH:
        return _pause(g, StopReason.AUTH_ERROR, inp.now, cause=facts.error_text)
    if inp.interval.last_error_kind == CONTEXT_TOO_SMALL:
        # Even compacted, the request does not fit the model's window (the error names the figures):
        # waiting changes nothing; a person must pick a model with a larger window (or raise it).
        return _pause(g, facts.error_text, inp.now)
    cause = f"{StopReason.MODEL_ERROR}: {facts.error_text}"
    if not facts.counted_error:
        # The provider is down for every goal alike; counting would pause them all overnight.
        return _wait(g, inp.now + timedelta(seconds=backoff(g, 1)), f"{WAIT_PROVIDER}: {facts.error_text}")
    if g.error_streak >= g.rules.max_model_errors:
        return _pause(g, cause, inp.now)
    return _wait(g, inp.now + timedelta(seconds=backoff(g, g.error_streak)), cause)


def _stalled(g: Goal, inp: PolicyInput, facts: Facts) -> Decision | None:
    """Rule 10: a stall pauses it ``stalled``."""
    return _pause(g, StopReason.STALLED, inp.now) if facts.stalled else None


def _next_round(g: Goal, inp: PolicyInput, facts: Facts) -> Decision:
    """Rule 11: a pending backoff waits; otherwise one continuation (re-issued when superseded; the
    same round again after the infrastructure's trouble, since that round was not counted)."""
    now = inp.now
    if g.not_before is not None and now < g.not_before:
        return Decision(DecisionKind.WAIT, g)
    g = g.model_copy(update={"not_before": None, "memory": g.memory.model_copy(update={"cause": None})})
    warn = g.memory.warned_stall
    cut = inp.interval.last_end_reason == "max_tokens"
    rerun = g.infra_streak > 0
    if facts.superseded:
        round_no = g.continuation_round or (g.rounds + 1)
        text = render(g, round_no, now, stall_warning=warn, answer_cut=cut, rerun=rerun)
        return Decision(DecisionKind.REISSUE, g, text, round_no)
    round_no = g.rounds + 1
    text = render(g, round_no, now, stall_warning=warn, answer_cut=cut, rerun=rerun)
    return Decision(DecisionKind.CONTINUE, g, text, round_no)


#: The outcome rules in order of precedence; the first that returns a decision decides.
RULES: tuple[Rule, ...] = (
    _completed,
    _failed,
    _over_disk,
    _cancelled,
    _unverified,
    _blocked,
    _asked,
    _exhausted,
    _infrastructure,
    _model_error,
    _stalled,
    _next_round,
)


# The decision's types and the budget arithmetic live in their own modules; their names stay
# importable from here.
__all__ = [
    "RULES",
    "Claim",
    "ContinuationFate",
    "Decision",
    "DecisionKind",
    "Interval",
    "PolicyInput",
    "backoff",
    "budget_spent",
    "decide",
    "disk_over",
    "guard_limits",
    "refusal_reason",
]
