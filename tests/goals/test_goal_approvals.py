"""An ``ask`` shell policy: a command the patterns do not allow becomes an approval question (real
SQLite, real bubblewrap, real files).

"approve once" runs the same command once (the next time it is asked about again); "approve for
this goal" lets it run from then on without asking (listed on the goal, revocable); "deny" reaches
the model as a denial. A line that is not one simple command is offered whole and said to be
compound. Without a goal (nobody to ask) such a call is denied. The only stand-in is the scripted model.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from goalkit import goal_runtime, wait_status
from sandboxkit import sandbox_in
from test_goal_people import call, latest_user

from agent import ModelRequest, Reply, Shell, ToolContext, ToolPolicy, ToolRegistry
from agent.sandbox import Sandbox
from goals import GoalSpec, GoalStatus
from goals.approvals import APPROVE_GOAL, APPROVE_ONCE, DENY

pytestmark = pytest.mark.needs_bwrap

LINE = "echo one >> log.txt"
COMPOUND = "echo $(id -u) > id.txt"


def _sandbox(ctx: ToolContext) -> Sandbox:
    assert ctx.workdir is not None
    return sandbox_in(ctx.workdir)


def _results(request: ModelRequest) -> list[str]:
    """The tool results the model has seen since the last user message."""
    last = max(i for i, m in enumerate(request.messages) if m.role == "user")
    out = []
    for m in request.messages[last + 1 :]:
        for b in m.content:
            content = getattr(b, "content", None)
            if isinstance(content, str):
                out.append(content)
    return out


async def test_approve_once_for_the_goal_and_deny(db_path: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    seen: dict[str, list[str]] = {}
    heard: list[str] = []

    def rule(request: ModelRequest) -> Reply:
        text, step = latest_user(request)
        phase = "start"
        for name, said in (("once", "approved once"), ("goal", "approved for this goal"), ("deny", "denied")):
            if said in text:
                phase = name
        seen.setdefault(phase, []).extend(r for r in _results(request) if r not in seen.get(phase, []))
        if phase == "start":
            return call("shell", command=LINE) if step == 0 else Reply.say("asked")
        if phase == "once":  # runs once; the second time it is asked about again
            return call("shell", command=LINE) if step < 2 else Reply.say("asked again")
        if phase == "goal":  # runs twice without asking; the compound line is asked about
            if step < 2:
                return call("shell", command=LINE)
            return call("shell", command=COMPOUND) if step == 2 else Reply.say("asked about the compound line")
        if step == 0:
            heard.append(text)
            return call("goal_complete", summary="done", evidence="log.txt")
        return Reply.say("done")

    shell = Shell(_sandbox, default_timeout=30)
    async with goal_runtime(db_path, rule, "approver", extra_tools=[shell]) as (rt, engine, _model):
        sid = await rt.create_session(workdir=workdir)
        goal = await engine.create(GoalSpec(objective="Log a line.", session_id=sid, tools=["ask:shell"]))

        last = [0]

        async def asked(_n: int) -> Any:
            last[0] = (await wait_status(rt, goal, GoalStatus.WAITING, after=last[0]))["seq"]
            await engine.settled()
            waiting = await engine.get(goal.id)
            assert waiting.memory.question is not None
            return await engine.question(waiting.memory.question.id)

        q1 = await asked(0)
        assert q1.kind == "approval" and q1.options == [APPROVE_ONCE, APPROVE_GOAL, DENY]
        assert q1.text == f"Approve this shell command?\n{LINE}" and q1.subject == f"shell: {LINE}"
        assert not (workdir / "log.txt").exists()  # not run while asked about
        assert any("not run:" in r and q1.id in r for r in seen["start"]), seen

        await engine.answer(goal.id, None, option=1)
        q2 = await asked(1)
        assert q2.id != q1.id and q2.subject == q1.subject
        assert (workdir / "log.txt").exists(), seen  # approved once: ran once
        assert (workdir / "log.txt").read_text() == "one\n"
        assert (await engine.get(goal.id)).memory.approved_once == []

        await engine.answer(goal.id, None, APPROVE_GOAL)
        q3 = await asked(2)
        assert (workdir / "log.txt").read_text() == "one\n" * 3  # ran twice more without asking
        assert (await engine.get(goal.id)).memory.approvals == [f"shell: {LINE}"]
        assert q3.text.startswith(f"Approve this shell command?\n{COMPOUND}\nIt is not one simple command (")
        assert "command substitution" in q3.text, q3.text
        assert not (workdir / "id.txt").exists()

        await engine.answer(goal.id, None, option=3)
        await wait_status(rt, goal, GoalStatus.COMPLETED)
        assert "denied" in heard[0] and COMPOUND in heard[0]
        assert not (workdir / "id.txt").exists()

        revoked = await engine.revoke(goal.id, f"shell: {LINE}")
        assert revoked.memory.approvals == []
        with pytest.raises(ValueError, match="has no approval"):
            await engine.revoke(goal.id, "shell: nothing")
        closed = await engine.questions(goal.id)
        assert [(q.kind, q.answer) for q in reversed(closed)] == [
            ("approval", APPROVE_ONCE),
            ("approval", APPROVE_GOAL),
            ("approval", DENY),
        ]


async def test_without_a_goal_an_asked_call_is_denied(tmp_path: Path) -> None:
    """A session with nobody to ask: the call is denied, saying so, and nothing runs."""
    policy = ToolPolicy.from_entries(["ask:shell"])
    registry = ToolRegistry([Shell(_sandbox)], policy=policy)
    ctx = ToolContext(session_id="s", turn_id="t", call_id="c", workdir=tmp_path)
    out = await registry.call("shell", {"command": "touch x"}, ctx)
    assert out.is_error and "nobody can be asked here" in out.content
    assert re.search(r"matches no allowed pattern", out.content)
    assert not (tmp_path / "x").exists()


def test_ask_entries_parse_and_a_pattern_asks_only_about_what_it_matches() -> None:
    policy = ToolPolicy.from_entries(["read_file", "shell:ls *", "ask:shell:rm *"])
    assert policy.check("shell", {"command": "ls -la"}) is None
    denied = policy.check("shell", {"command": "rm -rf build"})
    assert denied is not None
    ask = policy.asks("shell", {"command": "rm -rf build"}, denied)
    assert ask is not None and ask.command == "rm -rf build" and ask.compound is None
    other = policy.check("shell", {"command": "curl example.org"})
    assert policy.asks("shell", {"command": "curl example.org"}, other) is None  # denied, not asked
    # A line that is not simple matches only '*': 'rm *' does not offer it.
    line = "rm -rf $HOME"
    assert policy.asks("shell", {"command": line}, policy.check("shell", {"command": line})) is None
    everything = ToolPolicy.from_entries(["ask:shell"])
    ask = everything.asks("shell", {"command": line}, everything.check("shell", {"command": line}))
    assert ask is not None and ask.compound is not None and "parameter" in ask.compound
    tools = ToolPolicy.from_entries(["read_file", "ask:write_file"])
    assert tools.allows_tool("write_file")
    assert tools.check("write_file", {"path": "a"}) == "the policy asks before every call of 'write_file'"
    wf = tools.asks("write_file", {"path": "a"}, tools.check("write_file", {"path": "a"}))
    assert wf is not None and wf.key == 'write_file {"path": "a"}'
    with pytest.raises(ValueError, match="ask entry needs"):
        ToolPolicy.from_entries(["ask:"])
