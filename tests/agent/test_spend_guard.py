"""The spend guard binds *before* a model call.

Pins: a call that would pass a limit (tokens, cost, deadline) is not made and the turn ends
``budget`` naming the budget; a reservation is the prompt's upper bound plus ``max_tokens`` and
settles to the reported usage; two sessions sharing one guard cannot both pass the last of it;
failed attempts that are retried are charged; a reservation left open by a dead process is
charged in full when the store is reopened; with a token budget B, the total charged never
exceeds B. The estimator and :meth:`SpendGuard.check` are also tested as pure units.

Each test names its scripted model uniquely: prompt estimators are calibrated per model, so a
fresh name gives a fresh, known estimator. Every test that uses the store runs on SQLite and on
PostgreSQL (the store contract), so the same name runs twice in one process: each test starts
from no calibrated estimator at all (:func:`fresh_estimators`).
"""

from __future__ import annotations

import asyncio
import math
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from storekit import Location

from agent import (
    CallId,
    Event,
    EventType,
    Limits,
    ModelErrorKind,
    ModelRegistry,
    ModelRequest,
    Price,
    PromptEstimator,
    Refusal,
    Reply,
    Runtime,
    ScriptedModel,
    SpendGuard,
    Store,
    ToolCall,
    ToolRegistry,
    Usage,
    create_guard,
    create_session,
    enqueue,
    estimator_for,
    parse_content,
    spend,
    take_or_idle,
)
from agent.calls import reserve_call
from agent.db import Conn

#: The store contract: every test here runs on SQLite and on PostgreSQL.
pytestmark = pytest.mark.both_stores

WAIT = 30.0


@pytest.fixture(autouse=True)
def fresh_estimators(monkeypatch: pytest.MonkeyPatch) -> None:
    """No estimator calibrated by an earlier test (the estimators are process-wide, per model)."""
    monkeypatch.setattr(spend, "_estimators", {})


async def _calls(rt: Runtime) -> list[dict[str, Any]]:
    """Every ``model_calls`` row, in the order the reservations were made."""

    def run(conn: Conn) -> list[dict[str, Any]]:
        return [dict(r) for r in conn.execute("SELECT * FROM model_calls ORDER BY started_at, attempt").fetchall()]

    return await rt.store.read(run)


def _charged_tokens(row: dict[str, Any]) -> int:
    if row["state"] == "charged_in_full":
        return int(row["reserved_tokens"])
    return int(row["input_tokens"] + row["output_tokens"] + row["cache_read_tokens"] + row["cache_write_tokens"])


async def _turn_ends(rt: Runtime, session_id: str) -> list[Event]:
    return await rt.store.events_after(session_id, 0, types=[EventType.TURN_END])


async def _followup_to_idle(rt: Runtime, session_id: str, text: str) -> None:
    agent = await rt.agent(session_id)
    await agent.followup(text)
    await asyncio.wait_for(agent.when_idle(), WAIT)


# -- refusals: the call is not made ----------------------------------------------------------


async def test_call_that_would_pass_the_token_limit_is_not_made(open_runtime) -> None:
    model = ScriptedModel([], name="spend-refuse-tokens")
    async with open_runtime(model, tools=[]) as rt:
        gid = await rt.create_guard(Limits(max_tokens=100))
        sid = await rt.create_session(guard_id=gid, config={"agent": {"max_tokens": 200}})
        await _followup_to_idle(rt, sid, "hello")
        ends = await _turn_ends(rt, sid)
        rows = await _calls(rt)
        guard = await rt.guard(gid)
    assert model.call_count == 0
    assert [e.data["reason"] for e in ends] == ["budget"]
    assert "token budget" in ends[0].data["error"]
    assert ends[0].data["steps"] == 0
    assert rows == []  # no reservation row either: the refusal comes before it
    assert (guard.spent_tokens, guard.reserved_tokens) == (0, 0)


async def test_deadline_in_the_past_refuses(open_runtime) -> None:
    model = ScriptedModel([], name="spend-deadline")
    async with open_runtime(model, tools=[]) as rt:
        gid = await rt.create_guard(Limits(deadline=datetime(2000, 1, 1, tzinfo=UTC)))
        sid = await rt.create_session(guard_id=gid)
        await _followup_to_idle(rt, sid, "hello")
        ends = await _turn_ends(rt, sid)
    assert model.call_count == 0
    assert [e.data["reason"] for e in ends] == ["budget"]
    assert "deadline" in ends[0].data["error"]


async def test_cost_budget_with_a_price(open_runtime) -> None:
    price = Price(input=1000.0, output=2000.0)  # per million: 0.001 per input token, 0.002 per output token
    first = Usage(input_tokens=20, output_tokens=100)
    model = ScriptedModel([Reply.say("one", usage=first)], name="spend-cost", price=price)
    async with open_runtime(model, tools=[]) as rt:
        # One call of at most 100 output tokens may cost up to 0.2 in output alone; 0.3 lets the
        # first call through and leaves 0.08 after it, less than any further call could cost.
        gid = await rt.create_guard(Limits(max_cost=0.3))
        sid = await rt.create_session(guard_id=gid, config={"agent": {"max_tokens": 100}})
        await _followup_to_idle(rt, sid, "hi")
        assert model.call_count == 1
        await _followup_to_idle(rt, sid, "again")
        ends = await _turn_ends(rt, sid)
        rows = await _calls(rt)
        guard = await rt.guard(gid)
    model.assert_done()
    assert model.call_count == 1
    assert [e.data["reason"] for e in ends] == ["end_turn", "budget"]
    assert "cost budget" in ends[1].data["error"]
    assert len(rows) == 1
    row = rows[0]
    prompt_bytes = model.calls[0].request.prompt_bytes
    assert row["reserved_cost"] == pytest.approx(price.bound(PromptEstimator().bound(prompt_bytes), 100))
    assert row["cost"] == pytest.approx(price.cost(first)) == pytest.approx(0.22)
    assert guard.spent_cost == pytest.approx(0.22)
    assert guard.spent_cost <= 0.3


# -- reservations and settlement ---------------------------------------------------------------


async def test_reservation_is_prompt_bound_plus_max_tokens_settled_to_usage(open_runtime) -> None:
    usages = [Usage(input_tokens=30, output_tokens=7, cache_read_tokens=3), Usage(input_tokens=45, output_tokens=2)]
    replies = [Reply(tool_calls=[ToolCall("noop")], usage=usages[0]), Reply.say("done", usage=usages[1])]
    bounds: list[int] = []

    def rule(request: ModelRequest) -> Reply:
        # The estimator as it stood when the driver reserved (it calibrates only after the call).
        bounds.append(estimator_for(model.spec).bound(request.prompt_bytes))
        return replies[len(bounds) - 1]

    model = ScriptedModel(rule, name="spend-reserve")
    async with open_runtime(model) as rt:
        gid = await rt.create_guard(Limits(max_tokens=100_000))
        sid = await rt.create_session(guard_id=gid, config={"agent": {"max_tokens": 200}})
        await _followup_to_idle(rt, sid, "hello")
        rows = await _calls(rt)
        guard = await rt.guard(gid)
    assert model.call_count == 2
    assert [c.request.max_tokens for c in model.calls] == [200, 200]
    # The first call's bound is a fresh estimator's: half a token per byte plus the overhead.
    first_bytes = model.calls[0].request.prompt_bytes
    assert bounds[0] == PromptEstimator().bound(first_bytes) == math.ceil(first_bytes * 0.5) + 16
    assert [r["reserved_tokens"] for r in rows] == [b + 200 for b in bounds]
    assert [r["state"] for r in rows] == ["settled", "settled"]
    for row, usage in zip(rows, usages, strict=True):
        got = Usage(
            input_tokens=row["input_tokens"],
            output_tokens=row["output_tokens"],
            cache_read_tokens=row["cache_read_tokens"],
            cache_write_tokens=row["cache_write_tokens"],
        )
        assert got == usage
        assert row["reserved_tokens"] >= usage.total
    assert guard.spent_tokens == 40 + 47
    assert guard.reserved_tokens == 0


async def test_retried_attempts_are_charged(open_runtime) -> None:
    failed = Usage(input_tokens=50)
    ok = Usage(input_tokens=60, output_tokens=5)
    model = ScriptedModel(
        [Reply.fail(ModelErrorKind.SERVER, "overloaded", usage=failed), Reply.say("ok", usage=ok)],
        name="spend-retry",
    )
    async with open_runtime(model, tools=[]) as rt:
        gid = await rt.create_guard(Limits(max_tokens=100_000))
        sid = await rt.create_session(guard_id=gid, config={"agent": {"retry": {"base_delay": 0, "jitter": 0}}})
        await _followup_to_idle(rt, sid, "hello")
        rows = await _calls(rt)
        errors = await rt.store.events_after(sid, 0, types=[EventType.MODEL_ERROR])
        ends = await _turn_ends(rt, sid)
        guard = await rt.guard(gid)
    model.assert_done()
    assert [e.data["reason"] for e in ends] == ["end_turn"]
    assert [(r["attempt"], r["state"], r["error_class"]) for r in rows] == [
        (1, "settled", "server"),
        (2, "settled", None),
    ]
    assert [_charged_tokens(r) for r in rows] == [failed.total, ok.total]
    assert guard.spent_tokens == failed.total + ok.total == 115
    assert [(e.data["attempt"], e.data["retrying"], e.data["usage"]["input_tokens"]) for e in errors] == [(1, True, 50)]


async def test_reservation_left_open_by_a_dead_process_is_charged_in_full(db_path: Location) -> None:
    # A process that reserved and died before settling: written with the store's own transaction
    # functions and closed without settling, as a crash would leave it.
    store = await Store.open(db_path)
    try:
        gid = await store.transact(lambda tx: create_guard(tx, Limits(max_tokens=1000)))
        sid = await store.transact(lambda tx: create_session(tx, guard_id=gid, config={"agent": {"max_tokens": 400}}))
        call_id = CallId.new()

        def start_turn_and_reserve(tx: Any) -> str:
            enqueue(tx, sid, parse_content("hello"))
            turn = take_or_idle(tx, sid)
            assert turn is not None
            reserve_call(
                tx,
                call_id=call_id,
                session_id=sid,
                turn_id=turn.turn_id,
                guard_id=gid,
                provider="scripted",
                model="spend-crash",
                attempt=1,
                tokens=700,
                cost=0.0,
            )
            return turn.turn_id

        turn_id = await store.transact(start_turn_and_reserve)
    finally:
        await store.close()

    model = ScriptedModel([], name="spend-crash")
    registry = ModelRegistry()
    registry.add(model)
    registry.default = model.spec
    async with Runtime.open(db_path, models=registry, tools=lambda row: ToolRegistry()) as rt:
        guard = await rt.guard(gid)
        assert guard.spent_tokens == 700
        rows = await _calls(rt)
        ends = await _turn_ends(rt, sid)
        charged = await rt.store.events_after(sid, 0, types=[EventType.MODEL_CHARGED])
        # The charged reservation binds: 300 left, and a call may take 400 plus its prompt.
        await _followup_to_idle(rt, sid, "more")
        ends_after = await _turn_ends(rt, sid)
    assert model.call_count == 0
    assert [(r["id"], r["state"], r["reserved_tokens"]) for r in rows] == [(call_id, "charged_in_full", 700)]
    assert [(e.data["turnId"], e.data["reason"]) for e in ends] == [(turn_id, "interrupted")]
    assert [(e.data["callIds"], e.data["tokens"]) for e in charged] == [([call_id], 700)]
    assert [e.data["reason"] for e in ends_after] == ["interrupted", "budget"]
    assert "300 left" in ends_after[1].data["error"]


# -- shared guards -------------------------------------------------------------------------------


async def test_two_sessions_sharing_a_guard_cannot_both_pass_the_last_of_it(open_runtime) -> None:
    released = asyncio.Event()

    async def rule(request: ModelRequest) -> Reply:
        if model.call_count > 1:
            released.set()  # the guard let a second call through; fail below, without hanging
            return Reply.say("second call")
        # Hold the first call open (its reservation unsettled) until the other turn has ended.
        await asyncio.wait_for(released.wait(), WAIT)
        return Reply.say("the only call", usage=Usage(input_tokens=5, output_tokens=5))

    def on_event(event: Event) -> None:
        if event.type == EventType.TURN_END and event.data["reason"] == "budget":
            released.set()

    model = ScriptedModel(rule, name="spend-shared")
    async with open_runtime(model, tools=[]) as rt:
        rt.store.hub.add_listener(on_event)
        # Each call reserves its prompt bound plus 1000; 1500 holds one reservation, never two.
        gid = await rt.create_guard(Limits(max_tokens=1500))
        config = {"agent": {"max_tokens": 1000}}
        sids = [await rt.create_session(guard_id=gid, config=config) for _ in range(2)]
        agents = [await rt.agent(s) for s in sids]
        await asyncio.gather(*(a.followup(f"go {i}") for i, a in enumerate(agents)))
        await asyncio.wait_for(asyncio.gather(*(a.when_idle() for a in agents)), WAIT)
        ends = [await _turn_ends(rt, s) for s in sids]
        rows = await _calls(rt)
        guard = await rt.guard(gid)
    assert model.call_count == 1
    reasons = sorted(e[0].data["reason"] for e in ends)
    assert reasons == ["budget", "end_turn"]
    refused = next(e[0] for e in ends if e[0].data["reason"] == "budget")
    assert "token budget" in refused.data["error"]
    assert len(rows) == 1 and rows[0]["state"] == "settled"
    assert guard.spent_tokens == 10 and guard.reserved_tokens == 0


async def test_total_charged_never_exceeds_the_token_budget(open_runtime) -> None:
    budget = 6000

    def rule(request: ModelRequest) -> Reply:
        # As costly as the estimator allows: half a token per prompt byte, every output token used.
        usage = Usage(input_tokens=request.prompt_bytes // 2, output_tokens=request.max_tokens)
        if model.call_count % 3:
            return Reply(tool_calls=[ToolCall("noop")], usage=usage)
        return Reply.say("step done", usage=usage)

    model = ScriptedModel(rule, name="spend-overshoot")
    async with open_runtime(model) as rt:
        gid = await rt.create_guard(Limits(max_tokens=budget))
        sid = await rt.create_session(guard_id=gid, config={"agent": {"max_tokens": 300}})
        reasons: list[str] = []
        for i in range(50):
            await _followup_to_idle(rt, sid, f"work item {i}")
            reasons = [e.data["reason"] for e in await _turn_ends(rt, sid)]
            if reasons[-1] == "budget":
                break
        rows = await _calls(rt)
        guard = await rt.guard(gid)
    assert reasons[-1] == "budget"
    assert model.call_count == len(rows) >= 5
    total = sum(_charged_tokens(r) for r in rows)
    assert total == guard.spent_tokens
    assert total <= budget
    # Every settled call stayed within what it reserved.
    assert all(_charged_tokens(r) <= r["reserved_tokens"] for r in rows)


# -- pure units ------------------------------------------------------------------------------------


def test_estimator_bound_covers_every_observed_prompt() -> None:
    rng = random.Random(20240611)
    est = PromptEstimator()
    seen: list[tuple[int, int]] = []
    for _ in range(300):
        size = rng.randint(1, 200_000)
        tokens = max(1, int(size * rng.uniform(0.05, 0.6)))
        est.observe(size, tokens)
        seen.append((size, tokens))
        assert est.bound(size) >= tokens
    assert all(est.bound(size) >= tokens for size, tokens in seen)
    assert est.ratio <= 1.0


def test_estimator_never_assumes_more_than_one_token_per_byte() -> None:
    est = PromptEstimator()
    assert est.bound(1000) == 500 + PromptEstimator.OVERHEAD_TOKENS
    est.observe(100, 1000)  # a report above one token per byte is capped
    assert est.ratio == 1.0
    for size in (0, 1, 17, 1000, 10**6):
        assert est.bound(size) <= size + PromptEstimator.OVERHEAD_TOKENS
    assert est.bound(1000) == 1000 + PromptEstimator.OVERHEAD_TOKENS


def test_estimator_calibrates_to_the_highest_ratio_seen_with_a_margin() -> None:
    est = PromptEstimator()
    est.observe(0, 10)
    est.observe(10, 0)
    assert est.ratio == PromptEstimator.INITIAL_RATIO  # nothing to learn from empty reports
    est.observe(1000, 200)
    assert est.ratio == pytest.approx(0.2 * PromptEstimator.MARGIN)
    est.observe(1000, 100)  # a lower ratio does not lower the bound
    assert est.ratio == pytest.approx(0.2 * PromptEstimator.MARGIN)
    est.observe(1000, 320)
    assert est.ratio == pytest.approx(0.32 * PromptEstimator.MARGIN)


NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("guard", "tokens", "cost", "refused"),
    [
        (SpendGuard(id=None), 10**9, None, None),
        (SpendGuard(id=None, limits=Limits(max_tokens=100), spent_tokens=40), 60, None, None),
        (SpendGuard(id=None, limits=Limits(max_tokens=100), spent_tokens=40), 61, None, "token budget"),
        (SpendGuard(id=None, limits=Limits(max_tokens=100), spent_tokens=100), 0, None, None),
        (SpendGuard(id=None, limits=Limits(max_tokens=100), spent_tokens=120), 0, None, "token budget"),
        (SpendGuard(id=None, limits=Limits(max_cost=1.0), spent_cost=0.5), 10, 0.5, None),
        (SpendGuard(id=None, limits=Limits(max_cost=1.0), spent_cost=0.5), 10, 0.51, "cost budget"),
        (SpendGuard(id=None, limits=Limits(max_cost=1.0)), 10, None, "has no price"),
        (SpendGuard(id=None, limits=Limits(deadline=NOW)), 1, None, "deadline"),
        (SpendGuard(id=None, limits=Limits(deadline=NOW + timedelta(seconds=1))), 1, None, None),
        (
            SpendGuard(id=None, limits=Limits(max_wall_seconds=60), wall_started_at=NOW - timedelta(seconds=60)),
            1,
            None,
            "wall time",
        ),
        (
            SpendGuard(id=None, limits=Limits(max_wall_seconds=60), wall_started_at=NOW - timedelta(seconds=59)),
            1,
            None,
            None,
        ),
        (SpendGuard(id=None, limits=Limits(max_wall_seconds=60)), 1, None, None),
    ],
)
def test_spend_guard_check(guard: SpendGuard, tokens: int, cost: float | None, refused: str | None) -> None:
    got = guard.check(tokens, cost, now=NOW)
    if refused is None:
        assert got is None
    else:
        assert isinstance(got, Refusal)
        assert refused in got.reason


@pytest.mark.parametrize(
    ("limits", "started", "min_left", "refused"),
    [
        # The deadline: a call needs ``min_left`` seconds before it.
        (Limits(deadline=NOW + timedelta(seconds=10)), None, 5.0, None),
        (Limits(deadline=NOW + timedelta(seconds=5)), None, 5.0, None),
        (Limits(deadline=NOW + timedelta(seconds=4.9)), None, 5.0, "4.9s away, less than the 5s"),
        (Limits(deadline=NOW + timedelta(seconds=0.1)), None, 0.0, None),
        (Limits(deadline=NOW), None, 0.0, "has passed"),
        # The guard's own wall-time limit: the same, counted from its start.
        (Limits(max_wall_seconds=60), NOW - timedelta(seconds=50), 5.0, None),
        (Limits(max_wall_seconds=60), NOW - timedelta(seconds=56), 5.0, "less than the 5s"),
        (Limits(max_wall_seconds=60), NOW - timedelta(seconds=56), 0.0, None),
        # No time limit at all: nothing to keep.
        (Limits(), None, 3600.0, None),
    ],
)
def test_no_call_starts_with_less_than_the_minimum_left(
    limits: Limits, started: datetime | None, min_left: float, refused: str | None
) -> None:
    guard = SpendGuard(id=None, limits=limits, wall_started_at=started)
    got = guard.check(1, None, now=NOW, min_left=min_left)
    if refused is None:
        assert got is None
    else:
        assert isinstance(got, Refusal) and refused in got.reason, got


def test_time_left_is_the_earlier_of_the_deadline_and_the_wall_time() -> None:
    guard = SpendGuard(
        id=None,
        limits=Limits(deadline=NOW + timedelta(seconds=30), max_wall_seconds=60),
        wall_started_at=NOW - timedelta(seconds=40),
    )
    assert guard.ends_at() == NOW + timedelta(seconds=20)
    assert guard.time_left(NOW) == 20.0
    assert SpendGuard(id=None).time_left(NOW) is None


async def test_a_call_in_flight_is_cancelled_when_the_deadline_passes(open_runtime) -> None:
    # A 30 s call with 0.3 s left: cancelled at the deadline, charged in full, the turn ends budget.
    model = ScriptedModel([Reply.say("never seen", delay=30.0)], name="spend-cut-in-flight")
    async with open_runtime(model, tools=[]) as rt:
        deadline = datetime.now(UTC) + timedelta(seconds=0.3)
        gid = await rt.create_guard(Limits(deadline=deadline, max_tokens=10_000_000))
        sid = await rt.create_session(guard_id=gid, config={"agent": {"min_call_seconds": 0.0}})
        await _followup_to_idle(rt, sid, "hello")
        idle_at = datetime.now(UTC)
        ends = await _turn_ends(rt, sid)
        rows = await _calls(rt)
        charged = await rt.store.events_after(sid, 0, types=[EventType.MODEL_CHARGED])
        guard = await rt.guard(gid)
    assert model.call_count == 1
    [end] = ends
    assert end.data["reason"] == "budget" and end.data["error"].startswith("deadline")
    assert "passed during the model call" in end.data["error"]
    [row] = rows
    assert (row["state"], row["error_class"]) == ("charged_in_full", "deadline")
    [event] = charged
    assert event.data["callIds"] == [row["id"]] and event.data["tokens"] == row["reserved_tokens"]
    assert guard.spent_tokens == row["reserved_tokens"] and guard.reserved_tokens == 0
    # The overshoot is the cancellation latency (plus committing the turn's end).
    overshoot = (idle_at - deadline).total_seconds()
    print(f"deadline overshoot to idle: {overshoot * 1000:.1f} ms")
    assert 0 <= overshoot < 0.5


async def test_a_call_is_not_started_with_less_than_the_minimum_left(open_runtime) -> None:
    model = ScriptedModel([], name="spend-min-left")
    async with open_runtime(model, tools=[]) as rt:
        gid = await rt.create_guard(Limits(deadline=datetime.now(UTC) + timedelta(seconds=2)))
        sid = await rt.create_session(guard_id=gid)  # the default minimum: 5 s
        await _followup_to_idle(rt, sid, "hello")
        ends = await _turn_ends(rt, sid)
        rows = await _calls(rt)
    assert model.call_count == 0 and rows == []
    [end] = ends
    assert end.data["reason"] == "budget"
    assert "less than the 5s a model call needs to start" in end.data["error"]


async def test_a_retry_backoff_never_sleeps_past_the_deadline(open_runtime) -> None:
    # A server error asks for a 60 s wait; the deadline is 0.4 s away: the turn ends budget then.
    model = ScriptedModel([Reply.fail(ModelErrorKind.SERVER, "busy", retry_after=60.0)], name="spend-cut-backoff")
    async with open_runtime(model, tools=[]) as rt:
        deadline = datetime.now(UTC) + timedelta(seconds=0.4)
        gid = await rt.create_guard(Limits(deadline=deadline))
        sid = await rt.create_session(guard_id=gid, config={"agent": {"min_call_seconds": 0.0}})
        await _followup_to_idle(rt, sid, "hello")
        idle_at = datetime.now(UTC)
        ends = await _turn_ends(rt, sid)
    model.assert_done()
    [end] = ends
    assert end.data["reason"] == "budget" and "has passed" in end.data["error"]
    # Not the 60 s the server asked for: the backoff was cut at the deadline (the bound is only far
    # inside that minute, not a speed check a loaded machine could fail).
    assert (idle_at - deadline).total_seconds() < 30


def test_spend_guard_reservations_hold_until_settled() -> None:
    guard = SpendGuard(id=None, limits=Limits(max_tokens=100))
    held = guard.reserve("a", 60, None)
    assert not isinstance(held, Refusal)
    assert guard.reserved_tokens == 60 and guard.remaining_tokens() == 40
    assert isinstance(guard.reserve("b", 41, None), Refusal)  # held tokens count against the budget
    assert guard.reserved_tokens == 60  # a refusal holds nothing
    guard.settle("a", 25, 0.0)
    assert (guard.spent_tokens, guard.reserved_tokens) == (25, 0)
    guard.settle("a", 25, 0.0)  # settling twice charges once
    assert guard.spent_tokens == 25
    assert not isinstance(guard.reserve("c", 70, None), Refusal)
    guard.settle_in_full("c")
    assert (guard.spent_tokens, guard.reserved_tokens, guard.remaining_tokens()) == (95, 0, 5)
