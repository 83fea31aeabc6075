"""Classifying a provider's failures: what every HTTP provider shares.

The HTTP status to :class:`~agent.models.base.ModelErrorKind` table (with the one 400 that is not
the caller's fault: a prompt longer than the window, which the driver compacts and retries), the
prompt size such an answer states, and ``Retry-After`` parsing. Secret redaction is
:mod:`agent.redact`'s. Pure functions of their inputs, so each provider classifies the same way.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from agent.models.base import ModelErrorKind


def status_kind(status: int) -> ModelErrorKind:
    """The error kind of an HTTP error status."""
    if status == 429:
        return ModelErrorKind.RATE_LIMIT
    if status in (401, 403):
        return ModelErrorKind.AUTH
    if status in (408, 409) or status >= 500:
        # 408 (request timeout) and 409 (conflict/lock) are the statuses the SDKs also retry.
        return ModelErrorKind.SERVER
    return ModelErrorKind.BAD_REQUEST


#: Words of the providers' "the prompt does not fit the window" answers (OpenAI-compatible servers:
#: code ``context_length_exceeded``, vLLM "maximum context length", llama.cpp "exceeds the available
#: context size"; Anthropic: "prompt is too long").
_CONTEXT_WORDS = (
    "context_length_exceeded",
    "prompt is too long",
    "maximum context length",
    "context length",
    "context size",
    "context window",
)
_REPORTED_TOKENS = (
    re.compile(r"prompt is too long: (\d+) tokens"),
    re.compile(r"resulted in (\d+) tokens"),
    re.compile(r"(\d+) in the messages"),
    re.compile(r"request \((\d+) tokens\)"),
)


def error_kind(status: int, detail: str, code: str | None = None) -> ModelErrorKind:
    """The error kind of an HTTP error answer: :func:`status_kind`, except that a 400 saying the
    prompt does not fit the context window is ``context_length`` (the driver compacts and retries)."""
    kind = status_kind(status)
    if kind is ModelErrorKind.BAD_REQUEST and status == 400:
        text = f"{code or ''} {detail}".lower()
        if any(word in text for word in _CONTEXT_WORDS):
            return ModelErrorKind.CONTEXT_LENGTH
    return kind


def reported_prompt_tokens(message: str) -> int | None:
    """The prompt's size in tokens when a "context length exceeded" answer states it."""
    for pattern in _REPORTED_TOKENS:
        if m := pattern.search(message):
            return int(m.group(1))
    return None


def parse_retry_after(headers: Mapping[str, str] | None, *, now: datetime | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date), if given."""
    if headers is None:
        return None
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        with contextlib.suppress(ValueError):
            ms = float(raw_ms)
            if math.isfinite(ms) and ms >= 0:
                return ms / 1000
    raw = headers.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    with contextlib.suppress(ValueError):
        seconds = float(raw)
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())
