"""Shared support for in-process goal tests: a runtime with a running goal engine, and waiting for
a goal's status. One copy for every folder (the copies that each test file kept had drifted).

Plain functions rather than fixtures, because helpers inside test modules (not only tests) call
them; ``tests/goals/conftest.py`` offers them as fixtures too.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from agent import ModelRegistry, ModelRequest, Reply, Runtime, ScriptedModel, ToolRegistry, file_tools
from agent.tools.base import Tool
from goals import GOAL_CHANGED, Goal, GoalEngine, GoalStatus, tools_for_goal_sessions
from goals.tools import approver_for_session, policy_for_session

Rule = Callable[[ModelRequest], Reply | Awaitable[Reply]]
DecisionListener = Callable[..., None]


@contextlib.asynccontextmanager
async def goal_runtime(
    db_path: Path,
    model: ScriptedModel | Rule | list[Reply],
    name: str = "g",
    on_decision: DecisionListener | None = None,
    *,
    extra_tools: Sequence[Tool[Any]] = (),
    with_file_tools: bool = True,
    grace: float | None = None,
    **engine_kw: Any,
) -> AsyncIterator[tuple[Runtime, GoalEngine, ScriptedModel]]:
    """A runtime with the file tools (unless ``with_file_tools=False``), ``extra_tools`` and the goal
    tools, and a running goal engine (timers every 50 ms). ``model`` is a scripted model or the rule
    (or replies) to build one named ``name``; ``on_decision`` observes every decision, including
    those the engine makes as it starts; ``grace`` is the runtime's shutdown grace."""
    scripted = model if isinstance(model, ScriptedModel) else ScriptedModel(model, name=name)
    registry = ModelRegistry({scripted.spec: scripted}, default=scripted.spec)
    base: list[Tool[Any]] = [*(file_tools() if with_file_tools else ()), *extra_tools]

    def tools(row: Any) -> ToolRegistry:
        policy = policy_for_session(row.config)
        return ToolRegistry(
            [*base, *tools_for_goal_sessions(row.config)], policy=policy, approver=approver_for_session(row.config)
        )

    opened = (
        Runtime.open(db_path, models=registry, tools=tools)
        if grace is None
        else Runtime.open(db_path, models=registry, tools=tools, grace=grace)
    )
    async with opened as rt:
        engine = GoalEngine(rt, timer_interval=0.05, **engine_kw)
        if on_decision is not None:
            engine.add_decision_listener(on_decision)
        await engine.start()
        try:
            yield rt, engine, scripted
        finally:
            await engine.stop()


async def wait_status(
    rt: Runtime, goal: Goal, status: GoalStatus, *, after: int = 0, within: float = 30.0
) -> dict[str, Any]:
    """Wait (without sleeping) for the goal's ``goal/changed`` event to ``status`` after sequence
    number ``after``; its data, with the event's ``seq`` added."""
    async with asyncio.timeout(within):
        async with contextlib.aclosing(rt.store.hub.subscribe(rt.store, goal.session_id, after)) as events:
            async for event in events:
                if (
                    event.type == GOAL_CHANGED
                    and event.data.get("goalId", goal.id) == goal.id
                    and event.data["status"] == status.value
                ):
                    return {**event.data, "seq": event.seq}
    raise AssertionError("unreachable")
