"""A completion claim made while the goal is paused is kept and decided at resume (real SQLite, real bash).

A person prompts a paused goal's session and, in that turn, the agent calls ``goal_complete``.
The tool says the claim will be verified when the goal is resumed; the paused goal only counts
the interval and keeps the claim pending. At resume no continuation is issued first: the claim is
verified at that idle, and the goal completes (verification passes) or the refusal is counted
and its output reaches the next continuation (it fails). The only stand-in is the scripted model.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from goalkit import goal_runtime, wait_status
from test_goal_people import Gate, call, latest_user, round_of, wait_decision

from agent import ModelRequest, Reply
from goals import Decision, DecisionKind, GoalSpec, GoalStatus, PolicyInput, StopRules, VerifyCommand

CHECK = VerifyCommand(cmd="test -s report.txt || { echo 'report.txt is missing or empty'; exit 1; }", timeout=30)
REFUSED = "Your last completion claim was refused"


@pytest.mark.parametrize("verification", ["passes", "fails"])
async def test_a_claim_made_while_paused_is_decided_at_resume(verification: str, db_path: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    gate = Gate()
    continuations: list[str] = []
    tool_results: list[str] = []

    async def rule(request: ModelRequest) -> Reply:
        text, step = latest_user(request)
        if text.startswith("A person asks"):
            if step == 0 and verification == "passes":
                return call("write_file", path="report.txt", content="the report\n")
            if step <= 1:
                return call("goal_complete", summary="report written", evidence="report.txt")
            tool_results.append(str(request.messages[-1]))
            return Reply.say("claimed")
        if round_of(text) == 1:
            await gate.hold()
            return Reply.say("round one, interrupted by a pause")
        if step == 0:
            continuations.append(text)
            return call("write_file", path="report.txt", content="the report, at last\n")
        if step == 1:
            return call("goal_complete", summary="report written", evidence="report.txt")
        return Reply.say("claimed again")

    async with goal_runtime(db_path, rule, f"paused-claim-{verification}", grace=0.2) as (rt, engine, _model):
        kept = asyncio.Event()

        def listen(_inp: PolicyInput, d: Decision) -> None:
            if d.kind is DecisionKind.BOOKKEEP and d.goal.memory.pending_claim is not None:
                kept.set()

        engine.add_decision_listener(listen)
        sid = await rt.create_session(workdir=workdir)
        goal = await engine.create(
            GoalSpec(objective="Write the report.", session_id=sid, verify=[CHECK], rules=StopRules(stall_rounds=5))
        )
        await gate.reached()
        await engine.pause(goal.id)
        gate.opened.set()
        await engine.settled()
        agent = await rt.agent(sid)
        await agent.followup("A person asks: please finish the report now.")
        await wait_decision(kept)
        paused = await engine.get(goal.id)
        assert paused.status is GoalStatus.PAUSED
        assert paused.memory.pending_claim is not None
        assert paused.memory.pending_claim.summary == "report written"
        assert any("verified when the goal is resumed" in r for r in tool_results), tool_results
        await engine.resume(goal.id)
        await wait_status(rt, goal, GoalStatus.COMPLETED)
        await engine.settled()
        final = await engine.get(goal.id)

    assert final.memory.pending_claim is None
    if verification == "passes":
        assert continuations == []  # completed at the resume's idle, before any round ran
        assert final.refused_claims == 0
    else:
        assert len(continuations) == 1 and REFUSED in continuations[0]
        assert "report.txt is missing or empty" in continuations[0]
