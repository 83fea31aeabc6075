"""An answer whose calls change nothing but through the driver commits with what follows it (issue
30: fewer round trips per round), on both stores.

Pins: such an answer is not durable while its calls run and commits with the next write — one
transaction fewer per step than an answer with a call that changes something else, which is durable
before its calls run (also when only one of a step's calls is not); what a call records through
its context comes after the answer that made it; calls run in parallel commit their answer once,
before their results (an interrupt while such a call runs: ``tests/agent/test_driver.py``); and a
``kill -9`` while it runs leaves a turn repaired as "interrupted" with its reservation charged in
full, no answer and no call without a result; and the next reservation binds on what such a
deferred answer's call spent.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import storekit
from pydantic import BaseModel
from storekit import Location

from agent import (
    EventType,
    FunctionTool,
    Limits,
    ModelRegistry,
    Reply,
    Runtime,
    ScriptedModel,
    ToolCall,
    ToolContext,
    ToolOutput,
    ToolRegistry,
    Usage,
    spend,
)
from agent.tx import Tx

pytestmark = pytest.mark.both_stores

WAIT = 10.0


class NoArgs(BaseModel):
    """No arguments."""


def tool(name: str, fn: Any, *, in_store: bool) -> FunctionTool[NoArgs]:
    async def run(args: NoArgs, ctx: ToolContext) -> ToolOutput | str:
        result: ToolOutput | str = await fn(ctx)
        return result

    return FunctionTool(name, f"test tool {name}", NoArgs, run, effects_in_store=in_store)


def answer_committed(db_path: Location, ctx: ToolContext) -> bool:
    """Whether the answer that asked for this call is in the store, read through another connection."""
    with closing(storekit.connect(db_path)) as conn:
        rows = conn.execute(
            "SELECT data FROM events WHERE session_id=? AND type=?",
            (ctx.session_id, EventType.ASSISTANT_MESSAGE.value),
        ).fetchall()
    return any(b.get("id") == ctx.call_id for (data,) in rows for b in json.loads(data)["content"])


async def run_turn(open_runtime: Any, model: ScriptedModel, tools: list[Any]) -> tuple[Runtime, str, int]:
    """Run one turn to idle; the runtime (closed), the session and the turn's transactions on it."""
    async with open_runtime(model, tools=tools) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        count = 0
        transact = rt.store.transact

        async def counting(fn: Any, session: str | None = None, **kw: Any) -> Any:
            nonlocal count
            count += session == sid
            return await transact(fn, session=session, **kw)

        rt.store.transact = counting  # type: ignore[method-assign]
        await agent.followup("go")
        async with asyncio.timeout(WAIT):
            await agent.when_idle()
        rt.store.transact = transact  # type: ignore[method-assign]
        return rt, sid, count


async def test_an_answer_whose_calls_change_nothing_else_commits_with_what_follows(open_runtime, db_path) -> None:
    seen: dict[str, bool] = {}

    async def look(ctx: ToolContext) -> str:
        seen[ctx.call_id] = answer_committed(db_path, ctx)
        return "looked"

    counts, sessions = {}, []
    for in_store in (True, False):
        model = ScriptedModel([Reply.call("look"), Reply.say("done")])
        _, sid, counts[in_store] = await run_turn(open_runtime, model, [tool("look", look, in_store=in_store)])
        model.assert_done()
        sessions.append(sid)
    async with open_runtime(ScriptedModel([])) as rt:
        orders = [[e.type for e in await rt.store.events_after(sid, 0)] for sid in sessions]
    assert list(seen.values()) == [False, True]  # in the store: not durable yet while it runs; else: durable
    assert counts[True] == counts[False] - 1
    # Both sessions hold the same history, in the same order: the answer, its result, the last answer.
    kinds = [[t for t in order if t in ("assistant/message", "tool/result")] for order in orders]
    assert kinds == [["assistant/message", "tool/result", "assistant/message"]] * 2


async def test_one_call_with_other_effects_makes_the_answer_durable_before_every_call(open_runtime, db_path) -> None:
    seen: dict[str, bool] = {}

    def looker(name: str) -> Any:
        async def look(ctx: ToolContext) -> str:
            seen[name] = answer_committed(db_path, ctx)
            return "looked"

        return look

    model = ScriptedModel([Reply(tool_calls=[ToolCall("inside", {}), ToolCall("outside", {})]), Reply.say("done")])
    await run_turn(
        open_runtime,
        model,
        [tool("inside", looker("inside"), in_store=True), tool("outside", looker("outside"), in_store=False)],
    )
    model.assert_done()
    assert seen == {"inside": True, "outside": True}


async def test_parallel_calls_commit_their_answer_once_before_their_results(open_runtime) -> None:
    async def look(ctx: ToolContext) -> str:
        return "looked"

    model = ScriptedModel([Reply(tool_calls=[ToolCall("look", {}), ToolCall("look", {})]), Reply.say("done")])
    _, sid, _ = await run_turn(open_runtime, model, [tool("look", look, in_store=True)])
    model.assert_done()
    async with open_runtime(ScriptedModel([])) as rt:
        events = await rt.store.events_after(sid, 0)
    kinds = [e.type for e in events if e.type in ("assistant/message", "tool/result")]
    uses = [b["id"] for b in events[[e.type for e in events].index("assistant/message")].data["content"] if "id" in b]
    results = [e.data["toolUseId"] for e in events if e.type == "tool/result"]
    assert kinds == ["assistant/message", "tool/result", "tool/result", "assistant/message"]
    assert len(uses) == 2 and sorted(results) == sorted(uses)


async def test_the_next_call_binds_on_what_a_deferred_answer_spent(open_runtime, monkeypatch) -> None:
    # The guard settles a deferred answer's call at once: the next reservation, checked before the
    # write that carries the answer, sees what the call spent, not its reservation's bound.
    monkeypatch.setattr(spend, "_estimators", {})  # each run's bounds from the same fresh estimator
    small = Usage(input_tokens=1, output_tokens=1)  # below any ratio: the estimator keeps its bound

    async def look(ctx: ToolContext) -> str:
        return "looked"

    async def run(limit: int) -> tuple[list[dict[str, Any]], list[str]]:
        model = ScriptedModel(
            [Reply(tool_calls=[ToolCall("look", {})], usage=small), Reply.say("done", usage=small)],
            name="deferred-spend",
        )
        async with open_runtime(model, tools=[tool("look", look, in_store=True)]) as rt:
            gid = await rt.create_guard(Limits(max_tokens=limit))
            sid = await rt.create_session(guard_id=gid, config={"agent": {"max_tokens": 50}})
            agent = await rt.agent(sid)
            await agent.followup("look")
            async with asyncio.timeout(WAIT):
                await agent.when_idle()
            rows = await rt.store.read(
                lambda conn: [
                    dict(r)
                    for r in conn.execute(
                        "SELECT * FROM model_calls WHERE session_id=? ORDER BY started_at, attempt", (sid,)
                    )
                ]
            )
            ends = [e.data["reason"] for e in await rt.store.events_after(sid, 0, types=[EventType.TURN_END])]
        monkeypatch.setattr(spend, "_estimators", {})
        return rows, ends

    rows, _ = await run(1_000_000)
    first, second = (int(r["reserved_tokens"]) for r in rows)
    # Enough for both calls once the first is counted at what it spent, not while it holds its bound.
    limit = max(first, small.total + second)
    assert first + second > limit
    rows, ends = await run(limit)
    assert [int(r["reserved_tokens"]) for r in rows] == [first, second]
    assert ends == ["end_turn"]


async def test_what_a_call_records_comes_after_the_answer_that_made_it(open_runtime, db_path) -> None:
    seen: list[bool] = []

    async def note(ctx: ToolContext) -> str:
        seen.append(answer_committed(db_path, ctx))

        def run(tx: Tx) -> None:
            tx.emit(ctx.session_id, "test/noted", {"callId": ctx.call_id})

        await ctx.transact(run)
        seen.append(answer_committed(db_path, ctx))
        return "noted"

    model = ScriptedModel([Reply.call("note"), Reply.say("done")])
    _, sid, _ = await run_turn(open_runtime, model, [tool("note", note, in_store=True)])
    model.assert_done()
    async with open_runtime(ScriptedModel([])) as rt:
        types = [e.type for e in await rt.store.events_after(sid, 0)]
    assert seen == [False, True]
    answer, noted, result = (types.index(t) for t in ("assistant/message", "test/noted", "tool/result"))
    assert answer < noted < result


ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import asyncio, sys
from pydantic import BaseModel
from agent import FunctionTool, ModelRegistry, Reply, Runtime, ScriptedModel, ToolRegistry

class NoArgs(BaseModel):
    pass

async def main(location):
    async def look(args, ctx):
        print(ctx.call_id, flush=True)  # the call runs (it changes nothing) until the process is killed
        await asyncio.Event().wait()

    model = ScriptedModel([Reply.call("look")], name="child")
    registry = ModelRegistry()
    registry.add(model)
    registry.default = model.spec
    tools = [FunctionTool("look", "look", NoArgs, look, effects_in_store=True)]
    async with Runtime.open(location, models=registry, tools=lambda row: ToolRegistry(list(tools))) as rt:
        sid = await rt.create_session()
        print(sid, flush=True)
        await (await rt.agent(sid)).followup("look")
        await asyncio.Event().wait()

asyncio.run(main(sys.argv[1]))
"""


async def test_a_kill_while_such_a_call_runs_is_repaired_as_an_interrupted_turn(db_path) -> None:
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD,
        str(db_path),
        stdout=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    try:
        assert child.stdout is not None
        sid = (await asyncio.wait_for(child.stdout.readline(), 60)).decode().strip()
        call_id = (await asyncio.wait_for(child.stdout.readline(), 60)).decode().strip()  # the call runs
    finally:
        child.send_signal(signal.SIGKILL)
        await child.wait()
    assert call_id  # (an empty id would be "in" every event below)
    registry = ModelRegistry()
    model = ScriptedModel([], name="child")
    registry.add(model)
    registry.default = model.spec
    async with Runtime.open(db_path, models=registry, tools=lambda row: ToolRegistry()) as rt:
        events = await rt.store.events_after(sid, 0)
        calls = await rt.store.read(
            lambda conn: [dict(r) for r in conn.execute("SELECT state FROM model_calls WHERE session_id=?", (sid,))]
        )
    types = [e.type for e in events]
    assert EventType.ASSISTANT_MESSAGE not in types and EventType.TOOL_RESULT not in types
    assert not any(call_id in json.dumps(e.data) for e in events)
    assert [e.data["reason"] for e in events if e.type == EventType.TURN_END] == ["interrupted"]
    assert [c["state"] for c in calls] == ["charged_in_full"]
