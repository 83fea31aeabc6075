"""The disk limit and the daemon's hold in the goal engine (issue 24, "Disk"), on a real runtime and
store: a work directory over its goal's limit pauses the goal ``disk_limit`` at its idle, with the
figures; while the engine's ``hold`` says no goal may go on (the store's disk under its watermark), a
goal at its idle waits, active, nothing decided or counted, with the reason in ``engine.held``;
only its disk limit is judged meanwhile; once the hold clears, it goes on by itself."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from goalkit import wait_status

import goals.engine
from agent import ModelRegistry, Reply, Runtime, ScriptedModel, ToolRegistry
from goals import Decision, GoalEngine, GoalSpec, GoalStatus, SandboxSpec, tools_for_goal_sessions

MIB = 1024 * 1024
LOW = "the disk holding goald's store (/x) has 3 MiB free, under the 8 MiB watermark"


@contextlib.asynccontextmanager
async def rig(db_path: Path, **engine_kw: Any) -> AsyncIterator[tuple[Runtime, GoalEngine]]:
    model = ScriptedModel(lambda request: Reply.say("working on it"), name="w")
    registry = ModelRegistry({model.spec: model}, default=model.spec)
    async with Runtime.open(
        db_path, models=registry, tools=lambda row: ToolRegistry(tools_for_goal_sessions(row.config))
    ) as rt:
        engine = GoalEngine(rt, timer_interval=0.05, **engine_kw)
        await engine.start()
        try:
            yield rt, engine
        finally:
            await engine.stop()


def written(path: Path, size: int) -> None:
    path.write_bytes(b"x" * size)


async def test_a_work_directory_over_its_limit_pauses_its_goal_with_the_figures(db_path: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    written(work / "big.bin", 3 * MIB)
    async with rig(db_path) as (rt, engine):
        goal = await engine.create(
            GoalSpec(objective="Keep it small.", workdir=str(work), sandbox=SandboxSpec(max_disk_mb=2))
        )
        changed = await wait_status(rt, goal, GoalStatus.PAUSED)
    assert changed["reason"].startswith("disk_limit: the work directory holds 3")
    assert changed["reason"].endswith("MiB, over its 2 MiB limit")


async def test_the_daemons_limit_for_a_goal_wins_over_its_own(db_path: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    written(work / "big.bin", 3 * MIB)
    async with rig(db_path, disk_limit_for=lambda goal: 64 * MIB) as (_, engine):
        decided = asyncio.Event()
        engine.add_decision_listener(lambda inp, d: decided.set())
        goal = await engine.create(
            GoalSpec(objective="Keep it small.", workdir=str(work), sandbox=SandboxSpec(max_disk_mb=2))
        )
        async with asyncio.timeout(10):
            await decided.wait()
        assert (await engine.get(goal.id)).status is GoalStatus.ACTIVE  # 3 MiB of 64: goes on


class Hold:
    """The engine's ``hold``: the reason while ``low`` holds one; :attr:`again` is set once the
    engine asked a second time (it looks again after holding a goal back: that one is held)."""

    def __init__(self) -> None:
        self.low: str | None = LOW
        self.calls = 0
        self.again = asyncio.Event()

    def __call__(self) -> str | None:
        self.calls += 1
        if self.calls >= 2:
            self.again.set()
        return self.low


async def test_a_held_goal_waits_uncounted_and_goes_on_when_the_hold_clears(
    db_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(goals.engine, "HOLD_RECHECK_SECONDS", 0.1)
    work = tmp_path / "work"
    work.mkdir()
    hold = Hold()
    decisions: list[Decision] = []
    async with rig(db_path, hold=hold) as (rt, engine):
        engine.add_decision_listener(lambda inp, d: decisions.append(d))
        goal = await engine.create(GoalSpec(objective="Go on.", workdir=str(work)))
        async with asyncio.timeout(10):
            await hold.again.wait()  # the idle's evaluation held it back, and it is looked at again
        assert engine.held[goal.id] == LOW
        held = await engine.get(goal.id)
        assert held.status is GoalStatus.ACTIVE and held.rounds == 0 and held.evaluated_seq == goal.evaluated_seq
        assert decisions == []
        # A goal over its disk limit is paused even while held (the remedy).
        written(work / "big.bin", 3 * MIB)
        engine.disk_limit_for = lambda g: 2 * MIB
        paused = await wait_status(rt, goal, GoalStatus.PAUSED)
        assert paused["reason"].startswith("disk_limit: ") and goal.id not in engine.held

    # Another goal: the hold clears, and it goes on by itself (round 2 is issued).
    other_work = tmp_path / "other"
    other_work.mkdir()
    hold = Hold()
    async with rig(db_path, hold=hold) as (_, engine):
        decided = asyncio.Event()
        engine.add_decision_listener(lambda inp, d: decided.set())
        other = await engine.create(GoalSpec(objective="Go on.", workdir=str(other_work)))
        async with asyncio.timeout(10):
            await hold.again.wait()
        assert other.id in engine.held
        hold.low = None
        async with asyncio.timeout(10):  # the engine looks again by itself (HOLD_RECHECK_SECONDS)
            await decided.wait()
        assert other.id not in engine.held
        assert (await engine.get(other.id)).rounds == 1
