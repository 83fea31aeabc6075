"""Subagents: ``delegate(task, tools?)`` runs an isolated child session to idle and owns its life.

Pinned here (issue 7, "Subagents"): the parent receives the child's final response (or its error);
the child's usage is charged to the parent goal (the goal's tokens and cost equal the shared spend
guard's); cancelling the parent cancels the child, and its child in turn; the depth limit holds;
four parents delegating at once under a concurrency limit of 4 do not deadlock (the children run
while the parents hold every slot); a child never gets more than its parent (tools, policy, work
directory, guard); and a child whose delegating call died with the process (a real ``kill -9``) is
settled when the store is next opened: it never runs on its own and its spend reaches the parent.

Every test uses a real SQLite file, a real :class:`~agent.Runtime` and the shipped scripted model,
whose rule tells a child's request from a parent's by the first user message (a child's is the
task, which starts with ``TASK``). The last one runs the real daemon (``goald serve``) against the
local OpenAI-compatible server, with bubblewrap: a child of a goal whose own sandbox has no network
(while the daemon's default has it) gets its goal's sandbox — no network, the goal's secret,
redacted in every tool's result — exactly as its parent, never the daemon-wide default.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import storekit
from harness import Daemon, all_events, rpc, wait_goal
from providers_server import (
    ProviderServer,
    Recorded,
    Respond,
    is_probe,
    oa_call,
    oa_chunk,
    oa_usage,
    openai_stream,
    openai_text,
)
from pydantic import BaseModel

from agent import (
    DEFAULT_MAX_DEPTH,
    OUTCOME_UNKNOWN,
    AgentConfig,
    Delegate,
    EventType,
    FunctionTool,
    Limits,
    ModelErrorKind,
    ModelRegistry,
    ModelRequest,
    Price,
    Reply,
    Runtime,
    ScriptedModel,
    SessionRow,
    SessionSetup,
    Source,
    SourceKind,
    Store,
    TextBlock,
    ToolCall,
    ToolContext,
    ToolRegistry,
    ToolResultBlock,
    Usage,
    create_session,
    enqueue,
    file_tools,
    parse_content,
    usage_of_guard,
)
from agent.redact import Redactor
from agent.subagents import ORPHANED, session_spend
from agent.tools import ToolPolicy
from agent.turns import CANCELLED_TOOL_TEXT
from daemon.client import Connection as Client
from goals import GoalEngine, GoalSpec, GoalStatus, tools_for_goal_sessions

ROOT = Path(__file__).resolve().parents[2]
WAIT = 20.0
PROBE_TOKEN = "probe-token-5Jx8Qw2Lm7"


class NoArgs(BaseModel):
    """No arguments."""


async def _noop(args: NoArgs, ctx: ToolContext) -> str:
    return f"noop ran in {ctx.session_id}"


def noop() -> FunctionTool[NoArgs]:
    return FunctionTool("noop", "does nothing", NoArgs, _noop, repeat_safe=True)


def first_text(request: ModelRequest) -> str:
    """The first user message's text: the task for a child, the prompt for a root."""
    for msg in request.messages:
        if msg.role == "user":
            return "".join(b.text for b in msg.content if isinstance(b, TextBlock))
    return ""


def results(request: ModelRequest) -> list[ToolResultBlock]:
    """Tool results in the prompt, oldest first."""
    return [b for m in request.messages if m.role == "tool" for b in m.content if isinstance(b, ToolResultBlock)]


def tool_names(request: ModelRequest) -> list[str]:
    return sorted(t.name for t in request.tools)


async def events(rt: Runtime, sid: str, type: str | None = None) -> list[Any]:
    page = await rt.store.events_after(sid, 0, limit=100_000)
    return [e for e in page if type is None or e.type == type]


async def children_of(rt: Runtime, sid: str) -> list[SessionRow]:
    ids = await rt.store.read(
        lambda conn: [r["id"] for r in conn.execute("SELECT id FROM sessions WHERE parent_session_id=?", (sid,))]
    )
    return [await rt.session(i) for i in ids]


def opener(db: Path, model: ScriptedModel, tools: list[Any]) -> Any:
    registry = ModelRegistry({model.spec: model}, default=model.spec)
    return Runtime.open(db, models=registry, tools=lambda row: ToolRegistry(list(tools)))


# -- the result -------------------------------------------------------------------------------


async def test_the_parent_receives_the_childs_final_response(db_path: Path, tmp_path: Path) -> None:
    seen: dict[str, ModelRequest] = {}

    def rule(request: ModelRequest) -> Reply:
        done = results(request)
        if first_text(request).startswith("TASK"):
            seen.setdefault("child", request)
            if not done:
                return Reply.call("noop", text="let me look first")
            return Reply.say("the answer is 42")
        if not done:
            return Reply.call("delegate", task="TASK: find the answer", tools=["noop"])
        return Reply.say(f"my subagent said: {done[-1].content}")

    model = ScriptedModel(rule, name="m")
    async with opener(db_path, model, [noop(), Delegate(), *file_tools()]) as rt:
        gid = await rt.create_guard(Limits(max_tokens=1_000_000))
        parent = await rt.create_session(workdir=tmp_path, guard_id=gid, config={"agent": {"max_steps": 7}})
        agent = await rt.agent(parent)
        await agent.followup("please delegate")
        async with asyncio.timeout(WAIT):
            await agent.when_idle()
        (child,) = await children_of(rt, parent)
        tool_result = (await events(rt, parent, EventType.TOOL_RESULT))[0].data
        parent_final = (await events(rt, parent, EventType.ASSISTANT_MESSAGE))[-1].data
        child_queued = (await events(rt, child.id, EventType.MESSAGE_QUEUED))[0].data
        child_ends = await events(rt, child.id, EventType.TURN_END)
        child_status = (await rt.store.session_state(child.id)).status
        child_loaded = child.id in rt.live_agents
    model.assert_done()
    assert tool_result["name"] == "delegate" and not tool_result["isError"]
    # The last committed assistant text of the child's interval, not its first words.
    assert tool_result["content"] == "the answer is 42"
    assert parent_final["content"][0]["text"] == "my subagent said: the answer is 42"
    # An isolated child: its own session under the parent, one subagent message, the task alone in its prompt.
    assert (child.parent_session_id, child.depth) == (parent, 1)
    assert (child.guard_id, child.workdir, child.model) == (gid, str(tmp_path), None)
    assert child.config["agent"] == {"max_steps": 7} and "goal" not in child.config
    assert child.config["subagent"]["tools"] == ["noop"] and child.config["subagent"]["settled"] is True
    use_id = child.config["subagent"]["parentToolUseId"]
    assert child_queued["source"] == {"kind": "subagent", "ref": f"{parent}/{use_id}"}
    assert [m.role for m in seen["child"].messages] == ["user"] and first_text(seen["child"]) == "TASK: find the answer"
    # Never more than asked for (and never more than the parent has).
    assert tool_names(seen["child"]) == ["noop"]
    assert [e.data["reason"] for e in child_ends] == ["end_turn"] and child_status == "idle"
    # Its owner done with it, the child holds no driver task and no history.
    assert not child_loaded


async def test_the_childs_error_is_the_tool_result(db_path: Path) -> None:
    def rule(request: ModelRequest) -> Reply:
        done = results(request)
        if first_text(request).startswith("TASK"):
            if not done:
                return Reply.call("noop", text="halfway there")
            return Reply.fail(ModelErrorKind.BAD_REQUEST, "the provider refused the request")
        if not done:
            return Reply.call("delegate", task="TASK: fail")
        return Reply.say("noted")

    model = ScriptedModel(rule, name="m")
    async with opener(db_path, model, [noop(), Delegate()]) as rt:
        parent = await rt.create_session()
        agent = await rt.agent(parent)
        await agent.followup("go")
        async with asyncio.timeout(WAIT):
            await agent.when_idle()
        out = (await events(rt, parent, EventType.TOOL_RESULT))[0].data
    assert out["isError"]
    assert out["content"].startswith("the subagent's run ended error: ")
    assert "the provider refused the request" in out["content"]
    assert out["content"].endswith("its last answer was:\nhalfway there")


async def test_tools_the_parent_lacks_are_refused(db_path: Path) -> None:
    def rule(request: ModelRequest) -> Reply:
        if not results(request):
            return Reply.call("delegate", task="TASK: anything", tools=["noop", "shell"])
        return Reply.say("ok")

    model = ScriptedModel(rule, name="m")
    async with opener(db_path, model, [noop(), Delegate()]) as rt:
        parent = await rt.create_session()
        agent = await rt.agent(parent)
        await agent.followup("go")
        async with asyncio.timeout(WAIT):
            await agent.when_idle()
        out = (await events(rt, parent, EventType.TOOL_RESULT))[0].data
        kids = await children_of(rt, parent)
    assert out["isError"] and "no tool named shell" in out["content"]
    assert kids == []


async def test_the_child_inherits_the_parents_policy(db_path: Path) -> None:
    seen: dict[str, ModelRequest] = {}

    def rule(request: ModelRequest) -> Reply:
        done = results(request)
        if first_text(request).startswith("TASK"):
            seen["child"] = request
            if not done:
                return Reply.call("write_file", path="x.txt", content="x")
            return Reply.say(done[-1].content)
        if not done:
            return Reply.call("delegate", task="TASK: write x.txt")
        return Reply.say("ok")

    model = ScriptedModel(rule, name="m")
    policy = ToolPolicy(allow=["delegate", "noop", "read_file"])
    registry = ModelRegistry({model.spec: model}, default=model.spec)

    def resolve(row: SessionRow) -> SessionSetup:
        tools = ToolRegistry([noop(), Delegate(), *file_tools()], policy=policy)
        return SessionSetup(model=registry.get(row.model), tools=tools)

    async with Runtime.open(db_path, resolver=resolve) as rt:
        parent = await rt.create_session()
        agent = await rt.agent(parent)
        await agent.followup("go")
        async with asyncio.timeout(WAIT):
            await agent.when_idle()
        (child,) = await children_of(rt, parent)
        out = (await events(rt, parent, EventType.TOOL_RESULT))[0].data
    # The child is offered only what the parent's policy allows, and the policy binds its calls.
    assert tool_names(seen["child"]) == ["delegate", "noop", "read_file"]
    assert child.config["subagent"]["tools"] == ["noop", "delegate", "read_file"]
    assert out["content"].startswith("denied by policy:") and not out["isError"]


# -- spend --------------------------------------------------------------------------------------


async def test_the_childs_usage_is_charged_to_the_parent_goal(db_path: Path, tmp_path: Path) -> None:
    def rule(request: ModelRequest) -> Reply:
        done = results(request)
        if first_text(request).startswith("TASK"):
            if not done:
                look = ToolCall("list_dir", {"path": "."})
                return Reply(tool_calls=[look], usage=Usage(input_tokens=1200, output_tokens=300))
            return Reply.say("the directory is empty", usage=Usage(input_tokens=1500, output_tokens=80))
        if not done:
            return Reply.call("delegate", task="TASK: look at the work directory")
        if len(done) == 1:
            return Reply.call("goal_complete", summary="delegated", evidence=done[-1].content)
        return Reply.say("done")

    price = Price(input=2.0, output=8.0)
    model = ScriptedModel(rule, name="g", price=price)
    registry = ModelRegistry({model.spec: model}, default=model.spec)
    workdir = tmp_path / "work"
    workdir.mkdir()
    tools = lambda row: ToolRegistry([*file_tools(), Delegate(), *tools_for_goal_sessions(row.config)])  # noqa: E731
    async with Runtime.open(db_path, models=registry, tools=tools) as rt:
        async with GoalEngine.running(rt, timer_interval=0.05) as engine:
            finished = asyncio.Event()
            engine.add_decision_listener(lambda inp, decision: finished.set())
            goal = await engine.create(GoalSpec(objective="delegate the look", workdir=str(workdir)))
            async with asyncio.timeout(WAIT):
                await finished.wait()
            goal = await engine.get(goal.id)
            (child,) = await children_of(rt, goal.session_id)
            charged = await events(rt, goal.session_id, EventType.MODEL_CHARGED)
            child_tokens, child_cost = await rt.store.transact(lambda tx: session_spend(tx, child.id))
            own = await events(rt, goal.session_id, EventType.ASSISTANT_MESSAGE)
            guard_tokens, guard_cost = await rt.store.transact(lambda tx: usage_of_guard(tx, goal.guard_id))
            live = await rt.guard(goal.guard_id)
    assert goal.status is GoalStatus.COMPLETED
    # The child spent on the goal's guard and its spend is recorded once in the goal's session.
    assert child.guard_id == goal.guard_id
    assert child_tokens == 1200 + 300 + 1500 + 80
    assert [(c.data["subagentSessionId"], c.data["tokens"]) for c in charged] == [(child.id, child_tokens)]
    assert charged[0].data["cost"] == pytest.approx(child_cost)
    own_tokens = sum(sum(e.data["usage"].values()) for e in own)
    assert goal.tokens == own_tokens + child_tokens
    # What the goal counts is what the shared guard spent, in the store and in memory.
    assert goal.tokens == guard_tokens == live.spent_tokens
    assert goal.cost == pytest.approx(guard_cost) and goal.cost == pytest.approx(live.spent_cost)
    assert "goal_complete" not in child.config["subagent"]["tools"]


async def test_a_budget_binds_parent_and_child_together(db_path: Path) -> None:
    def rule(request: ModelRequest) -> Reply:
        done = results(request)
        if first_text(request).startswith("TASK"):
            return Reply.say("spent", usage=Usage(input_tokens=5000, output_tokens=0))
        if not done:
            call = ToolCall("delegate", {"task": "TASK: spend"})
            return Reply(tool_calls=[call], usage=Usage(input_tokens=10, output_tokens=10))
        return Reply.say("never")

    model = ScriptedModel(rule, name="budget", max_tokens=100)
    async with opener(db_path, model, [Delegate()]) as rt:
        gid = await rt.create_guard(Limits(max_tokens=6000))
        parent = await rt.create_session(guard_id=gid)
        agent = await rt.agent(parent)
        await agent.followup("go")
        async with asyncio.timeout(WAIT):
            await agent.when_idle()
        ends = await events(rt, parent, EventType.TURN_END)
    # The child's 5,000 tokens left too little of the shared 6,000 for the parent's next call.
    assert ends[-1].data["reason"] == "budget"


# -- cancellation -------------------------------------------------------------------------------


async def test_cancelling_the_parent_cancels_the_child_and_its_child(db_path: Path) -> None:
    grandchild_calling = asyncio.Event()

    def rule(request: ModelRequest) -> Reply:
        done = results(request)
        task = first_text(request)
        if task == "TASK: deeper":
            grandchild_calling.set()
            return Reply.say("too late", delay=60)  # a slow model: only a cancel ends this test in time
        if task.startswith("TASK"):
            return Reply.call("delegate", task="TASK: deeper") if not done else Reply.say("child never")
        return Reply.call("delegate", task="TASK: start") if not done else Reply.say("parent never")

    model = ScriptedModel(rule, name="m")
    async with opener(db_path, model, [Delegate()]) as rt:
        gid = await rt.create_guard(Limits(max_tokens=1_000_000))
        root = await rt.create_session(guard_id=gid)
        agent = await rt.agent(root)
        await agent.followup("go")
        async with asyncio.timeout(WAIT):
            await grandchild_calling.wait()
            await agent.interrupt()
        (child,) = await children_of(rt, root)
        (grandchild,) = await children_of(rt, child.id)
        tree = (root, child.id, grandchild.id)
        ends = {s: [e.data["reason"] for e in await events(rt, s, EventType.TURN_END)] for s in tree}
        statuses = {s: (await rt.store.session_state(s)).status for s in tree}
        loaded = [s for s in tree if s in rt.live_agents]
        root_result = (await events(rt, root, EventType.TOOL_RESULT))[0].data
        charged = {s: await events(rt, s, EventType.MODEL_CHARGED) for s in tree}
        spends = {s: await rt.store.transact(lambda tx, s=s: session_spend(tx, s)) for s in (root, child.id)}
        guard_tokens, _ = await rt.store.transact(lambda tx: usage_of_guard(tx, gid))
    assert ends == {root: ["cancelled"], child.id: ["cancelled"], grandchild.id: ["cancelled"]}
    assert set(statuses.values()) == {"idle"} and loaded == [root]
    assert root_result["content"] == CANCELLED_TOOL_TEXT and root_result["isError"]
    # The grandchild's open reservation is charged in full, and its spend flows up to the root.
    (held,) = charged[grandchild.id]
    assert held.data["tokens"] > 0
    (up_one,) = [c for c in charged[child.id] if c.data.get("subagentSessionId") == grandchild.id]
    assert up_one.data["tokens"] == held.data["tokens"]
    (up_two,) = [c for c in charged[root] if c.data.get("subagentSessionId") == child.id]
    assert up_two.data["tokens"] == spends[child.id][0]
    assert spends[root][0] == guard_tokens


# -- depth --------------------------------------------------------------------------------------


async def test_the_depth_limit_holds(db_path: Path) -> None:
    offered: dict[int, list[str]] = {}

    def rule(request: ModelRequest) -> Reply:
        done = results(request)
        task = first_text(request)
        depth = task.count(">") if task.startswith("TASK") else 0
        offered.setdefault(depth, tool_names(request))
        if done:
            return Reply.say(f"depth {depth} heard: {done[-1].content}")
        # Every level tries to go one deeper, the deepest one too (with a tool it was not given).
        return Reply.call("delegate", task="TASK " + ">" * (depth + 1))

    model = ScriptedModel(rule, name="m")
    async with opener(db_path, model, [noop(), Delegate()]) as rt:
        root = await rt.create_session()
        agent = await rt.agent(root)
        await agent.followup("go deep")
        async with asyncio.timeout(WAIT):
            await agent.when_idle()
        (child,) = await children_of(rt, root)
        (grandchild,) = await children_of(rt, child.id)
        deepest = await children_of(rt, grandchild.id)
        final = (await events(rt, root, EventType.ASSISTANT_MESSAGE))[-1].data["content"][0]["text"]
        refused = (await events(rt, grandchild.id, EventType.TOOL_RESULT))[0].data
    assert DEFAULT_MAX_DEPTH == 2
    assert (child.depth, grandchild.depth, deepest) == (1, 2, [])
    assert offered == {0: ["delegate", "noop"], 1: ["delegate", "noop"], 2: ["noop"]}
    assert refused["isError"] and refused["content"].startswith("unknown tool 'delegate'")
    assert final == "depth 0 heard: depth 1 heard: depth 2 heard: " + refused["content"]


async def test_a_session_at_the_limit_cannot_delegate_even_when_given_the_tool(db_path: Path) -> None:
    def rule(request: ModelRequest) -> Reply:
        if not results(request):
            return Reply.call("delegate", task="TASK: deeper")
        return Reply.say("ok")

    model = ScriptedModel(rule, name="m")
    async with opener(db_path, model, [Delegate(max_depth=1)]) as rt:
        # A session at depth 1 loaded on its own, through a resolver that offers delegate anyway.
        root = await rt.create_session()
        deep = await rt.create_session(parent_session_id=root)
        agent = await rt.agent(deep)
        await agent.followup("go")
        async with asyncio.timeout(WAIT):
            await agent.when_idle()
        out = (await events(rt, deep, EventType.TOOL_RESULT))[0].data
        kids = await children_of(rt, deep)
    assert out["isError"] and out["content"] == "delegate refused: the subagent depth limit is 1"
    assert kids == []


# -- slots --------------------------------------------------------------------------------------


async def test_four_parents_delegating_at_once_under_a_limit_of_four_do_not_deadlock(db_path: Path) -> None:
    slots = asyncio.Semaphore(4)
    arrived: list[str] = []
    all_four = asyncio.Event()
    slots_when_all_four_ran: list[bool] = []

    async def rule(request: ModelRequest) -> Reply:
        done = results(request)
        task = first_text(request)
        if task.startswith("TASK"):
            # Each child waits until all four children are running at once: they can only do so
            # while the four parents hold every slot, waiting in their delegate calls.
            arrived.append(task)
            if len(arrived) == 4:
                slots_when_all_four_ran.append(slots.locked())
                all_four.set()
            await all_four.wait()
            return Reply.say(f"answer to {task}")
        if not done:
            return Reply.call("delegate", task=f"TASK for {task}")
        return Reply.say(f"{task} got: {done[-1].content}")

    model = ScriptedModel(rule, name="m")
    registry = ModelRegistry({model.spec: model}, default=model.spec)

    def resolve(row: SessionRow) -> SessionSetup:
        # As the daemon's host does: every session loaded by the resolver runs its turns under a
        # slot of one shared limit.
        return SessionSetup(
            model=registry.get(row.model), tools=ToolRegistry([Delegate()]), config=AgentConfig(), slot=lambda: slots
        )

    async with Runtime.open(db_path, resolver=resolve) as rt:
        roots = [await rt.create_session() for _ in range(4)]
        agents = [await rt.agent(s) for s in roots]
        for i, agent in enumerate(agents):
            await agent.followup(f"parent {i}")
        async with asyncio.timeout(WAIT):
            await asyncio.gather(*(a.when_idle() for a in agents))
        finals = [(await events(rt, s, EventType.ASSISTANT_MESSAGE))[-1].data["content"][0]["text"] for s in roots]
    assert slots_when_all_four_ran == [True]
    assert finals == [f"parent {i} got: answer to TASK for parent {i}" for i in range(4)]


# -- crashes (store contract: on SQLite and on PostgreSQL) ------------------------------------

CRASHING_PARENT = r"""
import asyncio, sys
from agent import Delegate, Limits, ModelRegistry, Reply, Runtime, ScriptedModel, ToolRegistry

def rule(request):
    first = request.messages[0].content[0].text
    if first.startswith("TASK"):
        print("CHILD CALLING", flush=True)
        return Reply.say("never", delay=60)
    return Reply.call("delegate", task="TASK: slow")

async def main():
    model = ScriptedModel(rule, name="m")
    registry = ModelRegistry({model.spec: model}, default=model.spec)
    async with Runtime.open(sys.argv[1], models=registry, tools=lambda row: ToolRegistry([Delegate()])) as rt:
        gid = await rt.create_guard(Limits(max_tokens=1_000_000))
        sid = await rt.create_session(guard_id=gid)
        print(sid, gid, flush=True)
        agent = await rt.agent(sid)
        await agent.followup("go")
        await asyncio.sleep(3600)

asyncio.run(main())
"""


@pytest.mark.both_stores
async def test_a_child_whose_call_died_with_the_process_is_settled_at_open(db_path: Path | str) -> None:
    env = {k: v for k, v in os.environ.items() if "API_KEY" not in k}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CRASHING_PARENT, str(db_path),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(WAIT):
            root, gid = (await proc.stdout.readline()).decode().split()
            assert await proc.stdout.readline() == b"CHILD CALLING\n"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        await proc.wait()
    assert proc.returncode == -signal.SIGKILL

    model = ScriptedModel([], name="m")  # nothing may run after the restart
    async with opener(db_path, model, [Delegate()]) as rt:
        (child,) = await children_of(rt, root)
        root_ends = [e.data["reason"] for e in await events(rt, root, EventType.TURN_END)]
        child_ends = [e.data["reason"] for e in await events(rt, child.id, EventType.TURN_END)]
        root_result = (await events(rt, root, EventType.TOOL_RESULT))[0].data
        (held,) = await events(rt, child.id, EventType.MODEL_CHARGED)
        (up,) = await events(rt, root, EventType.MODEL_CHARGED)
        root_tokens, _ = await rt.store.transact(lambda tx: session_spend(tx, root))
        guard_tokens, _ = await rt.store.transact(lambda tx: usage_of_guard(tx, gid))
    model.assert_done()
    assert model.call_count == 0
    assert root_ends == ["interrupted"] and child_ends == ["interrupted"]
    assert root_result["content"] == OUTCOME_UNKNOWN
    assert child.config["subagent"]["settled"] is True
    assert (up.data["subagentSessionId"], up.data["tokens"]) == (child.id, held.data["tokens"])
    assert root_tokens == guard_tokens


@pytest.mark.both_stores
async def test_an_orphans_queued_task_is_cancelled_not_run(db_path: Path | str) -> None:
    # The durable state a crash leaves between the delegate call's enqueue and the child's first turn.
    store = await Store.open(db_path)
    try:

        def plant(tx: Any) -> tuple[str, str]:
            root = create_session(tx)
            child = create_session(tx, parent_session_id=root, config={"subagent": {"tools": []}})
            enqueue(tx, child, parse_content("TASK: orphaned"), source=Source(kind=SourceKind.SUBAGENT, ref=root))
            enqueue(tx, root, parse_content("a message of the root's own"))
            return root, child

        root, child = await store.transact(plant)
    finally:
        await store.close()

    model = ScriptedModel([Reply.say("the root's own turn")], name="m")
    async with opener(db_path, model, [Delegate()]) as rt:
        agent = await rt.agent(root)
        async with asyncio.timeout(WAIT):
            await agent.when_idle()
        row = await rt.session(child)
        status = (await rt.store.session_state(child)).status
        loaded = child in rt.live_agents
    model.assert_done()
    assert first_text(model.calls[0].request) == "a message of the root's own"
    with contextlib.closing(storekit.connect(db_path)) as conn:
        fates = conn.execute("SELECT fate, cancel_reason FROM inbox WHERE session_id=?", (child,)).fetchall()
    assert [tuple(f) for f in fates] == [("cancelled", ORPHANED)]
    assert row.config["subagent"]["settled"] is True and status == "idle" and not loaded


async def test_an_interrupt_with_discard_catches_a_turn_opened_a_moment_before(db_path: Path) -> None:
    # What abandoning a child relies on: a turn committed open just before the discard, whose task the
    # driver has not started yet when interrupt() begins, is still ended ``cancelled``.
    model = ScriptedModel([Reply.say("too late", delay=60)], name="m")
    async with opener(db_path, model, []) as rt:
        sid = await rt.create_session()
        agent = await rt.agent(sid)
        interrupts: list[asyncio.Task[None]] = []

        def on_event(event: Any) -> None:
            # Runs while the turn/start commit is published, before the driver resumes from it.
            if event.session_id == sid and event.type == EventType.TURN_START:
                interrupts.append(asyncio.get_running_loop().create_task(agent.interrupt(discard_queued=True)))

        remove = rt.store.hub.add_listener(on_event)
        await agent.followup("go")
        async with asyncio.timeout(WAIT):
            await agent.when_idle()
            (interrupting,) = interrupts
            await interrupting
        remove()
        ends = [e.data["reason"] for e in await events(rt, sid, EventType.TURN_END)]
    assert ends == ["cancelled"]


# -- the sandbox: a child of a goal's session gets its goal's, never the daemon-wide default --------


class DelegatingServer(ProviderServer):
    """The local OpenAI-compatible server, answering by who asks (scripted per request, not in order).

    A goal's session runs the probe in its shell and delegates the same probe to a subagent, then
    claims completion; the subagent (its task starts with ``TASK``) runs the probe, reads the file
    the probe wrote and answers; a plain session (its prompt starts with ``CONTROL``) runs the probe
    and answers.
    """

    def __init__(self, probe: str) -> None:
        super().__init__()
        self.probe = probe

    async def _read_request(self, reader: asyncio.StreamReader) -> Recorded | None:
        request = await super()._read_request(reader)
        if request is not None and not is_probe(request):  # a window probe is answered apart
            self.add(self._respond(request))  # taken by this same request, right after
        return request

    def _respond(self, request: Recorded) -> Respond:
        messages = request.body["messages"]
        first = next(m["content"] for m in messages if m["role"] == "user")
        results = sum(1 for m in messages if m["role"] == "tool")
        if first.startswith(("TASK", "CONTROL")):
            if results == 0:
                return self._calls([("probe", "shell", {"command": self.probe})])
            if results == 1 and first.startswith("TASK"):
                return self._calls([("read", "read_file", {"path": "token.txt"})])
            return Respond.stream(openai_text(["probed"], usage=oa_usage(20, 2)))
        if results == 0:
            return self._calls(
                [
                    ("parent-probe", "shell", {"command": self.probe}),
                    ("delegate", "delegate", {"task": "TASK: run the probe", "tools": ["shell", "read_file"]}),
                ]
            )
        if results == 2:
            claim = {"summary": "probed", "evidence": "the probes ran"}
            return self._calls([("claim", "goal_complete", claim)])
        return Respond.stream(openai_text(["Done."], usage=oa_usage(30, 2)))

    @staticmethod
    def _calls(calls: list[tuple[str, str, dict[str, Any]]]) -> Respond:
        chunks = [oa_chunk(role="assistant", content="")]
        chunks += [
            oa_chunk(tool_calls=[oa_call(i, id=cid, name=name, args=json.dumps(args))])
            for i, (cid, name, args) in enumerate(calls)
        ]
        chunks += [oa_chunk(finish="tool_calls"), oa_chunk(no_choices=True, usage=oa_usage(20, 10))]
        return Respond.stream(openai_stream(chunks))


def shell_results(events: list[dict[str, Any]]) -> dict[str, str]:
    return {e["data"]["toolUseId"]: e["data"]["content"] for e in events if e["type"] == "tool/result"}


@pytest.mark.needs_bwrap
async def test_a_subagent_of_a_network_off_goal_gets_the_goals_sandbox_not_the_daemons(tmp_path: Path) -> None:
    # The daemon's default gives commands the network; the goal's own sandbox takes it away and gives
    # its commands a secret. The child's shell must run under the goal's sandbox exactly as its parent's.
    connections: list[str] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append("connected")
        writer.close()

    listener = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    probe = (
        f"if (echo hi > /dev/tcp/127.0.0.1/{port}) 2>/dev/null; then echo NETWORK-ON; else echo NETWORK-OFF; fi; "
        'echo "token=${PROBE_TOKEN:-unset}"; printf %s "${PROBE_TOKEN:-unset}" > token.txt'
    )
    async with DelegatingServer(probe) as server:
        config = {
            "sandbox_network": True,
            "providers": {
                "local": {"kind": "openai", "base_url": server.url + "/v1", "api_key_env": "SUBAGENT_TEST_API_KEY"}
            },
            "goal_sandbox": {"netoff": {"network": False, "secrets": {"PROBE_TOKEN": {"env": "SUBAGENT_TEST_TOKEN"}}}},
        }
        d = Daemon(tmp_path / "state", config=config)
        try:
            d.start(extra_env={"SUBAGENT_TEST_API_KEY": "sk-subagent-test-1234", "SUBAGENT_TEST_TOKEN": PROBE_TOKEN})
            created = await rpc(
                d.socket_path, "goal/create", {"objective": "Probe the sandbox.", "key": "netoff", "model": "local:m"}
            )
            goal = await wait_goal(d.socket_path, created["goalId"], {"completed", "paused", "failed"})
            sessions = (await rpc(d.socket_path, "session/list", {}))["sessions"]
            [child] = [s for s in sessions if s["parentSessionId"] == created["sessionId"]]
            parent_events = await all_events(d.socket_path, created["sessionId"])
            child_events = await all_events(d.socket_path, child["sessionId"])
            # The control: a plain session under the daemon's default sandbox does have the network.
            plain = await rpc(d.socket_path, "session/new", {"model": "local:m"})
            async with await Client.connect(d.socket_path) as client:
                await client.call("session/subscribe", {"sessionId": plain["sessionId"], "afterSeq": 0})
                await client.call("session/prompt", {"sessionId": plain["sessionId"], "text": "CONTROL: probe"})
                async with asyncio.timeout(WAIT):
                    while True:
                        note = await client.next_notification()
                        if note["method"] == "session.status" and note["params"]["status"] == "idle":
                            break
            plain_events = await all_events(d.socket_path, plain["sessionId"])
            assert d.terminate() == 0
        finally:
            d.close()
        server.assert_done()
    listener.close()
    await listener.wait_closed()

    assert goal["status"] == "completed"
    sandboxed = "exit code: 0\n--- stdout ---\nNETWORK-OFF\ntoken=[redacted]"
    parent = shell_results(parent_events)
    assert parent["parent-probe"] == sandboxed
    assert parent["delegate"] == "probed"  # the child's final answer came back
    # The child: the goal's sandbox — no network, the goal's secret, redacted as in its parent, also
    # where another tool than the shell comes across it.
    child_results = shell_results(child_events)
    assert child_results["probe"] == sandboxed
    assert child_results["read"] == "[redacted]"
    assert shell_results(plain_events)["probe"] == "exit code: 0\n--- stdout ---\nNETWORK-ON\ntoken=unset"
    assert connections == ["connected"]  # the control's, and only it
    stored = json.dumps([parent_events, child_events])
    assert PROBE_TOKEN not in stored


async def test_a_subagent_loaded_alone_keeps_its_redaction_and_no_more_tools(db_path: Path, tmp_path: Path) -> None:
    # A child whose delegating call is gone (e.g. a restart) may be loaded through the resolver: its
    # tools are narrowed to those it was given, and their results are still redacted.
    secret = "tool-secret-Zq81Lm"
    work = tmp_path / "work"
    work.mkdir()
    (work / "token.txt").write_text(f"token={secret}\n")

    def rule(request: ModelRequest) -> Reply:
        if not results(request):
            return Reply.call("read_file", path="token.txt")
        return Reply.say("done")

    model = ScriptedModel(rule, name="m")
    registry = ModelRegistry({model.spec: model}, default=model.spec)

    def resolve(row: SessionRow) -> SessionSetup:
        tools = ToolRegistry(
            [*file_tools(), Delegate()], redactor=Redactor([secret]), unavailable={"shell": "no sandbox here"}
        )
        return SessionSetup(model=model, tools=tools)

    async with Runtime.open(db_path, models=registry, resolver=resolve) as rt:
        root = await rt.create_session(workdir=work)
        child = await rt.create_session(
            parent_session_id=root, workdir=work, config={"subagent": {"tools": ["read_file", "shell"]}}
        )
        agent = await rt.agent(child)
        offered = sorted(agent.tools.names)
        unavailable = dict(agent.tools.unavailable)
        await agent.followup("TASK: read the token")
        async with asyncio.timeout(WAIT):
            await agent.when_idle()
        out = (await events(rt, child, EventType.TOOL_RESULT))[0].data
        stored = await events(rt, child)
    assert offered == ["read_file"]
    assert unavailable == {"shell": "no sandbox here"}
    assert out["content"].strip() == "token=[redacted]"
    assert all(secret not in json.dumps(e.data) for e in stored)
