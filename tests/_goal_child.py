"""The child process of the goal crash campaign (``tests/e2e/test_goal_crash_campaign.py``).

Run as ``python _goal_child.py DB PLAN``. It opens the runtime and the goal engine on the real
SQLite file ``DB``, creates the goals listed in the JSON file ``PLAN`` (each under an idempotency
key, so a restart finds the goals of an earlier run instead of adding new ones), and lets them
run. It exits by itself (code 0, after printing ``DONE``) once no goal is active; until then the
parent may ``kill -9`` it at any moment and start it again.

It prints ``BOOT`` once its imports are done, and then one line ``E <type>`` for each event the
store commits once the runtime is open (turns, tool results, goal decisions, status changes of
every goal session). The parent chooses its kill moments in that work, not in wall time: it kills
after a seeded random number of these lines, so each kill lands while work remains, in the
interesting part of the run (repairing, deciding, turns) rather than in the interpreter's start-up.

The scripted model is a pure function of the conversation, so every run answers the same way:
the round is the ``Round N`` of the latest continuation, the step the number of assistant messages
after it. Below its target round a goal writes ``rN.txt``, runs a ``build`` (a tool that takes a
while, like a compiler) and says it is done; from the target round on it writes ``rT.txt`` (what
its verification command checks), claims completion with ``goal_complete`` and stops. In every
round ``N`` with ``N % 5 == 3`` below the target, the model's first answer is malformed: the turn
ends ``error`` (after the driver's own retries, a few tens of milliseconds apart here) and the goal
waits out a short backoff at idle (a durable ``not_before``), which gives kills idle moments to
land in. A round cut short by a kill is not counted: it runs again with the same number
(docs/architecture.md#infrastructure-trouble-is-not-the-goals), so a goal reaches its target in
exactly its target's rounds. Each answer and each build takes a few to a few dozen milliseconds
(chosen by a stable hash of goal, round and step), so kills land mid-model-call, mid-tool,
mid-commit and at idle.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import zlib
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from agent import (
    AgentConfig,
    Event,
    FunctionTool,
    ModelError,
    ModelErrorKind,
    ModelRegistry,
    ModelRequest,
    Reply,
    RetryPolicy,
    Runtime,
    ScriptedModel,
    SessionRow,
    SessionSetup,
    TextBlock,
    ToolCall,
    ToolContext,
    ToolRegistry,
    file_tools,
)
from agent.setup import default_resolver
from goals import (
    GOAL_CHANGED,
    Budgets,
    GoalEngine,
    GoalSpec,
    GoalStatus,
    StopRules,
    VerifyCommand,
    tools_for_goal_sessions,
)

#: Model latencies (seconds) a reply may take; which one is a stable hash of goal, round and step.
DELAYS = (0.002, 0.005, 0.015, 0.04, 0.08)
_ROUND = re.compile(r"\bRound (\d+)\b")
_TARGET = re.compile(r"\bcampaign goal (\w+) with target round (\d+)\b")


def objective(name: str, target: int) -> str:
    """The objective of one campaign goal (the model reads its name and target from it)."""
    return (
        f"This is campaign goal {name} with target round {target}. In each round N write the file rN.txt; "
        f"in round {target} write r{target}.txt and claim completion."
    )


def _delay(key: str) -> float:
    return DELAYS[zlib.crc32(key.encode()) % len(DELAYS)]


class BuildArgs(BaseModel):
    """Arguments of ``build``."""

    round: int


async def _build(args: BuildArgs, ctx: ToolContext) -> str:
    # A slow tool (the time a real build takes), so that kills also land while a tool runs.
    await asyncio.sleep(_delay(f"build:{ctx.session_id}:{args.round}"))
    return f"build of round {args.round} passed"


def build_tool() -> FunctionTool[BuildArgs]:
    """The ``build`` tool: takes a few milliseconds, then reports success."""
    return FunctionTool("build", "builds the work directory", BuildArgs, _build, repeat_safe=True)


def _text(msg: Any) -> str:
    return "".join(b.text for b in msg.content if isinstance(b, TextBlock))


def rule(request: ModelRequest) -> Reply:
    """The deterministic model: see the module docstring."""
    msgs = list(request.messages)
    for i in range(len(msgs) - 1, -1, -1):
        if msgs[i].role != "user":
            continue
        text = _text(msgs[i])
        found, target_found = _ROUND.search(text), _TARGET.search(text)
        if found and target_found:
            n, step = int(found.group(1)), sum(1 for m in msgs[i + 1 :] if m.role == "assistant")
            name, target = target_found.group(1), int(target_found.group(2))
            break
    else:
        raise AssertionError("no continuation in the request")
    delay = _delay(f"{name}:{n}:{step}")
    if n < target:
        if step == 0 and n % 5 == 3:
            error = ModelError(ModelErrorKind.MALFORMED, f"scripted: a malformed answer in round {n}")
            return Reply(error=error, delay=delay)
        if step == 0:
            return Reply(
                tool_calls=[ToolCall("write_file", {"path": f"r{n}.txt", "content": f"round {n}\n"})], delay=delay
            )
        if step == 1:
            return Reply(tool_calls=[ToolCall("build", {"round": n})], delay=delay)
        return Reply.say(f"round {n} written and built", delay=delay)
    if step == 0:
        return Reply(tool_calls=[ToolCall("write_file", {"path": f"r{target}.txt", "content": "final\n"})], delay=delay)
    if step == 1:
        args = {"summary": f"{name} reached round {target}", "evidence": f"r{target}.txt exists"}
        return Reply(tool_calls=[ToolCall("goal_complete", args)], delay=delay)
    return Reply.say("claimed; stopping", delay=delay)


async def main(db: str, plan: dict[str, Any]) -> None:
    model = ScriptedModel(rule, name="campaign", record=False)
    registry = ModelRegistry({model.spec: model}, default=model.spec)

    def tools(row: Any) -> ToolRegistry:
        return ToolRegistry([*file_tools(), build_tool(), *tools_for_goal_sessions(row.config)])

    base = default_resolver(registry, tools)
    # The driver's retries of a malformed answer a few tens of milliseconds apart (not 0.5 to 2 s),
    # so a malformed round ends between two kills and the campaign's time goes to the rounds.
    quick = AgentConfig(retry=RetryPolicy(base_delay=0.02, max_delay=0.1, jitter=0))

    def resolve(row: SessionRow) -> SessionSetup:
        setup = base(row)
        assert isinstance(setup, SessionSetup)
        setup.config = quick
        return setup

    print("BOOT", flush=True)
    async with Runtime.open(db, resolver=resolve) as rt:
        # One line per committed event: the units of work the parent counts to choose a kill moment.
        rt.store.hub.add_listener(lambda event: print("E", event.type, flush=True))
        async with GoalEngine.running(rt, timer_interval=0.05) as engine:
            changed = asyncio.Event()

            def on_event(event: Event) -> None:
                if event.type == GOAL_CHANGED:
                    changed.set()

            remove = rt.store.hub.add_listener(on_event)
            for g in plan["goals"]:
                await engine.create(
                    GoalSpec(
                        objective=objective(g["name"], g["target"]),
                        idempotency_key=f"campaign-{g['name']}",
                        workdir=g["workdir"],
                        budgets=Budgets(max_rounds=g["max_rounds"]),
                        verify=[VerifyCommand(cmd=f"test -f r{g['target']}.txt", timeout=30)],
                        # Kills cut rounds short before they write anything; that is not a stall here.
                        # A kill every few events cuts the same round short many times in a row, far
                        # more often than any host would: past infra_retries it would wait an hour.
                        rules=StopRules(
                            stall_rounds=g["max_rounds"],
                            error_backoff_seconds=0.08,
                            max_model_errors=3,
                            infra_retries=10_000,
                        ),
                    )
                )
            # Wait (on goal/changed events, never polling) until no goal is active any more.
            while True:
                changed.clear()
                goals = await engine.list_goals()
                if all(g.status is not GoalStatus.ACTIVE for g in goals):
                    break
                await changed.wait()
            remove()
    print("DONE", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], json.loads(Path(sys.argv[2]).read_text())))
