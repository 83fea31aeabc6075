"""What a goal tells the outside world: a notification row in the transaction that changes its status.

A goal that reaches ``completed``, ``exhausted``, ``failed``, ``cancelled`` or ``paused`` writes one
notification (kind ``goal_<status>``) through the runtime's outbox (:mod:`agent.outbox`) in the
same transaction as the change, from :func:`goals.store.emit_changed`, the one place every status
change passes. So a change that rolls back (a stale decision) notifies nobody, and one that commits
is delivered even if the daemon dies a moment later.

Causes shared by many goals are grouped: a pause for ``auth_error`` or ``model_error`` (a revoked
key, a provider outage) and a failure for an unknown model (a provider removed from the config) are
keyed by the reason and the provider, so a 401 that pauses a thousand goals is one message naming
the cause and the count. Everything else is the goal's own and goes out alone.

The payload's ``why`` is :func:`goals.why.why` of the goal as it commits: the same words ``goald goal
show`` and the status page show for that status, never an earlier error. Its summary names the goal
by its key (its title when it has none) and its status as the CLI does (``paused (by operator:
TEXT)``, ``exhausted (round limit reached)``), the words also in ``reasonText``.
"""

from __future__ import annotations

import json
from typing import Any

from agent.outbox import NotificationId, put
from agent.tx import Tx
from goals.model import Goal, GoalStatus, StopReason
from goals.why import reason_text, why

#: The statuses a goal notifies on reaching (``waiting``: kind ``goal_question``, with the question).
NOTIFIED = (
    GoalStatus.COMPLETED,
    GoalStatus.EXHAUSTED,
    GoalStatus.FAILED,
    GoalStatus.CANCELLED,
    GoalStatus.PAUSED,
    GoalStatus.WAITING,
)
#: The kind of a goal's question (its status ``waiting``), and of the word that it was answered.
QUESTION_KIND = "goal_question"
ANSWERED_KIND = "goal_answered"
#: Reasons that come from outside the goal (credentials, the provider): grouped by reason and provider.
SHARED_CAUSES = (StopReason.AUTH_ERROR.value, StopReason.MODEL_ERROR.value, "unknown_model")
SUMMARY_CHARS = 300


def reason_code(reason: str | None) -> str | None:
    """The well-known code of a status reason (``stalled``, ``auth_error``, ``unknown_model``, ...):
    the reason itself or its first word before a colon; ``None`` when it has none."""
    if not reason:
        return None
    head = reason.split(":", 1)[0].strip()
    if head == "unknown model":
        return "unknown_model"
    known = {r.value for r in StopReason}
    return head if head in known else None


def goal_payload(goal: Goal) -> dict[str, Any]:
    """The documented payload of a goal notification (without id, kind and time, which the outbox adds)."""
    reason = " ".join((goal.status_reason or "").split()) or None
    words = reason_text(reason) or None  # as the CLI and the status page say it
    # Named by its key, as an operator addresses it (its title when it has none).
    summary = f"goal {goal.key or goal.title!r} {goal.status.value}" + (f" ({words})" if words else "")
    summary += f" after {goal.rounds} round(s), {goal.tokens:,} tokens, cost {goal.cost:.4f}"
    if len(summary) > SUMMARY_CHARS:
        summary = summary[: SUMMARY_CHARS - 1] + "…"
    return {
        "goal": {"id": goal.id, "key": goal.key, "title": goal.title},
        "status": goal.status.value,
        "reason": reason,
        "reasonCode": reason_code(goal.status_reason),
        "reasonText": words,
        "why": why(goal, goal.updated_at),
        "provider": provider_of(goal),
        "counters": {"rounds": goal.rounds, "tokens": goal.tokens, "cost": goal.cost},
        "summary": summary,
    }


def provider_of(goal: Goal) -> str | None:
    """The provider part of the goal's ``PROVIDER:MODEL`` (``None``: the daemon's default model)."""
    return goal.model.split(":", 1)[0] if goal.model and ":" in goal.model else None


def notify_status(tx: Tx, before: GoalStatus | None, goal: Goal) -> NotificationId | None:
    """Write the notification of ``goal``'s new status in ``tx``, if that status is one to notify."""
    if before is goal.status or goal.status not in NOTIFIED:
        return None
    if goal.status is GoalStatus.WAITING:
        return notify_question(tx, goal)
    kind = f"goal_{goal.status.value}"
    code = reason_code(goal.status_reason)
    group = f"{kind}:{code}:{provider_of(goal) or 'default'}" if code in SHARED_CAUSES else None
    return put(tx, kind, goal_payload(goal), group=group)


def question_of(tx: Tx, question_id: str) -> dict[str, Any] | None:
    """A question's row as a notification carries it: ``id``, ``text``, ``options``, ``default``, ``deadline``."""
    r = tx.execute(
        "SELECT id, text, options, default_answer, deadline FROM goal_questions WHERE id=?", (question_id,)
    ).fetchone()
    if r is None:
        return None
    return {
        "id": r["id"],
        "text": r["text"],
        "options": json.loads(r["options"]),
        "default": r["default_answer"],
        "deadline": r["deadline"],
    }


def notify_question(tx: Tx, goal: Goal, *, reminder: int = 0) -> NotificationId | None:
    """The ``goal_question`` notification of the question ``goal`` waits on (``reminder``: the how-many-th
    repetition, 0 for the first). The sender adds the signed answer links when the status page has an address."""
    asked = goal.memory.question
    q = question_of(tx, asked.id) if asked is not None else None
    if q is None:
        return None
    payload = goal_payload(goal)
    payload["question"] = q
    payload["reminder"] = reminder
    name = goal.key or goal.title
    again = f" (reminder {reminder})" if reminder else ""
    options = f" Options: {', '.join(q['options'])}." if q["options"] else ""
    payload["summary"] = _cut(f"goal {name!r} asks{again}: {' '.join(q['text'].split())}{options}")
    return put(tx, QUESTION_KIND, payload)


def notify_answered(tx: Tx, goal: Goal, question_id: str, how: str, answer: str | None, by: str) -> NotificationId:
    """The word that a question was closed (answered elsewhere, its default used, withdrawn, unanswered)."""
    name = goal.key or goal.title
    said = {
        "answer": f"answered by {by}: {answer}",
        "default": f"not answered by its deadline: its default {answer!r} was used",
        "withdrawn": f"withdrawn by {by}: {answer}",
        "unanswered": "not answered by its deadline: the goal is paused",
    }.get(how, how)
    payload = goal_payload(goal)
    payload["question"] = {"id": question_id, "how": how, "answer": answer, "answeredBy": by}
    payload["summary"] = _cut(f"goal {name!r}: question {question_id} {said}")
    return put(tx, ANSWERED_KIND, payload)


def _cut(text: str) -> str:
    return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 1] + "…"
