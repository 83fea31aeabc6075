"""Provider health: the rate limiter, the circuit breaker and :class:`GuardedModel`.

Pins: the breaker opens after N consecutive retryable failures (non-retryable ones and successes
reset the count); while open, callers *wait* in ``wait_ready()`` instead of failing; after the
cool-down exactly one probe goes through (half-open) while the others keep waiting; the probe's
success closes the breaker and releases everyone, its failure re-opens it with a longer
cool-down (capped); a cancelled probe lets another caller probe. The limiter makes callers wait
(never fail) for requests-per-minute, tokens-per-minute (an underestimate leaves a debt) and
concurrency, and a 429's ``Retry-After`` holds every caller. ``GuardedModel`` does all of this in
front of any :class:`Model`: a test double of the interface here, and the real OpenAI and
Anthropic providers against the local server. Also the shared failure classification helpers and
the driver's retry delays (:class:`RetryPolicy`: exponential backoff with jitter, ``Retry-After``
waited out exactly).

Time is a :class:`VirtualClock` the test advances, so cool-downs and refills cost no real time;
a test waits for callers to be parked on the clock (observable) before advancing it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from datetime import UTC, datetime
from typing import TypeVar

import pytest
from providers_server import ProviderServer, Respond, anthropic_text, oa_usage, openai_text

from agent import (
    FinishReason,
    InvalidTransition,
    Model,
    ModelError,
    ModelErrorKind,
    ModelRequest,
    ModelResponse,
    RetryPolicy,
    TextBlock,
    Usage,
)
from agent.models.anthropic import AnthropicModel
from agent.models.base import DeltaCallback
from agent.models.health import (
    BreakerState,
    CircuitBreaker,
    GuardedModel,
    ProviderHealth,
    RateLimiter,
    parse_retry_after,
    status_kind,
    transition_breaker,
)
from agent.models.openai import OpenAIModel
from agent.redact import redact

T = TypeVar("T")
WAIT = 10.0
REQ = ModelRequest(None, [], [], 100, prompt_bytes=400)


async def within(aw: Awaitable[T], seconds: float = WAIT) -> T:
    async with asyncio.timeout(seconds):
        return await aw


class VirtualClock:
    """A clock the test moves. ``sleep`` parks the caller until :meth:`advance` passes its deadline;
    with ``auto=True`` a sleep moves the clock itself (for throughput arithmetic)."""

    def __init__(self, *, auto: bool = False) -> None:
        self.t = 0.0
        self.auto = auto
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []
        self._parked = asyncio.Condition()

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        if self.auto:
            self.t += max(0.0, seconds)
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (self.t + seconds, fut)
        async with self._parked:
            self._sleepers.append(entry)
            self._parked.notify_all()
        try:
            await fut
        finally:
            if entry in self._sleepers:
                self._sleepers.remove(entry)

    @property
    def parked(self) -> int:
        return sum(1 for _, f in self._sleepers if not f.done())

    async def until_parked(self, n: int) -> None:
        """Wait until ``n`` callers sleep on this clock."""
        async with self._parked:
            await within(self._parked.wait_for(lambda: self.parked >= n))

    def advance(self, seconds: float) -> None:
        self.t += seconds
        for deadline, fut in list(self._sleepers):
            if deadline <= self.t + 1e-9 and not fut.done():
                fut.set_result(None)


def ok(text: str = "ok", tokens: int = 10) -> ModelResponse:
    return ModelResponse(
        content=[TextBlock(text=text)],
        finish_reason=FinishReason.END_TURN,
        usage=Usage(input_tokens=tokens - 2, output_tokens=2),
    )


def err(kind: ModelErrorKind, retry_after: float | None = None) -> ModelError:
    return ModelError(kind, f"scripted {kind}", retry_after=retry_after)


class StubModel(Model):
    """A test double of the Model interface: answers from a list; ``gate`` (if set) holds every call."""

    provider = "stub"

    def __init__(self, outcomes: list[ModelResponse | ModelError], gate: asyncio.Event | None = None) -> None:
        self.name = "m"
        self.outcomes = list(outcomes)
        self.gate = gate
        self.calls = 0
        self.active = 0
        self.peak = 0
        self._entered = asyncio.Condition()

    async def until_active(self, n: int) -> None:
        """Wait until ``n`` calls are inside the model at once."""
        async with self._entered:
            await within(self._entered.wait_for(lambda: self.active >= n))

    async def complete(self, request: ModelRequest, on_delta: DeltaCallback | None = None) -> ModelResponse:
        self.calls += 1
        self.active += 1
        self.peak = max(self.peak, self.active)
        async with self._entered:
            self._entered.notify_all()
        try:
            if self.gate is not None:
                await self.gate.wait()
            outcome = self.outcomes.pop(0)
            if isinstance(outcome, ModelError):
                raise outcome
            return outcome
        finally:
            self.active -= 1


async def fail_times(breaker: CircuitBreaker, n: int) -> None:
    for _ in range(n):
        assert await breaker.wait_ready() is False
        breaker.failure()


async def stay_blocked(tasks: list[asyncio.Task[bool]]) -> bool:
    """Whether none of ``tasks`` finishes within a short window (a negative can only be seen over a window)."""
    done, _ = await asyncio.wait(tasks, timeout=0.05)
    return not done


# -- classification helpers -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, ModelErrorKind.BAD_REQUEST),
        (401, ModelErrorKind.AUTH),
        (403, ModelErrorKind.AUTH),
        (404, ModelErrorKind.BAD_REQUEST),
        (408, ModelErrorKind.SERVER),
        (413, ModelErrorKind.BAD_REQUEST),
        (422, ModelErrorKind.BAD_REQUEST),
        (429, ModelErrorKind.RATE_LIMIT),
        (500, ModelErrorKind.SERVER),
        (502, ModelErrorKind.SERVER),
        (529, ModelErrorKind.SERVER),
    ],
)
def test_status_kinds(status: int, kind: ModelErrorKind) -> None:
    assert status_kind(status) is kind


NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after": "7"}, 7.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"retry-after": "Sun, 01 Mar 2026 12:00:30 GMT"}, 30.0),
        ({"retry-after": "Sun, 01 Mar 2026 11:59:00 GMT"}, 0.0),  # already past
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after": "soon"}, None),
        ({"retry-after": "-3"}, None),
        ({}, None),
    ],
)
def test_parse_retry_after(headers: dict[str, str], seconds: float | None) -> None:
    assert parse_retry_after(headers, now=NOW) == seconds


def test_redact_removes_the_key() -> None:
    assert redact("bad key sk-abcdef in sk-abcdef", "sk-abcdef") == "bad key [redacted] in [redacted]"
    assert redact("text", None) == "text"


# -- the driver's retry delays ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attempt", "retry_after", "expected"),
    [
        # Without Retry-After: exponential from base_delay, capped at max_delay (no jitter here).
        (1, None, 0.5),
        (2, None, 1.0),
        (3, None, 2.0),
        (6, None, 16.0),
        (7, None, 30.0),
        (40, None, 30.0),
        # A Retry-After is waited out exactly: no jitter, and not shortened to max_delay.
        (1, 7.0, 7.0),
        (5, 0.25, 0.25),
        (1, 90.0, 90.0),
        (1, 0.0, 0.0),
    ],
)
def test_retry_delay_backs_off_exponentially_and_honours_retry_after(
    attempt: int, retry_after: float | None, expected: float
) -> None:
    policy = RetryPolicy(base_delay=0.5, max_delay=30.0, jitter=0.0)
    assert policy.delay(attempt, retry_after) == expected
    # Jitter never touches a Retry-After.
    if retry_after is not None:
        assert RetryPolicy(base_delay=0.5, max_delay=30.0, jitter=1.0).delay(attempt, retry_after) == expected


@pytest.mark.parametrize(
    ("attempt", "retry_after", "retried"),
    [(1, None, True), (3, None, True), (4, None, False), (1, 300.0, True), (1, 300.5, False), (4, 1.0, False)],
)
def test_retries_stop_at_max_attempts_or_a_retry_after_past_the_cap(
    attempt: int, retry_after: float | None, retried: bool
) -> None:
    assert RetryPolicy(max_attempts=4, max_retry_after=300.0).retries(attempt, retry_after) is retried


@pytest.mark.parametrize("attempt", [1, 3, 8])
def test_retry_delay_jitter_spreads_within_its_bounds(attempt: int) -> None:
    policy = RetryPolicy(base_delay=0.5, max_delay=30.0, jitter=0.2)
    raw = min(30.0, 0.5 * 2 ** (attempt - 1))
    delays = [policy.delay(attempt, None) for _ in range(2000)]
    assert all(raw * 0.8 <= d <= raw * 1.2 for d in delays)
    # Spread over the whole band, both sides of the raw delay (sessions retrying together drift apart).
    assert min(delays) < raw * 0.85 and max(delays) > raw * 1.15
    assert len(set(delays)) > 1000


# -- the circuit breaker ----------------------------------------------------------------------------


def test_breaker_transitions() -> None:
    assert transition_breaker(BreakerState.CLOSED, BreakerState.OPEN) is BreakerState.OPEN
    assert transition_breaker(BreakerState.OPEN, BreakerState.HALF_OPEN) is BreakerState.HALF_OPEN
    assert transition_breaker(BreakerState.HALF_OPEN, BreakerState.CLOSED) is BreakerState.CLOSED
    assert transition_breaker(BreakerState.HALF_OPEN, BreakerState.OPEN) is BreakerState.OPEN
    with pytest.raises(InvalidTransition):
        transition_breaker(BreakerState.CLOSED, BreakerState.HALF_OPEN)
    with pytest.raises(InvalidTransition):
        transition_breaker(BreakerState.OPEN, BreakerState.OPEN)


async def test_breaker_opens_after_consecutive_retryable_failures_only() -> None:
    breaker = CircuitBreaker(failure_threshold=3, cooldown=10, clock=VirtualClock())
    await fail_times(breaker, 2)
    breaker.success()  # a success resets the count
    await fail_times(breaker, 2)
    assert breaker.state is BreakerState.CLOSED
    assert breaker.consecutive_failures == 2
    breaker.failure()
    assert breaker.state is BreakerState.OPEN
    assert breaker.snapshot()["retryIn"] == 10


async def test_while_open_callers_wait_then_one_probe_goes_through() -> None:
    clock = VirtualClock()
    breaker = CircuitBreaker(failure_threshold=2, cooldown=10, clock=clock)
    await fail_times(breaker, 2)
    waiters = [asyncio.create_task(breaker.wait_ready()) for _ in range(3)]
    await clock.until_parked(3)  # all three wait on the cool-down; none failed
    assert not any(t.done() for t in waiters)
    assert breaker.snapshot()["waiting"] == 3

    clock.advance(9)
    assert await stay_blocked(waiters)
    clock.advance(1)
    first = await within(asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED))
    [probe] = first[0]
    assert probe.result() is True
    assert breaker.state is BreakerState.HALF_OPEN
    others = [t for t in waiters if t is not probe]
    assert await stay_blocked(others)  # the others wait for the probe's outcome

    breaker.success(probe=True)
    assert await within(asyncio.gather(*others)) == [False, False]
    assert breaker.state is BreakerState.CLOSED
    assert breaker.consecutive_failures == 0


async def test_a_failed_probe_reopens_with_a_longer_capped_cooldown() -> None:
    clock = VirtualClock()
    breaker = CircuitBreaker(failure_threshold=1, cooldown=10, max_cooldown=25, clock=clock)
    await fail_times(breaker, 1)
    cooldowns = []
    for _ in range(3):
        cooldowns.append(breaker.snapshot()["cooldown"])
        probe = asyncio.create_task(breaker.wait_ready())
        await clock.until_parked(1)
        clock.advance(breaker.snapshot()["cooldown"])
        assert await within(probe) is True
        breaker.failure(probe=True)
        assert breaker.state is BreakerState.OPEN
    assert cooldowns == [10, 20, 25]
    assert breaker.snapshot()["trips"] == 4

    probe = asyncio.create_task(breaker.wait_ready())
    await clock.until_parked(1)
    clock.advance(25)
    assert await within(probe) is True
    breaker.success(probe=True)
    assert breaker.snapshot()["cooldown"] == 10  # a success resets the growth


async def test_a_retry_after_longer_than_the_cooldown_keeps_the_breaker_open_longer() -> None:
    breaker = CircuitBreaker(failure_threshold=1, cooldown=5, clock=VirtualClock())
    await breaker.wait_ready()
    breaker.failure(retry_after=40)
    assert breaker.snapshot()["retryIn"] == 40


async def test_an_abandoned_probe_lets_another_caller_probe() -> None:
    clock = VirtualClock()
    breaker = CircuitBreaker(failure_threshold=1, cooldown=1, clock=clock)
    await fail_times(breaker, 1)
    clock.advance(1)
    assert await breaker.wait_ready() is True
    second = asyncio.create_task(breaker.wait_ready())
    assert await stay_blocked([second])
    breaker.abandon(probe=True)
    assert await within(second) is True


# -- the rate limiter -------------------------------------------------------------------------------


async def test_requests_per_minute_make_callers_wait_not_fail() -> None:
    clock = VirtualClock(auto=True)
    limiter = RateLimiter(requests_per_minute=2, clock=clock)
    starts = []
    for _ in range(5):
        async with limiter.slot():
            starts.append(clock.now())
    # a burst of 2, then one every 30 s
    assert starts == [0, 0, 30, 60, 90]


async def test_tokens_per_minute_with_a_debt_for_underestimates() -> None:
    clock = VirtualClock(auto=True)
    limiter = RateLimiter(tokens_per_minute=600, clock=clock)  # 10 tokens a second
    async with limiter.slot(500) as lease:
        lease.settle(800)  # used 300 more than estimated: the bucket is 200 in debt
    assert limiter.snapshot()["tokensAvailable"] == -200
    async with limiter.slot(100):
        pass
    assert clock.now() == pytest.approx(30.0)  # waited for 300 tokens at 10/s
    async with limiter.slot(10_000) as lease:  # more than a minute's worth: clamped, never stuck
        assert lease.tokens == 600
        lease.settle(0)


async def test_concurrency_is_limited_and_waiters_are_counted() -> None:
    gate = asyncio.Event()
    inner = StubModel([ok() for _ in range(5)], gate=gate)
    health = ProviderHealth("stub", max_concurrent_calls=2)
    guarded = GuardedModel(inner, health)
    tasks = [asyncio.create_task(guarded.complete(REQ)) for _ in range(5)]
    await inner.until_active(2)  # two calls get in ...
    assert health.limiter.snapshot()["waiting"] == 3  # ... the other three wait for a slot
    assert health.limiter.snapshot()["inFlight"] == 2
    gate.set()
    results = await within(asyncio.gather(*tasks))
    assert len(results) == 5
    assert inner.peak == 2


async def test_a_retry_after_holds_every_caller() -> None:
    clock = VirtualClock()
    inner = StubModel([err(ModelErrorKind.RATE_LIMIT, retry_after=20), ok(), ok()])
    health = ProviderHealth("stub", failure_threshold=5, clock=clock)
    guarded = GuardedModel(inner, health)
    with pytest.raises(ModelError):
        await guarded.complete(REQ)
    assert health.limiter.snapshot()["heldFor"] == 20
    callers = [asyncio.create_task(guarded.complete(REQ)) for _ in range(2)]
    await clock.until_parked(1)  # the first waits on the hold (the second queues behind it)
    assert inner.calls == 1
    clock.advance(20)
    assert len(await within(asyncio.gather(*callers))) == 2
    assert inner.calls == 3


# -- GuardedModel -----------------------------------------------------------------------------------


async def test_guarded_model_keeps_the_inner_identity() -> None:
    inner = StubModel([])
    guarded = GuardedModel(inner, ProviderHealth("stub"))
    assert guarded.spec == "stub:m"
    assert (guarded.max_tokens, guarded.context_window, guarded.price) == (
        inner.max_tokens,
        inner.context_window,
        inner.price,
    )


async def test_guarded_model_opens_the_breaker_and_makes_callers_wait_for_the_probe() -> None:
    clock = VirtualClock()
    inner = StubModel(
        [
            err(ModelErrorKind.SERVER),
            err(ModelErrorKind.TIMEOUT),
            err(ModelErrorKind.SERVER),
            ok("probe ok"),
            ok("after"),
        ]
    )
    health = ProviderHealth("stub", failure_threshold=2, cooldown=30, clock=clock)
    guarded = GuardedModel(inner, health)
    for kind in (ModelErrorKind.SERVER, ModelErrorKind.TIMEOUT):
        with pytest.raises(ModelError) as info:
            await guarded.complete(REQ)
        assert info.value.kind is kind
    assert health.state == "open"

    callers = [asyncio.create_task(guarded.complete(REQ)) for _ in range(3)]
    await clock.until_parked(3)
    assert inner.calls == 2  # nobody reached the provider while open
    clock.advance(30)
    # One probe goes out and fails: the breaker re-opens for twice as long; nobody else went out.
    done, pending = await within(asyncio.wait(callers, return_when=asyncio.FIRST_COMPLETED))
    [failed_probe] = done
    with pytest.raises(ModelError):
        failed_probe.result()
    assert inner.calls == 3
    assert health.state == "open"
    assert health.snapshot()["breaker"]["cooldown"] == 60

    await clock.until_parked(2)
    clock.advance(60)
    answers = await within(asyncio.gather(*pending))
    assert sorted(a.content[0].text for a in answers if isinstance(a.content[0], TextBlock)) == ["after", "probe ok"]
    assert health.state == "closed"
    snap = health.snapshot()
    assert (snap["calls"], snap["failures"], snap["provider"]) == (5, 3, "stub")
    assert snap["lastError"] == "server: scripted server"


async def test_non_retryable_failures_do_not_open_the_breaker() -> None:
    inner = StubModel([err(ModelErrorKind.AUTH), err(ModelErrorKind.BAD_REQUEST), err(ModelErrorKind.MALFORMED)])
    health = ProviderHealth("stub", failure_threshold=1, clock=VirtualClock())
    guarded = GuardedModel(inner, health)
    for _ in range(3):
        with pytest.raises(ModelError):
            await guarded.complete(REQ)
    assert health.state == "closed"


async def test_a_cancelled_call_releases_its_slot_and_its_probe() -> None:
    clock = VirtualClock()
    gate = asyncio.Event()
    inner = StubModel([err(ModelErrorKind.SERVER), ok()])
    health = ProviderHealth("stub", failure_threshold=1, cooldown=5, max_concurrent_calls=1, clock=clock)
    guarded = GuardedModel(inner, health)
    with pytest.raises(ModelError):
        await guarded.complete(REQ)
    clock.advance(5)
    inner.gate = gate  # the probe will hang until cancelled
    probe = asyncio.create_task(guarded.complete(REQ))
    await inner.until_active(1)
    assert health.snapshot()["breaker"]["probeInFlight"] is True
    probe.cancel()
    with pytest.raises(asyncio.CancelledError):
        await probe
    assert health.snapshot()["breaker"]["probeInFlight"] is False
    assert health.limiter.snapshot()["inFlight"] == 0
    gate.set()
    assert (await within(guarded.complete(REQ))).content == [TextBlock(text="ok")]
    assert health.state == "closed"


# -- GuardedModel with the real providers against the local server -------------------------------------


@pytest.fixture
async def server() -> AsyncIterator[ProviderServer]:
    async with ProviderServer() as srv:
        yield srv
        srv.assert_done()


async def test_guarded_openai_provider_trips_waits_and_recovers(server: ProviderServer) -> None:
    server.add(
        Respond.json(500, {"error": {"message": "boom"}}),
        Respond.json(503, {"error": {"message": "unavailable"}}),
        Respond.stream(openai_text(["back"], usage=oa_usage(10, 1))),
    )
    inner = OpenAIModel("gpt-test", base_url=server.url + "/v1", api_key="sk-x-1234", timeout=5)
    # A real clock and a short cool-down: the wait is the breaker's, not a sleep of the test.
    health = ProviderHealth("openai", failure_threshold=2, cooldown=0.05)
    guarded = GuardedModel(inner, health)
    try:
        for _ in range(2):
            with pytest.raises(ModelError) as info:
                await guarded.complete(REQ)
            assert info.value.kind is ModelErrorKind.SERVER
        assert health.state == "open"
        answer = await within(guarded.complete(REQ))
    finally:
        await guarded.aclose()
    assert answer.content == [TextBlock(text="back")]
    assert health.state == "closed"
    assert len(server.requests) == 3


async def test_guarded_anthropic_provider_shares_a_retry_after(server: ProviderServer) -> None:
    clock = VirtualClock()
    server.add(
        Respond.json(
            429, {"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}}, {"retry-after": "15"}
        ),
        Respond.stream(anthropic_text(["fine"])),
    )
    inner = AnthropicModel("claude-test", base_url=server.url, api_key="sk-ant-x-1234", timeout=5)
    health = ProviderHealth("anthropic", tokens_per_minute=100_000, clock=clock)
    guarded = GuardedModel(inner, health)
    try:
        with pytest.raises(ModelError) as info:
            await guarded.complete(REQ)
        assert (info.value.kind, info.value.retry_after) == (ModelErrorKind.RATE_LIMIT, 15.0)
        caller = asyncio.create_task(guarded.complete(REQ))
        await clock.until_parked(1)
        assert len(server.requests) == 1  # held: the second request has not gone out
        clock.advance(15)
        answer = await within(caller)
    finally:
        await guarded.aclose()
    assert answer.content == [TextBlock(text="fine")]
    # The estimate (prompt bytes / 4 + max_tokens) was settled to the real usage (10 in + 5 out).
    assert health.limiter.snapshot()["tokensAvailable"] == 100_000 - 15
