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

The parts live in their own modules — the limiter in :mod:`agent.models.ratelimit`, the breaker in
:mod:`agent.models.breaker`, their :class:`Clock` in :mod:`agent.models.clock`, and the
classification of a provider's failures (status table, ``Retry-After``) in
:mod:`agent.models.classify` — and are re-exported here, where callers import them.
"""

from __future__ import annotations

import math
from typing import Any

from agent.models.base import DeltaCallback, Model, ModelError, ModelErrorKind, ModelRequest, ModelResponse
from agent.models.breaker import BreakerState, CircuitBreaker, transition_breaker
from agent.models.classify import error_kind, parse_retry_after, reported_prompt_tokens, status_kind
from agent.models.clock import Clock, MonotonicClock
from agent.models.ratelimit import Lease, RateLimiter

__all__ = [
    "BreakerState",
    "CircuitBreaker",
    "Clock",
    "GuardedModel",
    "Lease",
    "MonotonicClock",
    "ProviderHealth",
    "RateLimiter",
    "error_kind",
    "parse_retry_after",
    "reported_prompt_tokens",
    "status_kind",
    "transition_breaker",
]


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
        #: The provider's models in use, by name (each says its context window and where it came from).
        self.models: dict[str, Model] = {}

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
            "models": {name: model.window_info() for name, model in sorted(self.models.items())},
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
        health.models[model.name] = model

    # The window is the inner model's (it learns it from its server's answers); read and set through.
    @property
    def context_window(self) -> int:
        """The inner model's context window."""
        return self.inner.context_window

    @context_window.setter
    def context_window(self, tokens: int) -> None:
        self.inner.context_window = tokens

    @property
    def window_source(self) -> str:
        """Where the inner model's window came from."""
        return self.inner.window_source

    @window_source.setter
    def window_source(self, source: str) -> None:
        self.inner.window_source = source

    def learn_window(self, tokens: int, source: str) -> bool:
        """The inner model learns it."""
        return self.inner.learn_window(tokens, source)

    async def discover_window(self) -> None:
        """The inner model asks its server (outside the breaker and the limiter: a probe is best effort)."""
        await self.inner.discover_window()

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
