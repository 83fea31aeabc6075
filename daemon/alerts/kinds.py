"""The kinds of notification, and the daemon's own ones: schedule runs and circuit breakers.

Goals write theirs (``goal_<status>``) from :mod:`goals.notices`; the daemon writes a schedule run
that ended ``missed`` or ``error`` in the transaction that records the run
(:func:`notify_schedule_run`), and a provider's circuit breaker opening or closing in a transaction
of its own when it changes (:func:`breaker_notice`: the breaker's state lives in memory, so there is
no change to share a transaction with).

Grouping: every missed run shares one cause (goald was down, or woke late), so a restart after a
night away is one message with the count; runs that failed with the same error type are one too.
"""

from __future__ import annotations

import enum
from typing import Any

from agent.outbox import NotificationId, put
from agent.tx import Tx


class NotificationKind(enum.StrEnum):
    """What a notification reports (a sink's ``kinds`` filter names these)."""

    GOAL_COMPLETED = "goal_completed"
    GOAL_EXHAUSTED = "goal_exhausted"
    GOAL_FAILED = "goal_failed"
    GOAL_CANCELLED = "goal_cancelled"
    GOAL_PAUSED = "goal_paused"
    #: A goal asked its operator a question and waits (repeated until answered: ``[notify] question_repeat_*``).
    GOAL_QUESTION = "goal_question"
    #: A goal's question was answered (or its default used, withdrawn, left unanswered).
    GOAL_ANSWERED = "goal_answered"
    #: A scheduled run was not fired (goald was down or woke past its starting deadline).
    SCHEDULE_MISSED = "schedule_missed"
    #: Firing a scheduled run failed (a bad template, a missing work directory, ...).
    SCHEDULE_ERROR = "schedule_error"
    #: A provider's circuit breaker opened: its calls wait.
    BREAKER_OPENED = "breaker_opened"
    #: A provider's circuit breaker closed again.
    BREAKER_CLOSED = "breaker_closed"
    #: ``goald notify test``.
    TEST = "test"


def notify_schedule_run(
    tx: Tx, schedule_id: str, key: str | None, outcome: str, reason: str | None, scheduled_for: str
) -> NotificationId | None:
    """In the transaction that records a run: its notification, if it ended ``missed`` or ``error``."""
    if outcome not in ("missed", "error"):
        return None
    kind = NotificationKind.SCHEDULE_MISSED if outcome == "missed" else NotificationKind.SCHEDULE_ERROR
    name = key or schedule_id
    text = " ".join((reason or "").split())
    payload: dict[str, Any] = {
        "schedule": {"id": schedule_id, "key": key},
        "status": outcome,
        "reason": text or None,
        "scheduledFor": scheduled_for,
        "summary": f"schedule {name!r} run at {scheduled_for} {outcome}" + (f": {text}" if text else ""),
    }
    group = "schedule_missed" if outcome == "missed" else f"schedule_error:{text.split(':', 1)[0]}"
    return put(tx, kind, payload, group=group)


def breaker_notice(provider: str, opened: bool, detail: dict[str, Any]) -> tuple[NotificationKind, dict[str, Any]]:
    """The kind and payload of a breaker change of ``provider`` (``detail``: its snapshot)."""
    kind = NotificationKind.BREAKER_OPENED if opened else NotificationKind.BREAKER_CLOSED
    state = "open" if opened else "closed"
    last = detail.get("lastError")
    summary = f"provider {provider!r} circuit breaker {state}"
    if opened and last:
        summary += f" after {detail.get('failures', '?')} failure(s); last: {' '.join(str(last).split())[:200]}"
    payload = {"provider": provider, "status": state, "reason": last if opened else None, "summary": summary}
    return kind, payload
