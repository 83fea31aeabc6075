"""The spend guard: budgets that bind *before* a model call.

Before every model attempt (retries included) the driver asks the guard to reserve an upper bound
of what the call can cost: the prompt's size, estimated from its bytes, plus the call's
``max_tokens``, and the price of both where a price is known. If that exceeds what is left of the
token or cost budget, or the deadline or wall-time limit has passed, the call is not made. The
check and the in-memory reservation happen without an ``await`` in between, so two sessions that
share one guard cannot both pass the last of it. A reservation is durable (a ``model_calls`` row)
before the call; it settles to the reported usage, and one left open by a crash is charged in full.

Time binds before the call too. A call does not start with less than ``min_left`` seconds (the
driver's ``min_call_seconds``) before the deadline or the end of the wall time, and a call in
flight when the time runs out is cancelled by the driver (see :meth:`SpendGuard.time_left`): a
provider's per-request timeout bounds each connect and read, not the call, so it cannot be the
measure. The overshoot is the cancellation latency, a few milliseconds.

The prompt bound needs no tokenizer: byte-level tokenizers never produce more tokens than bytes,
and real ratios are far lower, so the estimator starts at a cautious ratio and calibrates to the
highest ratio it has seen (with a margin), never above one token per byte.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field

from agent.ids import GuardId


class Usage(BaseModel):
    """Token usage reported for one model call."""

    model_config = ConfigDict(frozen=True)

    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    cache_read_tokens: int = Field(default=0, ge=0)
    cache_write_tokens: int = Field(default=0, ge=0)

    @property
    def total(self) -> int:
        """Every token processed (input, output and cache reads and writes)."""
        return self.input_tokens + self.output_tokens + self.cache_read_tokens + self.cache_write_tokens

    @property
    def prompt_tokens(self) -> int:
        """Tokens of the prompt, cached or not."""
        return self.input_tokens + self.cache_read_tokens + self.cache_write_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
        )


class Price(BaseModel):
    """Prices in currency units per million tokens."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: float = Field(default=0.0, ge=0)
    output: float = Field(default=0.0, ge=0)
    cache_read: float | None = Field(default=None, ge=0)
    cache_write: float | None = Field(default=None, ge=0)

    def cost(self, usage: Usage) -> float:
        """What ``usage`` costs (cache prices default to the input price)."""
        cache_read = self.input if self.cache_read is None else self.cache_read
        cache_write = self.input if self.cache_write is None else self.cache_write
        return (
            usage.input_tokens * self.input
            + usage.output_tokens * self.output
            + usage.cache_read_tokens * cache_read
            + usage.cache_write_tokens * cache_write
        ) / 1_000_000

    def bound(self, prompt_tokens: int, max_output: int) -> float:
        """An upper bound of a call's cost (every prompt token at the dearest input price)."""
        dearest = max(self.input, self.cache_read or 0.0, self.cache_write or 0.0)
        return (prompt_tokens * dearest + max_output * self.output) / 1_000_000


class Limits(BaseModel):
    """What a guard allows in all. ``None`` means no limit of that kind."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_tokens: int | None = Field(default=None, ge=0)
    max_cost: float | None = Field(default=None, ge=0)
    deadline: datetime | None = None
    max_wall_seconds: float | None = Field(default=None, ge=0)


@dataclass
class Reservation:
    """An amount held for one model call until it settles."""

    call_id: str
    tokens: int
    cost: float


@dataclass
class Refusal:
    """Why the guard refused a call."""

    reason: str


class PromptEstimator:
    """Bytes → prompt tokens, calibrated per model by the calls that reported usage.

    Two figures, for two uses. :meth:`bound` is an upper bound (the highest ratio seen, with a
    margin): what the spend guard reserves. :meth:`likely` is the expected size (a running ratio of
    the reported calls, recent ones weighing most): what is charged when a call reported no usage,
    and what decides whether a prompt fits the window (a bound would refuse prompts that fit).
    """

    INITIAL_RATIO = 0.5
    MARGIN = 1.25
    OVERHEAD_TOKENS = 16
    #: Tokens per byte expected before any call reported usage (about 3.3 bytes a token: JSON, code
    #: and English text run 3-4 bytes a token on the common tokenizers).
    TYPICAL_RATIO = 0.3
    #: How much of the running ratio's past each new observation keeps (recent calls weigh most).
    DECAY = 0.8

    def __init__(self) -> None:
        self.ratio = self.INITIAL_RATIO
        self._seen: float | None = None
        self._bytes = 0.0
        self._tokens = 0.0

    @property
    def typical_ratio(self) -> float:
        """The running ratio of tokens to bytes of the reported calls (:data:`TYPICAL_RATIO` before any)."""
        return self._tokens / self._bytes if self._bytes > 0 else self.TYPICAL_RATIO

    def bound(self, prompt_bytes: int) -> int:
        """An upper bound of the tokens a prompt of ``prompt_bytes`` bytes can take."""
        return math.ceil(prompt_bytes * self.ratio) + self.OVERHEAD_TOKENS

    def likely(self, size_bytes: int) -> int:
        """The tokens ``size_bytes`` bytes likely take, by the running ratio (never above :meth:`bound`)."""
        return min(math.ceil(size_bytes * self.typical_ratio) + self.OVERHEAD_TOKENS, self.bound(size_bytes))

    def observe(self, prompt_bytes: int, prompt_tokens: int) -> None:
        """Calibrate from one reported call."""
        if prompt_bytes <= 0 or prompt_tokens <= 0:
            return
        seen = prompt_tokens / prompt_bytes
        self._seen = seen if self._seen is None else max(self._seen, seen)
        self.ratio = min(1.0, self._seen * self.MARGIN)
        self._bytes = self._bytes * self.DECAY + prompt_bytes
        self._tokens = self._tokens * self.DECAY + prompt_tokens


_estimators: dict[str, PromptEstimator] = {}


def estimator_for(model_key: str) -> PromptEstimator:
    """The shared estimator of one model (calibration is per model)."""
    est = _estimators.get(model_key)
    if est is None:
        est = _estimators[model_key] = PromptEstimator()
    return est


@dataclass
class SpendGuard:
    """A budget shared by one or more sessions. In-memory view of durable ``model_calls`` rows."""

    id: GuardId | None
    limits: Limits = field(default_factory=Limits)
    spent_tokens: int = 0
    spent_cost: float = 0.0
    wall_started_at: datetime | None = None
    _reserved: dict[str, Reservation] = field(default_factory=dict)

    @property
    def reserved_tokens(self) -> int:
        """Tokens held by calls in flight."""
        return sum(r.tokens for r in self._reserved.values())

    @property
    def reserved_cost(self) -> float:
        """Cost held by calls in flight."""
        return sum(r.cost for r in self._reserved.values())

    def remaining_tokens(self) -> int | None:
        """Tokens left after what is spent and reserved (``None``: unlimited)."""
        if self.limits.max_tokens is None:
            return None
        return self.limits.max_tokens - self.spent_tokens - self.reserved_tokens

    def remaining_cost(self) -> float | None:
        """Cost left after what is spent and reserved (``None``: unlimited)."""
        if self.limits.max_cost is None:
            return None
        return self.limits.max_cost - self.spent_cost - self.reserved_cost

    def ends_at(self) -> datetime | None:
        """When the guard's time runs out: the deadline or the end of the wall time, whichever
        comes first (``None``: no time limit)."""
        lim = self.limits
        ends = [lim.deadline] if lim.deadline is not None else []
        if lim.max_wall_seconds is not None and self.wall_started_at is not None:
            ends.append(self.wall_started_at + timedelta(seconds=lim.max_wall_seconds))
        return min(ends, default=None)

    def time_left(self, now: datetime | None = None) -> float | None:
        """Seconds until :meth:`ends_at` (negative once passed; ``None``: no time limit)."""
        end = self.ends_at()
        if end is None:
            return None
        return (end - (now or datetime.now(UTC))).total_seconds()

    def check(
        self, tokens: int, cost: float | None, now: datetime | None = None, min_left: float = 0.0
    ) -> Refusal | None:
        """Why a call of this size may not be made now, or ``None`` if it may.

        ``min_left``: the seconds that must be left before the deadline or the end of the wall
        time for a call to start (a call cut off at the deadline is paid for and yields nothing).
        """
        now = now or datetime.now(UTC)
        lim = self.limits
        if lim.deadline is not None:
            to_deadline = (lim.deadline - now).total_seconds()
            if to_deadline <= 0:
                return Refusal(f"deadline {lim.deadline.isoformat()} has passed")
            if to_deadline < min_left:
                return Refusal(
                    f"deadline {lim.deadline.isoformat()} is {to_deadline:.1f}s away,"
                    f" less than the {min_left:g}s a model call needs to start"
                )
        if lim.max_wall_seconds is not None and self.wall_started_at is not None:
            used = (now - self.wall_started_at).total_seconds()
            if used >= lim.max_wall_seconds:
                return Refusal(f"wall time used {used:.0f}s of {lim.max_wall_seconds:.0f}s")
            if lim.max_wall_seconds - used < min_left:
                return Refusal(
                    f"wall time used {used:.1f}s of {lim.max_wall_seconds:g}s: less than the {min_left:g}s"
                    " a model call needs to start"
                )
        left = self.remaining_tokens()
        if left is not None and tokens > left:
            return Refusal(f"token budget: this call may take {tokens} tokens, {max(left, 0)} left")
        left_cost = self.remaining_cost()
        if left_cost is not None:
            if cost is None:
                return Refusal("cost budget set but the model has no price")
            if cost > left_cost + 1e-12:
                return Refusal(f"cost budget: this call may cost {cost:.6f}, {max(left_cost, 0):.6f} left")
        return None

    def reserve(self, call_id: str, tokens: int, cost: float | None, min_left: float = 0.0) -> Reservation | Refusal:
        """Check and hold ``tokens``/``cost`` for one call, atomically on the event loop."""
        refusal = self.check(tokens, cost, min_left=min_left)
        if refusal is not None:
            return refusal
        res = Reservation(call_id, tokens, cost or 0.0)
        self._reserved[call_id] = res
        return res

    def settle(self, call_id: str, tokens: int, cost: float) -> None:
        """Replace a reservation by what the call really spent (idempotent per call)."""
        if self._reserved.pop(call_id, None) is None:
            return
        self.spent_tokens += tokens
        self.spent_cost += cost

    def release(self, call_id: str) -> None:
        """Drop a reservation whose write was rolled back (the call was never made): nothing spent."""
        self._reserved.pop(call_id, None)

    def settle_in_full(self, call_id: str) -> None:
        """Charge a reservation as it stands (the call's real usage is unknown)."""
        res = self._reserved.pop(call_id, None)
        if res is not None:
            self.spent_tokens += res.tokens
            self.spent_cost += res.cost
