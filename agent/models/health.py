"""Provider health: a rate limiter and a circuit breaker shared by every session using a provider.

goald retries failed model attempts itself (the driver, with jittered backoff), so one session
copes with a flaky provider on its own. What one session cannot see is the others: fifty sessions
retrying into an outage make it worse, and fifty sessions starting at once blow through a
provider's requests- or tokens-per-minute limit. :class:`ProviderHealth` is the one shared place
for that, and :class:`GuardedModel` puts it in front of a provider's :class:`Model`:

* The :class:`RateLimiter` makes callers *wait* (never fail) for a concurrency slot, a request and
  the call's estimated tokens. Buckets refill continuously; a call that used more tokens than
  estimated leaves the bucket in debt, so the next callers wait longer. A 429 with
  ``Retry-After`` holds every caller until then, not only the session that got it.
* The :class:`CircuitBreaker` opens after ``failure_threshold`` consecutive retryable failures
  (server errors, timeouts, dropped connections, rate limits). While it is open, callers *wait*
  in :meth:`CircuitBreaker.wait_ready` instead of failing, so an outage makes turns (and goals)
  wait rather than burn their retries. After a cool-down one probe call goes through
  (half-open): its success closes the breaker, its failure re-opens it with a longer cool-down.
  A non-retryable failure (a 400, a 401) still proves the provider answers, so it counts as
  reachable for the breaker; the driver and the goal engine deal with it.

This module also holds the small pieces every HTTP provider shares to classify a failure: the
HTTP status to :class:`~agent.models.base.ModelErrorKind` table and ``Retry-After`` parsing
(secret redaction is :mod:`agent.redact`'s).

Time comes from a :class:`Clock`, so tests can drive cool-downs and refills without waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import math
import re
import time
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Protocol, assert_never

from agent.errors import InvalidTransition
from agent.models.base import DeltaCallback, Model, ModelError, ModelErrorKind, ModelRequest, ModelResponse

# -- classifying provider failures ---------------------------------------------------------------


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


# -- time ----------------------------------------------------------------------------------------


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


# -- the rate limiter ----------------------------------------------------------------------------


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


# -- the circuit breaker -------------------------------------------------------------------------


class BreakerState(enum.StrEnum):
    """The circuit breaker lifecycle."""

    #: Calls go through; consecutive retryable failures are counted.
    CLOSED = "closed"
    #: The provider looks down: callers wait until the cool-down ends.
    OPEN = "open"
    #: The cool-down ended: one probe call is in flight (or about to be); others wait for its outcome.
    HALF_OPEN = "half_open"


def transition_breaker(current: BreakerState, target: BreakerState) -> BreakerState:
    """Perform one breaker transition, or raise :class:`InvalidTransition`.

    closed -> open (threshold reached); open -> half_open (cool-down over) or closed (a call that
    started before the breaker opened succeeded); half_open -> closed (a success) or open (the
    probe failed).
    """
    match current:
        case BreakerState.CLOSED:
            allowed: tuple[BreakerState, ...] = (BreakerState.OPEN,)
        case BreakerState.OPEN:
            allowed = (BreakerState.HALF_OPEN, BreakerState.CLOSED)
        case BreakerState.HALF_OPEN:
            allowed = (BreakerState.CLOSED, BreakerState.OPEN)
        case _:
            assert_never(current)
    if target not in allowed:
        raise InvalidTransition(f"a {current} circuit breaker cannot become {target}")
    return target


class CircuitBreaker:
    """Opens after consecutive retryable failures; callers wait while it is open. See the module docstring."""

    def __init__(
        self,
        *,
        failure_threshold: int = 5,
        cooldown: float = 10.0,
        max_cooldown: float = 300.0,
        growth: float = 2.0,
        clock: Clock | None = None,
    ) -> None:
        if failure_threshold < 1:
            raise ValueError(f"failure_threshold must be at least 1, got {failure_threshold}")
        if cooldown < 0 or max_cooldown < cooldown or growth < 1:
            raise ValueError("need 0 <= cooldown <= max_cooldown and growth >= 1")
        self.clock: Clock = clock or MonotonicClock()
        self.failure_threshold = failure_threshold
        self.base_cooldown = cooldown
        self.max_cooldown = max_cooldown
        self.growth = growth
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._reopens = 0
        self._trips = 0
        self._cooldown = cooldown
        self._opened_at = 0.0
        self._probe_out = False
        self._waiters: set[asyncio.Future[None]] = set()
        self.waiting = 0

    @property
    def state(self) -> BreakerState:
        """The current state."""
        return self._state

    @property
    def consecutive_failures(self) -> int:
        """Retryable failures since the last success."""
        return self._failures

    def _move(self, target: BreakerState) -> None:
        self._state = transition_breaker(self._state, target)
        for fut in self._waiters:
            if not fut.done():
                fut.set_result(None)

    async def wait_ready(self) -> bool:
        """Wait until a call may go out. Returns ``True`` when the caller is the half-open probe.

        A probe must report its outcome (:meth:`success` / :meth:`failure`) or :meth:`abandon` it.
        """
        self.waiting += 1
        try:
            while True:
                match self._state:
                    case BreakerState.CLOSED:
                        return False
                    case BreakerState.OPEN:
                        remaining = self._opened_at + self._cooldown - self.clock.now()
                        if remaining <= 0:
                            self._move(BreakerState.HALF_OPEN)
                            self._probe_out = True
                            return True
                        await self._wait_change(remaining)
                    case BreakerState.HALF_OPEN:
                        if not self._probe_out:
                            self._probe_out = True
                            return True
                        await self._wait_change(None)
                    case _:
                        assert_never(self._state)
        finally:
            self.waiting -= 1

    async def _wait_change(self, within: float | None) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.add(fut)
        sleeper: asyncio.Future[None] | None = None
        try:
            if within is None:
                await fut
            else:
                sleeper = asyncio.ensure_future(self.clock.sleep(within))
                await asyncio.wait((fut, sleeper), return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._waiters.discard(fut)
            fut.cancel()
            if sleeper is not None:
                sleeper.cancel()

    def success(self, probe: bool = False) -> None:
        """A call reached the provider and got an answer: close the breaker."""
        if probe:
            self._probe_out = False
        self._failures = 0
        self._reopens = 0
        self._cooldown = self.base_cooldown
        if self._state is not BreakerState.CLOSED:
            self._move(BreakerState.CLOSED)

    def failure(self, probe: bool = False, retry_after: float | None = None) -> None:
        """A call failed in a retryable way (the provider may be down or overloaded)."""
        match self._state:
            case BreakerState.CLOSED:
                self._failures += 1
                if self._failures >= self.failure_threshold:
                    self._open(retry_after)
            case BreakerState.HALF_OPEN:
                if probe:
                    self._probe_out = False
                    self._failures += 1
                    self._reopens += 1
                    self._open(retry_after)
            case BreakerState.OPEN:
                pass  # a call that started before the breaker opened; it tells nothing new
            case _:
                assert_never(self._state)

    def abandon(self, probe: bool) -> None:
        """A call ended without an outcome (cancelled): let another caller probe."""
        if probe and self._probe_out:
            self._probe_out = False
            for fut in self._waiters:
                if not fut.done():
                    fut.set_result(None)

    def _open(self, retry_after: float | None) -> None:
        self._cooldown = min(self.max_cooldown, self.base_cooldown * self.growth**self._reopens)
        if retry_after is not None:
            self._cooldown = max(self._cooldown, retry_after)
        self._opened_at = self.clock.now()
        self._trips += 1
        self._move(BreakerState.OPEN)

    def snapshot(self) -> dict[str, Any]:
        """State and counters, for the daemon's health report."""
        retry_in = None
        if self._state is BreakerState.OPEN:
            retry_in = round(max(0.0, self._opened_at + self._cooldown - self.clock.now()), 3)
        return {
            "state": self._state.value,
            "consecutiveFailures": self._failures,
            "failureThreshold": self.failure_threshold,
            "trips": self._trips,
            "cooldown": self._cooldown,
            "retryIn": retry_in,
            "probeInFlight": self._probe_out,
            "waiting": self.waiting,
        }


# -- the shared health of one provider ------------------------------------------------------------


class ProviderHealth:
    """The rate limiter and circuit breaker of one provider, shared by every session that uses it."""

    def __init__(
        self,
        name: str = "",
        *,
        requests_per_minute: int | None = None,
        tokens_per_minute: int | None = None,
        max_concurrent_calls: int | None = None,
        failure_threshold: int = 5,
        cooldown: float = 10.0,
        max_cooldown: float = 300.0,
        clock: Clock | None = None,
    ) -> None:
        clock = clock or MonotonicClock()
        self.name = name
        self.limiter = RateLimiter(
            requests_per_minute=requests_per_minute,
            tokens_per_minute=tokens_per_minute,
            max_concurrent=max_concurrent_calls,
            clock=clock,
        )
        self.breaker = CircuitBreaker(
            failure_threshold=failure_threshold, cooldown=cooldown, max_cooldown=max_cooldown, clock=clock
        )
        self.calls = 0
        self.failures = 0
        self.last_error: str | None = None

    @property
    def state(self) -> str:
        """The breaker's state: ``closed``, ``open`` or ``half_open``."""
        return self.breaker.state.value

    async def wait_ready(self) -> bool:
        """Wait while the breaker is open; ``True`` when the caller is the half-open probe."""
        return await self.breaker.wait_ready()

    def record_success(self, probe: bool = False) -> None:
        """A call got an answer."""
        self.calls += 1
        self.breaker.success(probe)

    def record_failure(self, error: ModelError, probe: bool = False) -> None:
        """A call failed: retryable kinds count against the breaker; a ``Retry-After`` holds every caller."""
        self.calls += 1
        self.failures += 1
        self.last_error = str(error)[:500]
        if error.kind is ModelErrorKind.RATE_LIMIT and error.retry_after:
            self.limiter.hold(error.retry_after)
        if error.retryable:
            self.breaker.failure(probe, error.retry_after)
        else:
            # The provider answered (a 400, a 401, a malformed body): it is reachable.
            self.breaker.success(probe)

    def snapshot(self) -> dict[str, Any]:
        """Everything the daemon reports for this provider."""
        return {
            "provider": self.name,
            "state": self.state,
            "calls": self.calls,
            "failures": self.failures,
            "lastError": self.last_error,
            "breaker": self.breaker.snapshot(),
            "limiter": self.limiter.snapshot(),
        }


class GuardedModel(Model):
    """A model behind its provider's :class:`ProviderHealth`: waits for the breaker and the limiter."""

    def __init__(self, model: Model, health: ProviderHealth) -> None:
        self.inner = model
        self.health = health
        self.provider = model.provider
        self.name = model.name
        self.price = model.price
        self.max_tokens = model.max_tokens
        self.context_window = model.context_window

    def breaker_open(self) -> bool:
        """Whether the provider's circuit breaker is open or half-open (the provider looks down).

        The driver reads it when an attempt fails and records it on the ``model/error`` event, so
        the goal engine can tell an outage (goals wait) from errors of their own (goals count them).
        """
        return self.health.breaker.state is not BreakerState.CLOSED

    @staticmethod
    def estimate_tokens(request: ModelRequest) -> int:
        """Tokens a call may count against a tokens-per-minute limit: the prompt (about 4 bytes a token) and
        ``max_tokens`` (providers count the output limit when they admit a request)."""
        return math.ceil(request.prompt_bytes / 4) + request.max_tokens

    def measure(self, request: ModelRequest) -> int:
        """The inner model's measure (it converts the messages it will send)."""
        return self.inner.measure(request)

    async def complete(self, request: ModelRequest, on_delta: DeltaCallback | None = None) -> ModelResponse:
        """Wait for the breaker and the limiter, call the inner model, and report the outcome."""
        health = self.health
        probe = await health.wait_ready()
        reported = False
        try:
            async with health.limiter.slot(self.estimate_tokens(request)) as lease:
                try:
                    response = await self.inner.complete(request, on_delta)
                except ModelError as exc:
                    lease.settle(exc.usage.total if exc.usage is not None else 0)
                    health.record_failure(exc, probe)
                    reported = True
                    raise
                lease.settle(response.usage.total)
                health.record_success(probe)
                reported = True
                return response
        finally:
            if not reported:
                health.breaker.abandon(probe)

    async def aclose(self) -> None:
        """Close the inner model's connections, if it holds any."""
        closer = getattr(self.inner, "aclose", None)
        if closer is not None:
            await closer()
