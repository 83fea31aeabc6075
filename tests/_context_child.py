"""The child process of the compaction crash test (``tests/e2e/test_context_crash.py``).

Run as ``python _context_child.py DB WORKDIR MODE``. It opens the runtime and the goal engine on the
real SQLite file ``DB`` and runs one goal (under an idempotency key, so a restart finds it) with the
small-window scripted model of :mod:`context_models`. It prints ``BOOT`` once its imports are done,
``E <type>`` for each committed event, and ``SUMMARY`` when a summary call starts; with ``MODE``
``block`` that call never returns (the parent kills the process in it). It exits by itself, after
printing ``DONE``, once the goal is no longer active.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from context_models import dump_tool, objective, rule_for

from agent import Event, ModelRegistry, ModelRequest, Reply, Runtime, ScriptedModel, ToolRegistry, file_tools
from goals import GOAL_CHANGED, Budgets, GoalEngine, GoalSpec, GoalStatus, StopRules, tools_for_goal_sessions

ROUNDS = 12


async def main(db: str, workdir: str, mode: str) -> None:
    inner = rule_for("ok")

    async def rule(request: ModelRequest) -> Reply:
        if request.purpose == "summary":
            print("SUMMARY", flush=True)
            if mode == "block":
                await asyncio.sleep(3600)
        reply: Reply = inner(request)
        return reply

    model = ScriptedModel(rule, name="small", max_tokens=256, context_window=4000, record=False)
    registry = ModelRegistry({model.spec: model}, default=model.spec)

    def tools(row: Any) -> ToolRegistry:
        return ToolRegistry([*file_tools(), dump_tool(), *tools_for_goal_sessions(row.config)])

    print("BOOT", flush=True)
    async with Runtime.open(db, models=registry, tools=tools) as rt:
        rt.store.hub.add_listener(lambda event: print("E", event.type, flush=True))
        async with GoalEngine.running(rt, timer_interval=0.05) as engine:
            changed = asyncio.Event()

            def on_event(event: Event) -> None:
                if event.type == GOAL_CHANGED:
                    changed.set()

            remove = rt.store.hub.add_listener(on_event)
            await engine.create(
                GoalSpec(
                    objective=objective(ROUNDS),
                    idempotency_key="compaction-crash",
                    workdir=workdir,
                    budgets=Budgets(max_rounds=ROUNDS + 10),
                    rules=StopRules(stall_rounds=100, error_backoff_seconds=0.05, max_model_errors=5),
                )
            )
            while True:
                changed.clear()
                goals = await engine.list_goals()
                if all(g.status is not GoalStatus.ACTIVE for g in goals):
                    break
                await changed.wait()
            remove()
    print("DONE", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
