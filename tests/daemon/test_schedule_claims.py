"""Several nodes on one store: each scheduled instant is claimed by exactly one of them.

On PostgreSQL each node is what a daemon holds for its schedules: its own :class:`Runtime` (its
own connections), its own real :class:`GoalEngine`, the daemon's :class:`GoalFiring` and its own
:class:`Scheduler` (its own APScheduler). A SQLite file has one store (it caches each session's
sequence number, so a second opening of the file is not a second node), so on SQLite the two
nodes share the runtime and the engine and each has its own scheduler: the same claim code runs,
serialized by the one writer instead of the cluster's advisory lock. Every node arms the same
schedule; the test checks the durable outcome: one ``schedule_runs`` row per instant, one goal per
``fired`` row, and no goal without its row.

To make every instant a real race, each node's fire waits at a barrier until every node has
reached its fire of that instant (all of them passed the scheduler's cursor check, since nobody
can commit before all arrive), and only then goes into the goal's creation transaction: so each
instant is fought over by every node, and exactly one wins while the others get ``FireTaken``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agent import ModelRegistry, ModelRequest, Reply, Runtime, ScriptedModel, Store, ToolRegistry, file_tools
from daemon.schedule import FireClaim, FireTaken, GoalFiring, RunOutcome, Schedule, Scheduler, ScheduleRun
from daemon.workdirs import Workdirs
from goals import GOAL_CHANGED, Goal, GoalEngine, GoalStatus, tools_for_goal_sessions

pytestmark = pytest.mark.both_stores

#: Far ahead of the real clock: APScheduler sleeps through every job planned from it.
T0 = datetime(2071, 1, 1, tzinfo=UTC)
HOURLY = {"kind": "cron", "expr": "0 * * * *"}


def h(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


class FixedClock:
    """Every node's clock, moved by the test (one clock: the nodes agree on the time)."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


class Barrier:
    """Holds each node's fire of an instant until ``n`` nodes have reached it."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.arrived: dict[datetime, int] = defaultdict(int)
        self.cond = asyncio.Condition()

    async def arrive(self, at: datetime) -> None:
        async with self.cond:
            self.arrived[at] += 1
            self.cond.notify_all()
            async with asyncio.timeout(20):
                await self.cond.wait_for(lambda: self.arrived[at] >= self.n)

    async def open(self) -> None:
        """Let every fire through at once (the nodes are stopping: some will not reach it)."""
        async with self.cond:
            self.n = 1
            self.cond.notify_all()


@dataclass
class Cluster:
    """The nodes, and what their fires did: wins ``(node, instant, goal id)`` and losses."""

    nodes: list[Node]
    barrier: Barrier
    won: list[tuple[int, datetime, str]] = field(default_factory=list)
    taken: list[tuple[int, datetime]] = field(default_factory=list)
    fired: asyncio.Event = field(default_factory=asyncio.Event)
    want: int = 0

    gate: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def store(self) -> Store:
        return self.nodes[0].rt.store

    async def stop(self) -> None:
        """Stop every node's scheduler (their fires in flight finish first)."""
        self.gate.set()
        await self.barrier.open()
        await asyncio.gather(*(node.scheduler.stop() for node in self.nodes))


@dataclass
class Node:
    index: int
    rt: Runtime
    engine: GoalEngine
    scheduler: Scheduler


def model_rule(gate: asyncio.Event) -> Any:
    async def rule(request: ModelRequest) -> Reply:
        msgs = list(request.messages)
        last_user = max(i for i, m in enumerate(msgs) if m.role == "user")
        if not any(m.role == "assistant" for m in msgs[last_user + 1 :]):
            await gate.wait()
            return Reply.call("goal_complete", summary="report written", evidence="read it back")
        return Reply.say("done")

    return rule


@contextlib.asynccontextmanager
async def cluster(
    db_path: Path | str, tmp_path: Path, n: int, *, clock: Any = None, gate: asyncio.Event | None = None
) -> AsyncIterator[Cluster]:
    """``n`` nodes on the store ``db_path``, their schedulers started (on ``clock``, if given)."""
    if gate is None:
        gate = asyncio.Event()
        gate.set()
    model = ScriptedModel(model_rule(gate), name="g")
    registry = ModelRegistry({model.spec: model}, default=model.spec)
    workdirs = Workdirs([tmp_path / "work"])
    barrier = Barrier(n)
    out = Cluster([], barrier, gate=gate)

    def tools(row: Any) -> ToolRegistry:
        return ToolRegistry(list(file_tools()) + tools_for_goal_sessions(row.config))

    async with contextlib.AsyncExitStack() as stack:
        for i in range(n):
            if i == 0 or not isinstance(db_path, Path):
                rt = await stack.enter_async_context(Runtime.open(db_path, models=registry, tools=tools))
                engine = await stack.enter_async_context(GoalEngine.running(rt, timer_interval=0.05))
            firing = GoalFiring(engine, workdirs, model.spec, lambda sandbox: None)

            async def fire(schedule: Schedule, at: datetime, claim: FireClaim, i: int = i, f: Any = firing) -> str:
                await barrier.arrive(at)
                try:
                    goal_id: str = await f.fire(schedule, at, claim)
                except FireTaken:
                    out.taken.append((i, at))
                    raise
                out.won.append((i, at, goal_id))
                if out.want and len(out.won) >= out.want:
                    out.fired.set()
                return goal_id

            kw = {"clock": clock} if clock is not None else {}
            sch = Scheduler(rt.store, fire=fire, goal_status=firing.goal_status, cancel_goal=firing.cancel_goal, **kw)
            out.nodes.append(Node(i, rt, engine, sch))
        try:
            yield out
        finally:
            await out.stop()


async def all_runs(store: Store, schedule_id: str) -> list[ScheduleRun]:
    runs = await store.read(
        lambda conn: conn.execute(
            "SELECT * FROM schedule_runs WHERE schedule_id=? ORDER BY scheduled_for", (schedule_id,)
        ).fetchall()
    )
    return [ScheduleRun.model_validate(dict(r)) for r in runs]


async def goals_of(engine: GoalEngine, schedule_id: str) -> list[Goal]:
    return await engine.list_goals(schedule_id=schedule_id)


def check_one_goal_per_fired_run(runs: list[ScheduleRun], goals: list[Goal], schedule_id: str) -> None:
    """Each instant has one row; each ``fired`` row names its own goal; every goal has its row."""
    instants = [r.scheduled_for for r in runs]
    assert len(instants) == len(set(instants)), instants
    fired = {r.goal_id: r.scheduled_for for r in runs if r.outcome is RunOutcome.FIRED}
    assert None not in fired and len(fired) == sum(r.outcome is RunOutcome.FIRED for r in runs)
    assert {g.id: g.idempotency_key for g in goals} == {
        gid: f"{schedule_id}@{at.isoformat()}" for gid, at in fired.items()
    }


async def start_all(nodes: list[Node]) -> None:
    await asyncio.gather(*(node.scheduler.start() for node in nodes))


def nodes_for(db_path: Path | str) -> int:
    # Three daemons on PostgreSQL; on SQLite two schedulers over one store.
    return 2 if isinstance(db_path, Path) else 3


# -- APScheduler timing on every node ------------------------------------------------------------


async def test_each_instant_of_a_one_second_interval_is_fired_by_exactly_one_node(
    db_path: Path | str, tmp_path: Path
) -> None:
    n, fires = nodes_for(db_path), 5
    async with cluster(db_path, tmp_path, n) as c:
        await start_all(c.nodes)
        c.want = fires
        declared = {
            "key": "every-second",
            "trigger": {"kind": "interval", "seconds": 1},
            "goal": {"objective": "Write the report.", "budgets": {"maxRounds": 2}},
            "concurrency": "allow",
        }
        sched = await c.nodes[0].scheduler.add(declared)
        for node in c.nodes[1:]:  # each node loads the same declaration: one schedule, armed everywhere
            assert (await node.scheduler.add(declared)).id == sched.id
        assert all(node.scheduler.planned() == {sched.id: sched.next_fire_at} for node in c.nodes)
        started = time.monotonic()
        async with asyncio.timeout(fires + 20):
            await c.fired.wait()
        await c.stop()
        print(f"{n} nodes: {len(c.won)} fires in {time.monotonic() - started:.1f}s; wins by node {c.won}")
        runs = await all_runs(c.store, sched.id)
        goals = await goals_of(c.nodes[0].engine, sched.id)
        assert len(runs) >= fires and all(r.outcome is RunOutcome.FIRED for r in runs), runs
        # consecutive instants, one row each, from the first planned one: no instant skipped or doubled
        assert sched.next_fire_at is not None
        first = sched.next_fire_at
        assert [r.scheduled_for for r in runs] == [first + timedelta(seconds=k) for k in range(len(runs))]
        check_one_goal_per_fired_run(runs, goals, sched.id)
        # every node fought over each of the first instants (the barrier held them); exactly one won each
        won_at = [at for _, at, _ in c.won]
        assert sorted(won_at) == [r.scheduled_for for r in runs]
        for at in sorted(won_at)[:fires]:
            assert sum(1 for _, t in c.taken if t == at) == n - 1, (at, c.taken)
        final = await c.nodes[-1].scheduler.get(sched.id)
        assert final.last_fire_at == runs[-1].scheduled_for and final.last_goal_id == runs[-1].goal_id


# -- misfire: nodes starting together after the schedule's instants went by ------------------------


@pytest.mark.parametrize(
    ("misfire", "deadline", "expected"),
    [
        ("coalesce", None, ["coalesced", "coalesced", "coalesced", "fired"]),
        ("skip", None, ["missed", "missed", "missed", "missed"]),
        ("coalesce", 60.0, ["missed", "missed", "missed", "missed"]),  # the latest is 5 min late
    ],
)
async def test_fires_missed_while_every_node_was_down_are_settled_once(
    db_path: Path | str, tmp_path: Path, misfire: str, deadline: float | None, expected: list[str]
) -> None:
    clock = FixedClock(T0)
    n = nodes_for(db_path)
    async with cluster(db_path, tmp_path, n, clock=clock) as c:
        first = c.nodes[0].scheduler
        await first.start()
        sched = await first.add(
            {
                "trigger": HOURLY,
                "goal": {"objective": "Write the hourly report."},
                "misfire": misfire,
                "startingDeadlineSeconds": deadline,
                "concurrency": "allow",  # the goal of 04:00 may still run at 07:00
            }
        )
        await first.stop()
        clock.now = h(4) + timedelta(minutes=5)  # 01:00 … 04:00 went by with no node up
        if expected[-1] != "fired":
            c.barrier.n = 1  # no fire reaches the barrier: let none wait for another
        await start_all(c.nodes)  # every node settles the same missed instants at once
        runs = await all_runs(c.store, sched.id)
        assert [(r.scheduled_for, r.outcome.value) for r in runs] == list(
            zip([h(1), h(2), h(3), h(4)], expected, strict=True)
        )
        check_one_goal_per_fired_run(runs, await goals_of(c.nodes[0].engine, sched.id), sched.id)
        events = [e for e in await c.store.events_after(sched.session_id, 0) if e.type == "schedule/run"]
        assert [e.data["outcome"] for e in events] == expected  # one event per instant, not one per node

        # A late wake-up on every node at once (the machine was busy): coalesced/missed and fired once.
        clock.now = h(7) + timedelta(seconds=5)
        c.barrier.n = n
        await asyncio.gather(*(node.scheduler._run_due(sched.id, [h(5), h(6), h(7)]) for node in c.nodes))
        late = [(r.scheduled_for, r.outcome.value) for r in (await all_runs(c.store, sched.id))[4:]]
        kind = "coalesced" if misfire == "coalesce" else "missed"
        assert late == [(h(5), kind), (h(6), kind), (h(7), "fired")]  # 5 s late: within any deadline
        check_one_goal_per_fired_run(
            await all_runs(c.store, sched.id), await goals_of(c.nodes[0].engine, sched.id), sched.id
        )
        assert sum(1 for _, at in c.taken if at == h(7)) == n - 1


# -- concurrency: the policy holds across nodes ----------------------------------------------------


async def wait_status(rt: Runtime, session_id: str, status: GoalStatus) -> None:
    async with asyncio.timeout(30):
        async with contextlib.aclosing(rt.store.hub.subscribe(rt.store, session_id, 0)) as events:
            async for event in events:
                if event.type == GOAL_CHANGED and event.data["status"] == status.value:
                    return


async def fire_everywhere(c: Cluster, schedule_id: str, at: datetime) -> list[ScheduleRun | None]:
    return list(await asyncio.gather(*(node.scheduler.fire_now(schedule_id, at) for node in c.nodes)))


async def test_concurrency_forbid_holds_across_nodes(db_path: Path | str, tmp_path: Path) -> None:
    gate = asyncio.Event()  # the first goal works until the test opens it
    n = nodes_for(db_path)
    async with cluster(db_path, tmp_path, n, clock=FixedClock(T0), gate=gate) as c:
        await start_all(c.nodes)
        sched = await c.nodes[0].scheduler.add({"trigger": HOURLY, "goal": {"objective": "Write the report."}})

        results = await fire_everywhere(c, sched.id, h(1))
        [run1] = [r for r in results if r is not None]
        assert run1.outcome is RunOutcome.FIRED and run1.goal_id is not None
        winner = next(node for node in c.nodes if node.index == c.won[0][0])
        g1 = await winner.engine.get(run1.goal_id)

        c.barrier.n = 1  # the skipped instants make no goal: no fire reaches the barrier
        for at in (h(2), h(3)):
            results = await fire_everywhere(c, sched.id, at)
            [skipped] = [r for r in results if r is not None]
            assert skipped.outcome is RunOutcome.SKIPPED_CONCURRENCY
            assert skipped.reason == f"the previous goal {g1.id} is still active (concurrency forbid)"

        gate.set()
        await wait_status(winner.rt, g1.session_id, GoalStatus.COMPLETED)
        c.barrier.n = n
        results = await fire_everywhere(c, sched.id, h(4))
        [run4] = [r for r in results if r is not None]
        assert run4.outcome is RunOutcome.FIRED and run4.goal_id != g1.id

        runs = await all_runs(c.store, sched.id)
        assert [(r.scheduled_for, r.outcome.value) for r in runs] == [
            (h(1), "fired"),
            (h(2), "skipped_concurrency"),
            (h(3), "skipped_concurrency"),
            (h(4), "fired"),
        ]
        check_one_goal_per_fired_run(runs, await goals_of(c.nodes[0].engine, sched.id), sched.id)
        assert len(c.won) == 2 and len(c.taken) == 2 * (n - 1)
