"""Classifying a provider's failures: what every HTTP provider shares.

The HTTP status to :class:`~agent.models.base.ModelErrorKind` table (with the one 400 that is not
the caller's fault: a prompt longer than the window, which the driver compacts and retries), what
such an answer states (the window and the prompt's size, read with the table of the servers'
wordings in :mod:`agent.models.windows`), and ``Retry-After`` parsing. Secret redaction is
:mod:`agent.redact`'s. Pure functions of their inputs, so each provider classifies the same way.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from agent.models.base import ModelErrorKind
from agent.models.windows import StatedWindow, read_refusal


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


def error_kind(status: int, detail: str, code: str | None = None, body: object = None) -> ModelErrorKind:
    """The error kind of an HTTP error answer: :func:`status_kind`, except that an answer saying the
    prompt does not fit the context window is ``context_length`` (the driver compacts and retries):
    a 400 (413, 422) in the words of :mod:`agent.models.windows`, or any error status that states
    the window in one of its servers' wordings."""
    kind = status_kind(status)
    if kind is ModelErrorKind.AUTH or kind is ModelErrorKind.RATE_LIMIT:
        return kind
    stated = read_refusal(f"{code or ''} {detail}", body)
    if stated is None:
        return kind
    if status in (400, 413, 422) or (stated.window is not None and stated.server != "unknown"):
        return ModelErrorKind.CONTEXT_LENGTH
    return kind


def stated_window(message: str, body: object = None) -> StatedWindow | None:
    """What a "context length exceeded" answer states (the window, the size counted), if it is one."""
    return read_refusal(message, body)


def reported_prompt_tokens(message: str) -> int | None:
    """The size in tokens a "context length exceeded" answer states it counted, if it does."""
    stated = read_refusal(message)
    return stated.tokens if stated is not None else None


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
