"""Why a goal stands where it stands, in plain words: the one source of every "why" goald shows.

``goald goal show`` and ``goal list``, ``goal/describe``, the status page and a notification all
show a goal's reason from here, and it is derived from the goal's **current** status and the event
that caused it, never from the last error seen: the status and its reason (``status_reason``), the
words of the causing event written with them (``memory.cause``: an authentication error's text,
the spend guard's refusal, the error a wait waits out), and the goal's own counters. Every outcome
of the engine and every person's change writes the cause afresh (:func:`goals.budgets.with_status`,
:mod:`goals.policy`), so once a goal moves on (resumed, completed, exhausted) the old words are gone
everywhere at once. An active goal has a why only while it waits (its ``not_before`` is ahead).

:func:`reason_text` is the one wording of each stored reason (``paused (by request)``,
``completed (unverified: no verification)``), whatever the stored value's spelling.
"""

from __future__ import annotations

import re
from datetime import datetime

from goals.model import Goal, GoalStatus, StopReason

#: The code of a wait for the model's provider (``memory.cause`` is ``provider: <its error>``): it
#: could not be reached, failed, or its circuit breaker was open.
WAIT_PROVIDER = "provider"
#: The code of a wait after turns interrupted in a row (the daemon died or stopped, a lease moved).
WAIT_INTERRUPTED = "interrupted"
#: Exhausted because the whole token budget is smaller than one call's reservation (the prompt's
#: upper bound plus the call's max_tokens): no call could ever be made, so nothing was spent.
TOKEN_BUDGET_TOO_SMALL = "token_budget_too_small"

#: Paused by an operator who gave the reason in words (``goald goal pause KEY --reason TEXT``): the
#: stored reason is ``by_operator: TEXT`` and reads ``paused (by operator: TEXT)``.
BY_OPERATOR = "by_operator"
#: The longest reason an operator may give with a pause.
MAX_OPERATOR_REASON = 500

#: The spend guard's refusal of a call the tokens left cannot pay for (:meth:`agent.spend.SpendGuard.check`).
_TOKEN_REFUSAL = re.compile(r"token budget: this call may take (\d+) tokens")

#: How each stored reason reads (one wording everywhere; older spellings map to the same words).
REASON_TEXT = {
    "by_request": "by request",
    BY_OPERATOR: "by operator",
    "cancelled by request": "by request",
    "verified": "verified",
    "no_verification": "unverified: no verification",
    "unverified": "unverified: completion claims refused",
    "auth_error": "authentication failed",
    "model_error": "model errors",
    "stalled": "stalled: no progress",
    "round_limit": "round limit reached",
    "token_budget": "token budget spent",
    TOKEN_BUDGET_TOO_SMALL: "token budget too small for one call",
    "cost_budget": "cost budget spent",
    "deadline": "deadline passed",
    "wall_time": "wall time used up",
    "workdir_missing": "work directory missing",
    "disk_limit": "disk limit reached",
    "context_too_small": "context window too small",
}


def reason_text(reason: str | None) -> str:
    """A goal's status reason in plain words (``model_error: X`` reads ``model error: X``)."""
    if not reason:
        return ""
    if reason in REASON_TEXT:
        return REASON_TEXT[reason]
    head, sep, rest = reason.partition(": ")
    if sep and head in REASON_TEXT:
        return f"{head.replace('_', ' ')}: {rest}"
    return reason


def operator_reason(text: str | None) -> str:
    """The stored reason of a person's pause: ``by_operator: TEXT`` with their words (one line,
    trimmed), ``by_request`` without.

    Raises:
        ValueError: blank words, a line break or a control character, or over
            :data:`MAX_OPERATOR_REASON` characters, named.
    """
    if text is None:
        return StopReason.BY_REQUEST
    words = text.strip()
    if not words:
        raise ValueError("the reason is blank: say why the goal is paused, or leave --reason out")
    if any(ord(c) < 32 or ord(c) == 127 for c in words):
        raise ValueError("the reason must be one line of text (no line breaks or control characters)")
    if len(words) > MAX_OPERATOR_REASON:
        raise ValueError(f"the reason is {len(words)} characters long: at most {MAX_OPERATOR_REASON}")
    return f"{BY_OPERATOR}: {words}"


def call_reservation(refusal: str | None) -> int | None:
    """The tokens one call reserved when the spend guard refused it for the token budget (its
    prompt's upper bound plus its max_tokens), read from the guard's refusal; ``None`` otherwise."""
    found = _TOKEN_REFUSAL.match(refusal or "")
    return int(found.group(1)) if found else None


def too_small_for_one_call(budget: int, reserves: int, *, at_least: bool = False) -> str:
    """Why a token budget of ``budget`` cannot pay for a single call that reserves ``reserves``
    tokens (``at_least``: a lower bound, as known before the first call), with the fix."""
    up_to = "at least" if at_least else "up to"
    return (
        f"token budget of {budget:,} cannot pay for one call, which reserves {up_to} {reserves:,} tokens"
        f" (the prompt's upper bound plus the model's max_tokens): raise --max-tokens well above {reserves:,}"
        " (a round makes several calls)"
    )


def span(seconds: float) -> str:
    """A duration in a few characters: ``45s``, ``1m20s``, ``12m``, ``3h05m``, ``2d4h`` (the one
    spelling of a duration: reasons, ``goal show``, ``goald status``, the status page)."""
    s = int(abs(seconds))
    if s < 60:
        return f"{s}s"
    m, sec = divmod(s, 60)
    if m < 10:
        return f"{m}m{sec:02d}s" if sec else f"{m}m"
    if m < 60:
        return f"{m}m"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m:02d}m" if m else f"{h}h"
    d, h = divmod(h, 24)
    return f"{d}d{h}h" if h else f"{d}d"


def why(goal: Goal, now: datetime) -> str | None:
    """The reason shown with ``goal``'s status, with what to do; ``None`` when the status says it all
    (an active goal that is not waiting, a completed or cancelled one, a pause by request)."""
    match goal.status:
        case GoalStatus.ACTIVE:
            return _waiting(goal, now)
        case GoalStatus.PAUSED:
            return _paused(goal)
        case GoalStatus.EXHAUSTED:
            return _exhausted(goal)
        case GoalStatus.FAILED:
            reason = goal.status_reason or ""
            return "its work directory is gone" if reason == StopReason.WORKDIR_MISSING else reason or None
        case _:
            return None


def status_error(goal: Goal, now: datetime) -> str | None:
    """The error behind the goal's **current** status, in one line (``goal list``'s LAST ERROR):
    what the provider or model said while the goal waits it out (an active goal backing off) or
    since it paused for it (authentication, model errors, a window too small), or why it failed;
    ``None`` when its status has no error behind it (running, a pause by a person, a budget, done).
    Like :func:`why`, it is written afresh with each status, so a goal that moved on shows none."""
    match goal.status:
        case GoalStatus.ACTIVE:
            cause = goal.memory.cause
            if goal.not_before is None or goal.not_before <= now or not cause:
                return None
            code, _, text = cause.partition(": ")
            waits = code in (WAIT_PROVIDER, WAIT_INTERRUPTED, StopReason.MODEL_ERROR)
            return _one_line(text or cause) if waits else None
        case GoalStatus.PAUSED:
            code, _, detail = (goal.status_reason or "").partition(": ")
            if code == StopReason.AUTH_ERROR:
                return _one_line(goal.memory.cause or REASON_TEXT[StopReason.AUTH_ERROR])
            if code in (StopReason.MODEL_ERROR, "context_too_small"):
                return _one_line(detail or goal.memory.cause or reason_text(code))
            return None
        case GoalStatus.FAILED:
            failed = why(goal, now)
            return _one_line(failed) if failed else None
        case _:
            return None


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _waiting(goal: Goal, now: datetime) -> str | None:
    """An active goal: why it waits, while it does."""
    cause = goal.memory.cause
    if goal.not_before is None or goal.not_before <= now or not cause:
        return None
    code, _, text = cause.partition(": ")
    rules = goal.rules
    if code in (WAIT_PROVIDER, WAIT_INTERRUPTED):
        n = goal.infra_streak
        what = "waiting for the provider" if code == WAIT_PROVIDER else "waiting after interrupted turns"
        out = f"{what}: {text}; {n} attempt(s) in a row cut short before the model's work, not counted as rounds"
        if n > rules.infra_retries:
            every = span(rules.error_backoff_max_seconds)
            out += f" (past its {rules.infra_retries} retries: one try every {every})"
        return out
    if code == StopReason.MODEL_ERROR:
        return (
            f"backing off after a model error ({goal.error_streak} in a row; paused at "
            f"{rules.max_model_errors}): {text}"
        )
    return cause


def _paused(goal: Goal) -> str | None:
    reason = goal.status_reason or ""
    code, _, detail = reason.partition(": ")
    match code:
        case StopReason.BY_REQUEST | "cancelled by request" | "" | "by_operator":
            return None  # the status says it all (an operator's words are in it)
        case StopReason.AUTH_ERROR:
            text = goal.memory.cause or "the provider refused the credentials"
            return f"{text}: fix the provider's key, then resume the goal"
        case StopReason.MODEL_ERROR:
            streak = goal.error_streak
            return f"{streak} model errors in a row, the last: {detail}; resume it once the model works again"
        case StopReason.STALLED:
            return (
                f"no progress observed in {goal.stall_streak} round(s): nothing changed in the work directory"
                " (or in the output of its progress command); change its approach (goald send), then resume it"
            )
        case StopReason.BLOCKED:
            return (
                f"its agent reported {goal.blocked_streak} round(s) in a row that it cannot go on: {detail};"
                " answer it (goald send), then resume it"
            )
        case StopReason.UNVERIFIED:
            return (
                f"{goal.refused_claims} completion claim(s) refused by its verification commands;"
                " fix the work or the checks, then resume it"
            )
        case StopReason.DISK_LIMIT:
            return f"{detail}: free space in it (or raise the limit), then resume it"
        case "context_too_small":
            return f"{detail}: choose a model with a larger window (or set its context_window), then resume it"
        case "continuation cancelled":
            return f"its continuation was cancelled ({detail}): resume it to go on"
        case _:
            return reason


def _exhausted(goal: Goal) -> str | None:
    b, cause = goal.budgets, goal.memory.cause
    match goal.status_reason:
        case StopReason.ROUND_LIMIT:
            used = f"{goal.rounds} of {b.max_rounds}" if b.max_rounds is not None else f"{goal.rounds}"
            return f"{used} rounds used; raise --max-rounds to resume it"
        case "token_budget_too_small":
            reserves = call_reservation(cause)
            if b.max_tokens_total is None or reserves is None:
                return cause or REASON_TEXT[TOKEN_BUDGET_TOO_SMALL]
            return f"{too_small_for_one_call(b.max_tokens_total, reserves)}, then resume it"
        case StopReason.TOKEN_BUDGET:
            limit = f" of {b.max_tokens_total:,}" if b.max_tokens_total is not None else ""
            return f"{cause or f'{goal.tokens:,}{limit} tokens used'}; raise --max-tokens to resume it"
        case StopReason.COST_BUDGET:
            if cause and "no price" in cause:
                model = goal.model or "its model"
                return (
                    f"{cause}: the cost budget cannot be counted for {model}; set its prices in the provider's"
                    " [providers.NAME.prices] table, or resume without a cost budget"
                )
            limit = f" of {b.max_cost:.4f}" if b.max_cost is not None else ""
            return f"{cause or f'cost {goal.cost:.4f}{limit} used'}; raise --max-cost to resume it"
        case StopReason.DEADLINE:
            when = b.deadline.isoformat(timespec="seconds") if b.deadline is not None else "its deadline"
            return f"{cause or f'the deadline {when} passed'}; set a later --deadline to resume it"
        case StopReason.WALL_TIME:
            limit = f" of {span(b.max_wall_seconds)}" if b.max_wall_seconds is not None else ""
            return f"{cause or f'{span(goal.wall_used)}{limit} of wall time used'}; raise --max-wall to resume it"
        case _:
            return cause or goal.status_reason


__all__ = [
    "BY_OPERATOR",
    "MAX_OPERATOR_REASON",
    "REASON_TEXT",
    "TOKEN_BUDGET_TOO_SMALL",
    "WAIT_INTERRUPTED",
    "WAIT_PROVIDER",
    "call_reservation",
    "operator_reason",
    "reason_text",
    "span",
    "status_error",
    "too_small_for_one_call",
    "why",
]
