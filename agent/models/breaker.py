"""The circuit breaker a provider's sessions share.

It opens after ``failure_threshold`` consecutive retryable failures (server errors, timeouts,
dropped connections, rate limits). While it is open, callers *wait* in
:meth:`CircuitBreaker.wait_ready` instead of failing, so an outage makes turns (and goals) wait
rather than burn their retries. After a cool-down one probe call goes through (half-open): its
success closes the breaker, its failure re-opens it with a longer cool-down. Every state change
goes through :func:`transition_breaker` and is reported to :attr:`CircuitBreaker.on_change` (the
daemon's alerts notify opening and closing).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from typing import Any, assert_never

from agent.errors import InvalidTransition
from agent.models.clock import Clock, MonotonicClock


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
        #: Called with (before, after) on every state change (the daemon notifies opening and closing).
        #: It must not raise or block: it runs inside the breaker's bookkeeping.
        self.on_change: Callable[[BreakerState, BreakerState], None] | None = None

    @property
    def state(self) -> BreakerState:
        """The current state."""
        return self._state

    @property
    def consecutive_failures(self) -> int:
        """Retryable failures since the last success."""
        return self._failures

    def _move(self, target: BreakerState) -> None:
        before = self._state
        self._state = transition_breaker(self._state, target)
        if self.on_change is not None:
            self.on_change(before, target)
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
