"""The rate limiter a provider's sessions share: requests and tokens per minute, concurrent calls.

Callers *wait* (never fail) for a concurrency slot, a request and the call's estimated tokens.
Buckets refill continuously; a call that used more tokens than estimated leaves the bucket in debt,
so the next callers wait longer. A 429 with ``Retry-After`` holds every caller until then
(:meth:`RateLimiter.hold`), not only the session that got it. Waiters are served in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from typing import Any

from agent.models.clock import Clock, MonotonicClock


class _Bucket:
    """A token bucket refilled continuously at ``per_minute / 60`` per second, up to ``per_minute``."""

    def __init__(self, per_minute: int, now: float) -> None:
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0
        self.level = self.capacity
        self.stamp = now

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def wait_for(self, amount: float) -> float:
        """Seconds until ``amount`` is available (0 when it is now)."""
        return 0.0 if self.level >= amount else (amount - self.level) / self.rate


class Lease:
    """One call's hold on the limiter; :meth:`settle` corrects the token estimate to the real usage."""

    def __init__(self, limiter: RateLimiter, tokens: int) -> None:
        self._limiter = limiter
        self.tokens = tokens
        self._settled = False

    def settle(self, used_tokens: int) -> None:
        """Return unused estimated tokens to the bucket, or take the excess (once)."""
        if self._settled:
            return
        self._settled = True
        self._limiter._adjust(self.tokens - used_tokens)


class RateLimiter:
    """Requests per minute, tokens per minute and concurrent calls; ``None`` means no limit of that kind."""

    def __init__(
        self,
        *,
        requests_per_minute: int | None = None,
        tokens_per_minute: int | None = None,
        max_concurrent: int | None = None,
        clock: Clock | None = None,
    ) -> None:
        for label, value in (
            ("requests_per_minute", requests_per_minute),
            ("tokens_per_minute", tokens_per_minute),
            ("max_concurrent", max_concurrent),
        ):
            if value is not None and value < 1:
                raise ValueError(f"{label} must be at least 1, got {value}")
        self.clock: Clock = clock or MonotonicClock()
        now = self.clock.now()
        self.requests_per_minute = requests_per_minute
        self.tokens_per_minute = tokens_per_minute
        self.max_concurrent = max_concurrent
        self._requests = _Bucket(requests_per_minute, now) if requests_per_minute else None
        self._tokens = _Bucket(tokens_per_minute, now) if tokens_per_minute else None
        self._slots = asyncio.Semaphore(max_concurrent) if max_concurrent else None
        # One waiter at a time reads the buckets; asyncio.Lock is FIFO, so waiters are served in order.
        self._turnstile = asyncio.Lock()
        self._hold_until = 0.0
        self.in_flight = 0
        self.waiting = 0

    def hold(self, seconds: float) -> None:
        """Let no call start for ``seconds`` (a provider's ``Retry-After``, shared by every caller)."""
        self._hold_until = max(self._hold_until, self.clock.now() + max(0.0, seconds))

    @contextlib.asynccontextmanager
    async def slot(self, tokens: int = 0) -> AsyncIterator[Lease]:
        """Wait for a concurrency slot, a request and ``tokens`` (clamped to the per-minute limit)."""
        tokens = max(0, tokens)
        if self._tokens is not None:
            tokens = min(tokens, int(self._tokens.capacity))
        self.waiting += 1
        try:
            if self._slots is not None:
                await self._slots.acquire()
            try:
                await self._take(tokens)
            except BaseException:
                if self._slots is not None:
                    self._slots.release()
                raise
        finally:
            self.waiting -= 1
        self.in_flight += 1
        lease = Lease(self, tokens)
        try:
            yield lease
        finally:
            self.in_flight -= 1
            if self._slots is not None:
                self._slots.release()

    async def _take(self, tokens: int) -> None:
        async with self._turnstile:
            while True:
                now = self.clock.now()
                wait = self._hold_until - now
                for bucket, amount in ((self._requests, 1.0), (self._tokens, float(tokens))):
                    if bucket is not None:
                        bucket.refill(now)
                        wait = max(wait, bucket.wait_for(amount))
                if wait <= 0:
                    if self._requests is not None:
                        self._requests.level -= 1
                    if self._tokens is not None:
                        self._tokens.level -= tokens
                    return
                await self.clock.sleep(wait)

    def _adjust(self, tokens: int) -> None:
        bucket = self._tokens
        if bucket is None or tokens == 0:
            return
        bucket.refill(self.clock.now())
        # May go negative: a call that used more than estimated makes the next callers wait.
        bucket.level = min(bucket.capacity, bucket.level + tokens)

    def snapshot(self) -> dict[str, Any]:
        """Limits and current load, for the daemon's health report."""
        now = self.clock.now()
        out: dict[str, Any] = {
            "requestsPerMinute": self.requests_per_minute,
            "tokensPerMinute": self.tokens_per_minute,
            "maxConcurrent": self.max_concurrent,
            "inFlight": self.in_flight,
            "waiting": self.waiting,
            "heldFor": round(max(0.0, self._hold_until - now), 3),
        }
        if self._requests is not None:
            self._requests.refill(now)
            out["requestsAvailable"] = math.floor(self._requests.level)
        if self._tokens is not None:
            self._tokens.refill(now)
            out["tokensAvailable"] = math.floor(self._tokens.level)
        return out
