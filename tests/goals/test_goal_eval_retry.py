"""A failed evaluation is retried until it commits, on a real SQLite file.

Pins: an evaluation that fails (its verification runner breaks) leaves a durable timer (the goal's
``not_before``) and is retried with backoff by itself; one whose commit the store refuses (a
storage failure: here the connection made read-only, as a full disk would refuse it) is retried
from an in-memory timer, the store's health names the failure until a write succeeds; and a goal
left in that state by a stop is evaluated at the next start. No goal is ever left ``active`` with
nothing queued, nothing running and no timer set. The only stand-ins are the scripted model and
the verification runner (a function, as the engine takes one).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent import ModelRegistry, Reply, Runtime, ScriptedModel, ToolRegistry, file_tools
from goals import GoalEngine, GoalSpec, GoalStatus, VerifyCommand, VerifyResult, tools_for_goal_sessions
from goals.store import GOAL_CHANGED

WAIT = 30.0


def claiming_model(name: str) -> ScriptedModel:
    """Round 1: claim completion, then end the turn."""
    return ScriptedModel(
        [Reply.call("goal_complete", summary="done", evidence="checked"), Reply.say("claimed")], name=name
    )


@contextlib.asynccontextmanager
async def engine_on(db_path: Path, model: ScriptedModel, runner: Any) -> AsyncIterator[tuple[Runtime, GoalEngine]]:
    registry = ModelRegistry({model.spec: model}, default=model.spec)

    def tools(row: Any) -> ToolRegistry:
        return ToolRegistry(list(file_tools()) + tools_for_goal_sessions(row.config))

    async with Runtime.open(db_path, models=registry, tools=tools) as rt:
        async with GoalEngine.running(rt, runner=runner, timer_interval=0.05) as engine:
            yield rt, engine


def passing(command: VerifyCommand) -> VerifyResult:
    return VerifyResult(cmd=command.cmd, exit_code=0, output_tail="ok")


async def wait_completed(rt: Runtime, session_id: str) -> None:
    async with asyncio.timeout(WAIT):
        async with contextlib.aclosing(rt.store.hub.subscribe(rt.store, session_id, 0)) as events:
            async for event in events:
                if event.type == GOAL_CHANGED and event.data["status"] == GoalStatus.COMPLETED.value:
                    return


async def queued_continuations(rt: Runtime, goal_id: str) -> int:
    return int(
        await rt.store.read(
            lambda c: c.execute(
                "SELECT count(*) FROM inbox WHERE pending_key=? AND fate='queued'", (f"goal:{goal_id}",)
            ).fetchone()[0]
        )
    )


async def test_a_failed_evaluation_leaves_a_durable_timer_and_is_retried(db_path: Path, tmp_path: Path) -> None:
    calls: list[datetime] = []
    failed = asyncio.Event()

    async def runner(command: VerifyCommand, workdir: Path) -> VerifyResult:
        calls.append(datetime.now(UTC))
        if len(calls) == 1:
            failed.set()
            raise RuntimeError("the runner broke")
        return passing(command)

    work = tmp_path / "work"
    work.mkdir()
    async with engine_on(db_path, claiming_model("eval-retry-durable"), runner) as (rt, engine):
        goal = await engine.create(GoalSpec(objective="Claim.", workdir=str(work), verify=[VerifyCommand(cmd="true")]))
        done = asyncio.ensure_future(wait_completed(rt, goal.session_id))
        async with asyncio.timeout(WAIT):
            await failed.wait()
        await engine.settled()
        held = await engine.get(goal.id)
        # Not yet retried (the first backoff is 1 s): idle, nothing queued, and a durable timer.
        assert held.status is GoalStatus.ACTIVE
        assert held.not_before is not None and held.not_before > calls[0]
        assert (await rt.store.session_state(goal.session_id)).status == "idle"
        assert await queued_continuations(rt, goal.id) == 0
        await done
        final = await engine.get(goal.id)
    assert final.status is GoalStatus.COMPLETED and final.result_summary == "done"
    assert len(calls) == 2
    assert (calls[1] - calls[0]).total_seconds() >= 0.9  # the backoff


async def set_read_only(rt: Runtime, on: bool) -> None:
    """Make the store's connection refuse writes (SQLITE_READONLY), as a failing disk would."""
    await rt.store.read(lambda c: c.execute(f"PRAGMA query_only={int(on)}"))


async def test_a_decision_the_store_cannot_commit_is_retried_once_it_can(db_path: Path, tmp_path: Path) -> None:
    checked = asyncio.Event()
    holder: dict[str, Runtime] = {}

    async def runner(command: VerifyCommand, workdir: Path) -> VerifyResult:
        if not checked.is_set():
            checked.set()
            # The store stops taking writes between the check and the decision's commit.
            await set_read_only(holder["rt"], True)
        return passing(command)

    work = tmp_path / "work"
    work.mkdir()
    async with engine_on(db_path, claiming_model("eval-retry-storage"), runner) as (rt, engine):
        holder["rt"] = rt
        goal = await engine.create(GoalSpec(objective="Claim.", workdir=str(work), verify=[VerifyCommand(cmd="true")]))
        done = asyncio.ensure_future(wait_completed(rt, goal.session_id))
        async with asyncio.timeout(WAIT):
            await checked.wait()
        await engine.settled()
        health = rt.store.storage_health()
        held = await engine.get(goal.id)
        assert not health["ok"] and "readonly" in health["error"] and health["hint"]
        # Not committed, and no durable timer could be written: the in-memory retry covers it.
        assert held.status is GoalStatus.ACTIVE and held.not_before is None
        await set_read_only(rt, False)
        await done  # the retry commits by itself
        final = await engine.get(goal.id)
        assert rt.store.storage_health() == {"ok": True}
    assert final.status is GoalStatus.COMPLETED


async def test_a_goal_left_undecided_by_a_stop_is_evaluated_at_start(db_path: Path, tmp_path: Path) -> None:
    checked = asyncio.Event()
    holder: dict[str, Runtime] = {}

    async def breaking(command: VerifyCommand, workdir: Path) -> VerifyResult:
        checked.set()
        await set_read_only(holder["rt"], True)
        return passing(command)

    async def runner(command: VerifyCommand, workdir: Path) -> VerifyResult:
        return passing(command)

    work = tmp_path / "work"
    work.mkdir()
    async with engine_on(db_path, claiming_model("eval-retry-restart"), breaking) as (rt, engine):
        holder["rt"] = rt
        goal = await engine.create(GoalSpec(objective="Claim.", workdir=str(work), verify=[VerifyCommand(cmd="true")]))
        async with asyncio.timeout(WAIT):
            await checked.wait()
        await engine.stop()  # stopped before the retry: nothing durable says a decision is due
        held = await engine.get(goal.id)
        await set_read_only(rt, False)
    assert held.status is GoalStatus.ACTIVE and held.not_before is None

    async with engine_on(db_path, ScriptedModel([], name="eval-retry-restart-2"), runner) as (rt, engine):
        final = await engine.get(goal.id)  # start() made every active goal's pending decision
        assert await queued_continuations(rt, goal.id) == 0
    assert final.status is GoalStatus.COMPLETED and final.result_summary == "done"
