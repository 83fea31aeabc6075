"""The documented payload of a delivered message, its one-line summary, and its HMAC signature.

A message is one notification, or several with one cause (:mod:`agent.outbox`). Its payload is the
first notification's fields plus what the group adds::

    {
      "id": "ntf_…",          # the message's stable id: the same on every attempt (de-duplicate on it)
      "ids": ["ntf_…", …],    # every notification the message carries (the first is "id")
      "count": 1,             # how many
      "kind": "goal_paused",  # see NotificationKind
      "cause": null,          # the group key when notifications were grouped, else null
      "goal": {"id": "goal_…", "key": null, "title": "…"},   # goal kinds (the first goal)
      "goals": [ … ],         # grouped goal kinds: the first 20 goals
      "schedule": {"id": "sch_…", "key": "nightly"},        # schedule kinds
      "provider": "openai",   # goal and breaker kinds
      "status": "paused", "reason": "auth_error: …", "reasonCode": "auth_error",
      "reasonText": "authentication failed",   # goal kinds: the reason as the CLI says it
      "why": "HTTP 401 …: fix the provider's key, then resume the goal",  # goal kinds: as goal show says it
      "counters": {"rounds": 3, "tokens": 5120, "cost": 0.012},  # goal kinds
      "summary": "goal 'nightly' paused (stalled: no progress) after 6 round(s), …",
      "time": "2025-06-01T03:00:00.000000+00:00",   # when the change committed
      "host": "server1"
    }

The signature is HMAC-SHA256 over the exact body bytes with the configured key, hex, in the
``X-Goald-Signature: sha256=<hex>`` header (the form the big code hosts use for their webhooks).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
from typing import Any

from agent.outbox import Message
from goals.why import reason_text

#: The fields of the first notification copied into the payload (when present).
_FIELDS = (
    "goal", "schedule", "provider", "status", "reason", "reasonCode", "reasonText", "why", "counters", "scheduledFor",
    "time", "question", "reminder",
)  # fmt: skip


def _group_summary(message: Message, first: dict[str, Any]) -> str:
    n = message.count
    kind = message.kind
    if kind.startswith("goal_"):
        what = f"{n} goals {kind.removeprefix('goal_')}"
        code = first.get("reasonCode") or first.get("reason")
        provider = first.get("provider")
        words = reason_text(code) if code else ""  # the CLI's words for the shared cause
        cause = f" ({words}" + (f", provider {provider})" if provider else ")") if words else ""
        return f"{what}{cause}; first: {first.get('summary', '')}"
    if kind == "schedule_missed":
        return f"{n} schedule runs missed; first: {first.get('summary', '')}"
    if kind == "schedule_error":
        return f"{n} schedule runs failed; first: {first.get('summary', '')}"
    return f"{n} × {kind}; first: {first.get('summary', '')}"


def payload_of(message: Message) -> dict[str, Any]:
    """The documented payload of ``message`` (see the module docstring)."""
    first = message.payloads[0]
    body: dict[str, Any] = {"id": message.id, "ids": message.ids, "count": message.count, "kind": message.kind}
    body["cause"] = message.group if message.count > 1 else None
    for name in _FIELDS:
        if name in first:
            body[name] = first[name]
    if message.count > 1 and "goal" in first:
        body["goals"] = [p["goal"] for p in message.payloads if "goal" in p]
    body["summary"] = _group_summary(message, first) if message.count > 1 else first.get("summary", message.kind)
    body["host"] = socket.gethostname()
    return body


def template_values(payload: dict[str, Any]) -> dict[str, str]:
    """The values of a webhook template's placeholders, as text."""
    goal = payload.get("goal") or {}
    schedule = payload.get("schedule") or {}

    def text(value: Any) -> str:
        return "" if value is None else str(value)

    return {
        "id": text(payload.get("id")),
        "kind": text(payload.get("kind")),
        "status": text(payload.get("status")),
        "reason": text(payload.get("reason")),
        "summary": text(payload.get("summary")),
        "title": text(goal.get("title")),
        "goal_id": text(goal.get("id")),
        "goal_key": text(goal.get("key")),
        "provider": text(payload.get("provider")),
        "schedule": text(schedule.get("key") or schedule.get("id")),
        "count": text(payload.get("count")),
        "time": text(payload.get("time")),
        "host": text(payload.get("host")),
        "answer_url": text(payload.get("answerUrl")),
    }


def dumps(payload: dict[str, Any]) -> bytes:
    """The payload's JSON body."""
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


def signature(key: str, body: bytes) -> str:
    """The ``X-Goald-Signature`` header value of ``body`` under ``key``."""
    return "sha256=" + hmac.new(key.encode(), body, hashlib.sha256).hexdigest()


def verify(key: str, body: bytes, header: str) -> bool:
    """Whether ``header`` is ``body``'s signature under ``key`` (what a receiver checks)."""
    return hmac.compare_digest(signature(key, body), header)
