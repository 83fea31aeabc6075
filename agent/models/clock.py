"""Where the rate limiter and the circuit breaker get time from, so tests can drive cool-downs and
refills without waiting."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    """Where the limiter and the breaker get time from."""

    def now(self) -> float:
        """Seconds on a monotonic scale."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds``."""
        ...


class MonotonicClock:
    """The real clock."""

    def now(self) -> float:
        """:func:`time.monotonic`."""
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        """:func:`asyncio.sleep`."""
        await asyncio.sleep(seconds)
