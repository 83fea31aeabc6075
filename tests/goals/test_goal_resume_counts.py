"""A round that ran while its goal was paused is counted once, even when the goal is resumed
before the engine has looked at the idle that ended it.

Pausing a goal mid-round lets the running turn finish; the engine counts that round at the next
idle (the paused goal's bookkeeping). A resume that lands between that idle and the engine's look
must count the round itself, or the next continuation repeats the round number and the round
limit lets one round too many through. The engine is stopped across that window here, so the
resume lands in it every time.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
import storekit

from agent import ModelRegistry, ModelRequest, Reply, Runtime, ScriptedModel, TextBlock, ToolRegistry, file_tools
from goals import GOAL_COUNTED, Budgets, GoalEngine, GoalSpec, GoalStatus, tools_for_goal_sessions

#: The store contract: every test here runs on SQLite and on PostgreSQL.
pytestmark = pytest.mark.both_stores

WAIT = 30.0


def latest_round(request: ModelRequest) -> tuple[int, int]:
    """The round number of the latest continuation, and how many model steps followed it."""
    msgs = list(request.messages)
    for i in range(len(msgs) - 1, -1, -1):
        text = "".join(b.text for b in msgs[i].content if isinstance(b, TextBlock))
        if msgs[i].role == "user" and (found := re.search(r"\bRound (\d+)\b", text)):
            return int(found.group(1)), sum(1 for m in msgs[i + 1 :] if m.role == "assistant")
    raise AssertionError("no continuation in the prompt")


def opened_runtime(
    db_path: Path, rule: Callable[[ModelRequest], Awaitable[Reply]]
) -> AbstractAsyncContextManager[Runtime]:
    """A runtime with the file tools and the goal tools, its model scripted by ``rule``."""
    model = ScriptedModel(rule, name="m")
    registry = ModelRegistry({model.spec: model}, default=model.spec)

    def tools(row: Any) -> ToolRegistry:
        return ToolRegistry(list(file_tools()) + tools_for_goal_sessions(row.config))

    return Runtime.open(db_path, models=registry, tools=tools)


async def test_a_round_that_ran_while_paused_counts_once_when_resumed_before_the_engine_looks(
    db_path: Path, tmp_path: Path
) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    entered, opened = asyncio.Event(), asyncio.Event()
    rounds_seen: list[int] = []

    async def rule(request: ModelRequest) -> Reply:
        n, step = latest_round(request)
        if step == 0:
            rounds_seen.append(n)
            if n == 1:
                entered.set()
                await opened.wait()
            return Reply.call("write_file", path=f"part{n}.md", content=f"part {n}\n")
        if n == 3:
            return Reply.call("goal_complete", summary="three parts", evidence="part1..3.md exist")
        return Reply.say(f"part {n} written")

    async with opened_runtime(db_path, rule) as rt:
        engine = GoalEngine(rt, timer_interval=0.05)
        await engine.start()
        goal = await engine.create(
            GoalSpec(objective="Write three parts.", workdir=str(workdir), budgets=Budgets(max_rounds=3))
        )
        async with asyncio.timeout(WAIT):
            await entered.wait()
        await engine.pause(goal.id)
        await engine.stop()  # nobody looks at the coming idle
        opened.set()
        agent = await rt.agent(goal.session_id)
        async with asyncio.timeout(WAIT):
            await agent.when_idle()
        unlooked = await engine.get(goal.id)
        resumed = await engine.resume(goal.id)

        engine = GoalEngine(rt, timer_interval=0.05)
        await engine.start()
        try:
            async with asyncio.timeout(WAIT):
                while (final := await engine.get(goal.id)).status is GoalStatus.ACTIVE:
                    await agent.when_idle()
                    await engine.settled()
        finally:
            await engine.stop()

    assert unlooked.rounds == 0 and unlooked.status is GoalStatus.PAUSED
    assert resumed.rounds == 1 and resumed.continuation_round == 2
    assert rounds_seen == [1, 2, 3]
    assert (final.status, final.rounds) == (GoalStatus.COMPLETED, 3)
    with contextlib.closing(storekit.connect(db_path)) as conn:
        refs = [
            r[0]
            for r in conn.execute(
                "SELECT source_ref FROM inbox WHERE session_id=? AND source_kind='goal' ORDER BY queued_seq",
                (goal.session_id,),
            )
        ]
    assert refs == [f"{goal.id}#{i}" for i in (1, 2, 3)]


async def test_a_paused_goal_counting_its_running_round_tells_subscribers(db_path: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    entered, opened = asyncio.Event(), asyncio.Event()

    async def rule(request: ModelRequest) -> Reply:
        n, step = latest_round(request)
        if step == 0:
            entered.set()
            await opened.wait()
            return Reply.call("write_file", path=f"part{n}.md", content=f"part {n}\n")
        return Reply.say(f"part {n} written")

    async with opened_runtime(db_path, rule) as rt:
        engine = GoalEngine(rt, timer_interval=0.05)
        await engine.start()
        try:
            goal = await engine.create(GoalSpec(objective="Write parts.", workdir=str(workdir)))
            async with asyncio.timeout(WAIT):
                await entered.wait()
            paused = await engine.pause(goal.id)  # the round's turn is running: it finishes
            after = (await rt.store.session_state(goal.session_id)).last_seq
            opened.set()
            async with asyncio.timeout(WAIT):
                async with contextlib.aclosing(rt.store.hub.subscribe(rt.store, goal.session_id, after)) as events:
                    async for event in events:
                        if event.type == GOAL_COUNTED:
                            counted = event.data
                            break
            await engine.settled()
            final = await engine.get(goal.id)
        finally:
            await engine.stop()

    assert paused.rounds == 0 and paused.tokens == 0
    # The event carries what `goal/get` now says: the round and its spend, the goal still paused.
    assert counted == {
        "goalId": goal.id,
        "status": "paused",
        "rounds": final.rounds,
        "tokens": final.tokens,
        "cost": final.cost,
    }
    assert final.status is GoalStatus.PAUSED and final.rounds == 1 and final.tokens > 0
