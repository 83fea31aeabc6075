"""A session driver's settings: its retry policy, step limit, output limit, context policy and how
many tool calls of a step run at once.

Plain frozen pydantic models, so a daemon's configuration file and a test build them the same way;
kept apart from :mod:`agent.driver` because the model-call path (:mod:`agent.step`) and compaction
read them too.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agent.context import ContextPolicy

#: Makes the context manager a turn holds for its whole run (a concurrency slot of the runtime).
SlotFactory = Callable[[], AbstractAsyncContextManager[Any]]


class RetryPolicy(BaseModel):
    """How the driver retries failed model attempts (retryable kinds and malformed answers only)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_attempts: int = Field(default=4, ge=1)
    base_delay: float = Field(default=0.5, ge=0)
    max_delay: float = Field(default=30.0, ge=0)
    jitter: float = Field(default=0.2, ge=0, le=1)
    #: A ``Retry-After`` longer than this is not waited out inside the turn (which holds a
    #: concurrency slot): the attempt fails and the turn ends ``error``; a goal then backs off
    #: durably, without holding anything.
    max_retry_after: float = Field(default=300.0, ge=0)

    def retries(self, attempt: int, retry_after: float | None) -> bool:
        """Whether a retryable failure of attempt ``attempt`` is retried within the turn."""
        return attempt < self.max_attempts and (retry_after is None or retry_after <= self.max_retry_after)

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait before attempt ``attempt + 1``."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), max(self.max_delay, retry_after))
        raw = min(self.max_delay, self.base_delay * float(2 ** (attempt - 1)))
        return raw * (1 + self.jitter * (2 * random.random() - 1))


class AgentConfig(BaseModel):
    """Per-session driver settings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    system: str | None = None
    max_steps: int = Field(default=40, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    retry: RetryPolicy = RetryPolicy()
    #: No model call starts with less than this many seconds left before the spend guard's
    #: deadline or the end of its wall time (a call cut off there is paid for and yields nothing).
    min_call_seconds: float = Field(default=5.0, ge=0)
    #: When and how the model's view is compacted (:mod:`agent.context`).
    context: ContextPolicy = ContextPolicy()
    #: Tool calls of one step that run at once; the rest wait their turn, in the order asked
    #: (:mod:`agent.toolcalls`). A goal's caps on processes and memory bind whatever runs.
    max_parallel_tools: int = Field(default=8, ge=1, le=1024)
