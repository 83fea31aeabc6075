"""The scheduler service on a real SQLite file: schedule rows, runs, events, missed fires at start,
the concurrency policies, APScheduler firing a 1-second interval, and the real goal engine.

``fire``, ``goal_status`` and ``cancel_goal`` are the scheduler's callbacks into the host; most
tests pass :class:`Goals`, a small goal table of our own, and one test wires the real
:class:`goals.GoalEngine` (the daemon's glue functions). Time is a fixed clock far in the future,
so APScheduler's own wall clock never finds those jobs due during a test; the one timing test
uses the real clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agent import (
    Event,
    InvalidInput,
    ModelRegistry,
    ModelRequest,
    NotFound,
    Reply,
    Runtime,
    ScriptedModel,
    Store,
    ToolRegistry,
    file_tools,
)
from daemon.schedule import (
    SCHEDULE_CHANGED,
    SCHEDULE_RUN,
    FireClaim,
    RunOutcome,
    Schedule,
    Scheduler,
    cancel_goal,
    goal_status,
)
from goals import GOAL_CHANGED, GoalEngine, GoalSpec, GoalStatus, tools_for_goal_sessions

#: Far ahead of the real clock: APScheduler sleeps through every job planned from it.
T0 = datetime(2071, 1, 1, tzinfo=UTC)
HOURLY = {"kind": "cron", "expr": "0 * * * *"}


def h(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


class FixedClock:
    """The scheduler's clock, moved by the test."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


class Goals:
    """The scheduler's three callbacks over a goal table of our own; records every call."""

    def __init__(self) -> None:
        self.fired: list[tuple[str, datetime, dict[str, Any]]] = []
        self.status: dict[str, str] = {}
        self.status_calls: list[str] = []
        self.cancelled: list[str] = []
        self.fail: Exception | None = None

    async def fire(self, schedule: Schedule, at: datetime, claim: FireClaim) -> str:
        if self.fail is not None:
            raise self.fail
        goal_id = f"goal_{len(self.fired) + 1}"
        await claim.commit(goal_id)  # the goal is "made" only once the instant is ours
        self.fired.append((schedule.id, at, dict(schedule.goal)))
        self.status[goal_id] = "active"
        return goal_id

    async def goal_status(self, goal_id: str) -> str | None:
        self.status_calls.append(goal_id)
        return self.status.get(goal_id)

    async def cancel_goal(self, goal_id: str) -> None:
        self.cancelled.append(goal_id)
        self.status[goal_id] = "cancelled"


@contextlib.asynccontextmanager
async def running(store: Store, goals: Goals, clock: Any = None) -> AsyncIterator[Scheduler]:
    kw = {"clock": clock} if clock is not None else {}
    sch = Scheduler(store, fire=goals.fire, goal_status=goals.goal_status, cancel_goal=goals.cancel_goal, **kw)
    await sch.start()
    try:
        yield sch
    finally:
        await sch.stop()


def spec(**change: Any) -> dict[str, Any]:
    return {"trigger": HOURLY, "goal": {"objective": "write the report", "budgets": {"max_rounds": 3}}} | change


async def count(store: Store, table: str) -> int:
    return int(await store.read(lambda conn: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]))


async def schedule_events(store: Store, sched: Schedule) -> list[Event]:
    return [e for e in await store.events_after(sched.session_id, 0) if e.type.startswith("schedule/")]


def outcomes(runs: list[Any]) -> list[tuple[str, str]]:
    """(scheduled instant as HH:MM, outcome) per run, oldest first."""
    return [(r.scheduled_for.strftime("%H:%M"), r.outcome.value) for r in reversed(runs)]


# -- add, list, remove, runs ---------------------------------------------------------------------


async def test_add_list_get_remove(store: Store) -> None:
    clock = FixedClock(h(10) + timedelta(minutes=7))
    async with running(store, Goals(), clock) as sch:
        added = await sch.add(spec(key="hourly-report", timezone="Europe/Berlin"))
        assert added.id.startswith("sch_") and added.key == "hourly-report"
        assert added.next_fire_at == h(11) and added.last_outcome is None and added.last_fire_at is None
        assert sch.planned() == {added.id: h(11)}

        listed = await sch.list()
        assert [s.id for s in listed] == [added.id]
        assert listed[0].next_fire_at == h(11)
        for ref in (added.id, added.id[:14], "hourly-report"):
            assert (await sch.get(ref)).id == added.id
        assert await sch.runs(added.id) == []
        view = added.public()
        assert view["nextFireAt"] == "2071-01-01T11:00:00Z" and view["trigger"] == {"kind": "cron", "expr": "0 * * * *"}
        assert view["goal"] == {"objective": "write the report", "budgets": {"max_rounds": 3}}

        session = await store.read(
            lambda conn: conn.execute("SELECT config FROM sessions WHERE id=?", (added.session_id,)).fetchone()
        )
        assert json.loads(session["config"]) == {"schedule": added.id}

        removed = await sch.remove("hourly-report")
        assert removed.id == added.id
        assert await sch.list() == [] and sch.planned() == {}
        with pytest.raises(NotFound):
            await sch.get(added.id)
        with pytest.raises(NotFound):
            await sch.remove(added.id)
    changes = [e.data for e in await schedule_events(store, added)]
    assert changes == [{"scheduleId": added.id, "change": "added"}, {"scheduleId": added.id, "change": "removed"}]


BAD = [
    (spec(trigger={"kind": "cron", "expr": "61 * * * *"}), "trigger.expr: minute field: 61 is out of range 0-59"),
    (spec(trigger={"kind": "cron", "expr": "* * *"}), "a cron expression has 5 fields"),
    (spec(trigger={"kind": "cron", "expr": "a b c d e"}), "minute field: 'a' is not a number"),
    (spec(timezone="Europe/Atlantis"), "timezone: unknown time zone 'Europe/Atlantis'"),
    (spec(trigger={"kind": "interval", "seconds": 0}), "trigger.seconds: Input should be greater than or equal to 1"),
    (spec(trigger={"kind": "interval", "seconds": "often"}), "trigger.seconds: Input should be a valid number"),
    (
        spec(trigger={"kind": "date", "at": "2070-12-31T23:00:00+00:00"}),
        "the one-shot time 2070-12-31T23:00:00+00:00 is already past",
    ),
    (spec(goal={"objective": "x", "key": "k"}), "key cannot be set in a schedule's goal template"),
]


@pytest.mark.parametrize(("raw", "message"), BAD)
async def test_bad_input_is_refused_and_writes_nothing(store: Store, raw: dict[str, Any], message: str) -> None:
    async with running(store, Goals(), FixedClock(T0)) as sch:
        with pytest.raises(InvalidInput) as exc:
            await sch.add(raw)
        assert message in str(exc.value)
        assert sch.planned() == {}
    for table in ("schedules", "schedule_runs", "sessions", "events"):
        assert await count(store, table) == 0, table


async def test_adding_again_with_the_same_key_updates(store: Store) -> None:
    clock = FixedClock(T0)
    async with running(store, Goals(), clock) as sch:
        first = await sch.add(spec(key="nightly", trigger={"kind": "cron", "expr": "0 3 * * *"}))
        second = await sch.add(
            spec(key="nightly", trigger={"kind": "cron", "expr": "0 4 * * *"}, timezone="Europe/Berlin")
        )
        assert second.id == first.id and second.session_id == first.session_id
        assert [s.id for s in await sch.list()] == [first.id]
        assert second.next_fire_at == h(3)  # 04:00 in Berlin is 03:00 UTC in winter
        assert sch.planned() == {first.id: h(3)}
        # the same declaration again (a reload): nothing changes, nothing is recorded
        third = await sch.add(
            spec(key="nightly", trigger={"kind": "cron", "expr": "0 4 * * *"}, timezone="Europe/Berlin")
        )
        assert third.updated_at == second.updated_at
        changes = [e.data["change"] for e in await schedule_events(store, first)]
        assert changes == ["added", "updated"]

        # an interval keeps its phase across a reload, and restarts it when the interval changes
        iv = await sch.add(spec(key="tidy", trigger={"kind": "interval", "seconds": 600}))
        assert iv.next_fire_at == T0 + timedelta(seconds=600)
        clock.now = T0 + timedelta(seconds=25)
        assert (await sch.add(spec(key="tidy", trigger={"kind": "interval", "seconds": 600}))).next_fire_at == (
            T0 + timedelta(seconds=600)
        )
        changed = await sch.add(spec(key="tidy", trigger={"kind": "interval", "seconds": 900}))
        assert changed.id == iv.id and changed.next_fire_at == clock.now + timedelta(seconds=900)
        # without a key every add is a new schedule
        a, b = await sch.add(spec()), await sch.add(spec())
        assert a.id != b.id and len(await sch.list()) == 4


# -- missed fires at start -----------------------------------------------------------------------

MISSED_AT_START = [
    # (misfire, starting deadline, runs recorded at start, fired instants)
    ("coalesce", None, [("02:00", "coalesced"), ("03:00", "fired")], ["03:00"]),
    ("skip", None, [("02:00", "missed"), ("03:00", "missed")], []),
    ("coalesce", 600, [("02:00", "missed"), ("03:00", "missed")], []),
    ("coalesce", 3600, [("02:00", "coalesced"), ("03:00", "fired")], ["03:00"]),
]


@pytest.mark.parametrize(("misfire", "deadline", "expected", "fired"), MISSED_AT_START)
async def test_fires_missed_while_down_follow_the_misfire_policy(
    store: Store, misfire: str, deadline: float | None, expected: list[tuple[str, str]], fired: list[str]
) -> None:
    clock = FixedClock(T0)
    goals = Goals()
    async with running(store, goals, clock) as sch:
        sched = await sch.add(spec(misfire=misfire, starting_deadline_seconds=deadline))
    # goald was down from here; the 01:00 fire had happened (the cursor says so)
    await store.transact(
        lambda tx: tx.execute("UPDATE schedules SET last_fire_at=? WHERE id=?", (h(1).isoformat(), sched.id))
    )
    clock.now = h(3.5)
    async with running(store, goals, clock) as sch:
        runs = await sch.runs(sched.id)
        assert outcomes(runs) == expected
        assert [at.strftime("%H:%M") for _, at, _ in goals.fired] == fired
        after = await sch.get(sched.id)
        assert after.last_fire_at == h(3) and after.next_fire_at == h(4)
        assert after.last_outcome == RunOutcome(expected[-1][1]) and after.last_reason == runs[0].reason
        assert sch.planned() == {sched.id: h(4)}
    events = [e.data for e in await schedule_events(store, sched) if e.type == SCHEDULE_RUN]
    assert [(d["scheduledFor"][11:16], d["outcome"]) for d in events] == expected
    assert all(d["reason"] for d in events)
    if fired:
        assert events[-1]["goalId"] == "goal_1" and runs[0].goal_id == "goal_1"
        assert "created goal goal_1" in runs[0].reason and "misfire policy coalesce" in runs[0].reason
    # a second start at the same time finds nothing more to do
    async with running(store, goals, clock) as sch:
        assert len(await sch.runs(sched.id)) == len(expected)
    assert len(goals.fired) == len(fired)


async def test_a_schedule_never_fired_counts_missed_fires_from_when_it_was_added(store: Store) -> None:
    clock = FixedClock(T0 + timedelta(minutes=30))
    goals = Goals()
    async with running(store, goals, clock) as sch:
        sched = await sch.add(spec(trigger={"kind": "cron", "expr": "0 */2 * * *"}))
    clock.now = h(6.25)
    async with running(store, goals, clock) as sch:
        assert outcomes(await sch.runs(sched.id)) == [
            ("02:00", "coalesced"),
            ("04:00", "coalesced"),
            ("06:00", "fired"),
        ]


# -- concurrency ---------------------------------------------------------------------------------


async def test_concurrency_forbid_skips_while_the_previous_goal_is_live(store: Store) -> None:
    goals = Goals()
    async with running(store, goals, FixedClock(T0)) as sch:
        sched = await sch.add(spec())
        first = await sch.fire_now(sched.id, h(1))
        assert first is not None and first.outcome is RunOutcome.FIRED and first.goal_id == "goal_1"
        skipped = await sch.fire_now(sched.id, h(2))
        assert skipped is not None and skipped.outcome is RunOutcome.SKIPPED_CONCURRENCY and skipped.goal_id is None
        assert skipped.reason == "the previous goal goal_1 is still active (concurrency forbid)"
        goals.status["goal_1"] = "paused"
        paused = await sch.fire_now(sched.id, h(3))
        assert paused is not None and "still paused" in paused.reason
        goals.status["goal_1"] = "completed"
        again = await sch.fire_now(sched.id, h(4))
        assert again is not None and again.outcome is RunOutcome.FIRED and again.goal_id == "goal_2"
        # an instant at or before the cursor was handled already
        assert await sch.fire_now(sched.id, h(2)) is None
        assert outcomes(await sch.runs(sched.id)) == [
            ("01:00", "fired"),
            ("02:00", "skipped_concurrency"),
            ("03:00", "skipped_concurrency"),
            ("04:00", "fired"),
        ]
        assert (await sch.get(sched.id)).last_goal_id == "goal_2"
        assert goals.cancelled == []


async def test_concurrency_replace_cancels_the_previous_goal(store: Store) -> None:
    goals = Goals()
    async with running(store, goals, FixedClock(T0)) as sch:
        sched = await sch.add(spec(concurrency="replace"))
        await sch.fire_now(sched.id, h(1))
        run = await sch.fire_now(sched.id, h(2))
        assert run is not None and run.outcome is RunOutcome.FIRED and run.goal_id == "goal_2"
        assert goals.cancelled == ["goal_1"]
        assert "cancelled the previous goal goal_1, which was active (concurrency replace)" in run.reason
        goals.status["goal_2"] = "completed"
        await sch.fire_now(sched.id, h(3))
        assert goals.cancelled == ["goal_1"]  # a finished goal is not cancelled


async def test_concurrency_allow_fires_regardless(store: Store) -> None:
    goals = Goals()
    async with running(store, goals, FixedClock(T0)) as sch:
        sched = await sch.add(spec(concurrency="allow"))
        runs = [await sch.fire_now(sched.id, h(i)) for i in (1, 2, 3)]
        assert [r.goal_id for r in runs if r is not None] == ["goal_1", "goal_2", "goal_3"]
        assert goals.status_calls == [] and goals.cancelled == []


async def test_a_failing_fire_is_recorded_as_an_error(store: Store) -> None:
    goals = Goals()
    async with running(store, goals, FixedClock(T0)) as sch:
        sched = await sch.add(spec())
        goals.fail = InvalidInput("workdir '/nope' does not exist or is not a directory")
        run = await sch.fire_now(sched.id, h(1))
        assert run is not None and run.outcome is RunOutcome.ERROR and run.goal_id is None
        assert run.reason == "InvalidInput: workdir '/nope' does not exist or is not a directory"
        listed = (await sch.list())[0]
        assert listed.last_outcome is RunOutcome.ERROR and listed.last_fire_at == h(1)
        goals.fail = None
        ok = await sch.fire_now(sched.id, h(2))
        assert ok is not None and ok.outcome is RunOutcome.FIRED


async def test_late_wakeups_are_coalesced_and_the_deadline_holds(store: Store) -> None:
    """What a job does with several due instants at once (the loop or the machine was busy)."""
    goals = Goals()
    clock = FixedClock(h(3) + timedelta(seconds=5))
    async with running(store, goals, clock) as sch:
        sched = await sch.add(spec(starting_deadline_seconds=60))
        await sch._run_due(sched.id, [h(1), h(2), h(3)])
        assert outcomes(await sch.runs(sched.id)) == [
            ("01:00", "coalesced"),
            ("02:00", "coalesced"),
            ("03:00", "fired"),
        ]
        clock.now = h(4) + timedelta(minutes=5)
        await sch._run_due(sched.id, [h(4)])
        runs = await sch.runs(sched.id, limit=1)
        assert outcomes(runs) == [("04:00", "missed")]
        assert runs[0].reason == "missed: 300s late, past the starting deadline of 60s"
        await sch._run_due(sched.id, [h(3), h(4)])  # already handled: nothing
        assert len(await sch.runs(sched.id, limit=100)) == 4 and len(goals.fired) == 1


async def test_a_skip_in_flight_is_recorded_before_the_resumption(store: Store, monkeypatch: Any) -> None:
    """A job that read its schedule suspended records its skip before a resumption commits, never
    after it: the schedule's events say what happened in the order it happened (resume waits for
    the schedule's lock, as suspend does)."""
    goals = Goals()
    async with running(store, goals, FixedClock(h(1))) as sch:
        sched = await sch.add(spec(misfire="skip"))
        await sch.suspend(sched.id)
        read, gate = asyncio.Event(), asyncio.Event()
        plain = store.read

        async def held(fn: Any, **kw: Any) -> Any:
            got = await plain(fn, **kw)
            if isinstance(got, Schedule) and got.suspended_at is not None and not read.is_set():
                read.set()  # the job read the schedule suspended: hold it there
                await gate.wait()
            return got

        monkeypatch.setattr(store, "read", held)
        job = asyncio.create_task(sch._run_due(sched.id, [h(1)]))
        await asyncio.wait_for(read.wait(), 10)
        resuming = asyncio.create_task(sch.resume(sched.id))
        await asyncio.sleep(0)  # the resumption starts (it resolves its reference, then waits for the lock)
        gate.set()
        await asyncio.wait_for(job, 10)
        resumed, run = await asyncio.wait_for(resuming, 10)
        assert resumed.suspended_at is None and run is None
        assert outcomes(await sch.runs(sched.id)) == [("01:00", "skipped_suspended")]
    kinds = [(e.data.get("change") or e.data.get("outcome")) for e in await schedule_events(store, sched)]
    assert kinds == ["added", "suspended", "skipped_suspended", "resumed"]


# -- APScheduler does the timing -----------------------------------------------------------------


async def test_a_one_second_interval_fires_on_time(store: Store) -> None:
    goals = Goals()
    async with running(store, goals, clock=None) as sch:
        sched = await sch.add(spec(trigger={"kind": "interval", "seconds": 1}, concurrency="allow"))
        lags: list[float] = []
        instants: list[datetime] = []
        async with asyncio.timeout(10):
            async with contextlib.aclosing(store.hub.subscribe(store, sched.session_id, 0)) as events:
                async for event in events:
                    if event.type == SCHEDULE_RUN:
                        assert event.data["outcome"] == "fired", event.data
                        instants.append(datetime.fromisoformat(event.data["scheduledFor"]))
                        lags.append(time.time() - instants[-1].timestamp())
                        if len(instants) == 3:
                            break
    print(f"1 s interval: lag from the scheduled instant to the committed run event: {[round(x, 4) for x in lags]} s")
    assert instants[1] - instants[0] == timedelta(seconds=1) == instants[2] - instants[1]
    assert instants[0] == sched.next_fire_at
    assert all(0 <= lag < 1.0 for lag in lags), lags
    assert len(goals.fired) >= 3


async def test_a_blocked_loop_gets_every_instant_it_passed_and_each_is_recorded(store: Store) -> None:
    """What APScheduler does that one timer would not (``daemon/schedule/__init__.py``, point 2): at
    a late wake-up it hands over every instant the wake passed, so each is recorded, none lost."""
    goals = Goals()
    async with running(store, goals, clock=None) as sch:
        sched = await sch.add(spec(trigger={"kind": "interval", "seconds": 1}, concurrency="allow"))
        seen: list[dict[str, Any]] = []
        async with asyncio.timeout(15):
            async with contextlib.aclosing(store.hub.subscribe(store, sched.session_id, 0)) as events:
                async for event in events:
                    if event.type != SCHEDULE_RUN:
                        continue
                    seen.append(event.data)
                    if len(seen) == 1:  # block the loop: three or four instants pass unseen
                        asyncio.get_running_loop().call_soon(time.sleep, 3.5)
                    if len(seen) == 6:
                        break
    instants = [datetime.fromisoformat(d["scheduledFor"]) for d in seen]
    assert all(b - a == timedelta(seconds=1) for a, b in itertools.pairwise(instants)), instants
    coalesced = [d for d in seen if d["outcome"] == "coalesced"]
    assert len(coalesced) >= 2, seen  # handed over together: all but the last of them coalesced


# -- the real goal engine ------------------------------------------------------------------------


def _steps_since_user(request: ModelRequest) -> int:
    msgs = list(request.messages)
    last_user = max(i for i, m in enumerate(msgs) if m.role == "user")
    return sum(1 for m in msgs[last_user + 1 :] if m.role == "assistant")


async def wait_goal(rt: Runtime, session_id: str, status: GoalStatus) -> None:
    async with asyncio.timeout(30):
        async with contextlib.aclosing(rt.store.hub.subscribe(rt.store, session_id, 0)) as events:
            async for event in events:
                if event.type == GOAL_CHANGED and event.data["status"] == status.value:
                    return


async def test_fires_create_goals_through_the_real_engine(db_path: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    gate = asyncio.Event()
    hold = {"on": False}

    async def rule(request: ModelRequest) -> Reply:
        if _steps_since_user(request) == 0:
            if hold["on"]:
                await gate.wait()
            return Reply.call("goal_complete", summary="report written", evidence="read it back")
        return Reply.say("done")

    model = ScriptedModel(rule, name="g")
    registry = ModelRegistry({model.spec: model}, default=model.spec)

    def tools(row: Any) -> ToolRegistry:
        return ToolRegistry(list(file_tools()) + tools_for_goal_sessions(row.config))

    async with Runtime.open(db_path, models=registry, tools=tools) as rt:
        async with GoalEngine.running(rt, timer_interval=0.05) as engine:

            def goal_spec_of(schedule: Schedule, at: datetime) -> GoalSpec:
                template = {**schedule.goal, "workdir": str(workdir)}
                return GoalSpec.model_validate(template | {"idempotency_key": f"{schedule.id}@{at.isoformat()}"})

            async def fire(schedule: Schedule, at: datetime, claim: FireClaim) -> str:
                goal = await engine.create(
                    goal_spec_of(schedule, at), also=lambda tx, made: claim.record(tx, str(made.id))
                )
                return str(goal.id)

            sch = Scheduler(
                rt.store,
                fire=fire,
                goal_status=lambda gid: goal_status(engine, gid),
                cancel_goal=lambda gid: cancel_goal(engine, gid),
                clock=FixedClock(T0),
            )
            await sch.start()
            try:
                template = {
                    "objective": "Write the hourly report.",
                    "title": "Hourly report",
                    "budgets": {"maxRounds": 3},
                }
                sched = await sch.add({"key": "report", "trigger": HOURLY, "goal": template})

                run1 = await sch.fire_now(sched.id, h(1))
                assert run1 is not None and run1.outcome is RunOutcome.FIRED and run1.goal_id is not None
                g1 = await engine.get(run1.goal_id)
                assert (g1.objective, g1.title, g1.budgets.max_rounds) == (
                    "Write the hourly report.",
                    "Hourly report",
                    3,
                )
                assert g1.idempotency_key == f"{sched.id}@{h(1).isoformat()}"
                await wait_goal(rt, g1.session_id, GoalStatus.COMPLETED)

                hold["on"] = True  # from here the agent works until the gate opens
                run2 = await sch.fire_now(sched.id, h(2))
                assert run2 is not None and run2.outcome is RunOutcome.FIRED and run2.goal_id is not None
                run3 = await sch.fire_now(sched.id, h(3))
                assert run3 is not None and run3.outcome is RunOutcome.SKIPPED_CONCURRENCY
                assert run3.reason == f"the previous goal {run2.goal_id} is still active (concurrency forbid)"

                assert (
                    await sch.add({"key": "report", "trigger": HOURLY, "goal": template, "concurrency": "replace"})
                ).id == sched.id
                run4 = await sch.fire_now(sched.id, h(4))
                assert run4 is not None and run4.outcome is RunOutcome.FIRED and run4.goal_id is not None
                assert (await engine.get(run2.goal_id)).status is GoalStatus.CANCELLED

                # A goal made for an instant whose run was never recorded (an older goald made the
                # goal and the run in two transactions and died in between): the fire finds that goal
                # instead of making a second one. (Under "replace" that fire first cancelled the
                # previous goal, which held the shared work directory.)
                fresh = await sch.get(sched.id)
                await engine.cancel(run4.goal_id, reason="replaced by the next scheduled run")
                made = str((await engine.create(goal_spec_of(fresh, h(5)))).id)
                run5 = await sch.fire_now(sched.id, h(5))
                assert run5 is not None and run5.goal_id == made
                assert (await engine.get(run4.goal_id)).status is GoalStatus.CANCELLED
                assert len(await engine.list_goals()) == 4

                gate.set()
                await wait_goal(rt, (await engine.get(made)).session_id, GoalStatus.COMPLETED)
                listed = (await sch.list())[0]
                assert listed.last_goal_id == made and listed.last_outcome is RunOutcome.FIRED
            finally:
                await sch.stop()
        kinds = [
            (e.type, e.data.get("outcome") or e.data.get("change")) for e in await schedule_events(rt.store, sched)
        ]
        assert kinds == [
            (SCHEDULE_CHANGED, "added"),
            (SCHEDULE_RUN, "fired"),
            (SCHEDULE_RUN, "fired"),
            (SCHEDULE_RUN, "skipped_concurrency"),
            (SCHEDULE_CHANGED, "updated"),
            (SCHEDULE_RUN, "fired"),
            (SCHEDULE_RUN, "fired"),
        ]
