"""Every claim in an interval is decided, whatever else the interval holds (real SQLite, real bash).

The case that used to lose a claim: a person's follow-up supersedes the goal's queued continuation
and, in the follow-up's own turn, the agent calls ``goal_complete``. The interval then holds both a
superseded continuation and a claim. The engine runs the verification, and:

* it passes: the goal completes at that very idle; the superseded continuation is simply not
  re-issued (no round ever runs);
* it fails: the refusal is counted, and its output reaches the model in the continuation that is
  re-issued (same round number); the agent fixes the work in that round and completes.

The only stand-in is the shipped scripted model; the first turn waits at a gate the test opens,
so the goal's continuation is surely queued behind it when the goal is created.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from goalkit import goal_runtime, wait_status
from test_goal_people import Gate, call, goal_messages, inbox, latest_user, round_of

from agent import ModelRequest, Reply
from goals import GOAL_VERIFIED, Decision, DecisionKind, GoalSpec, GoalStatus, PolicyInput, StopRules, VerifyCommand

CHECK = VerifyCommand(cmd="test -s report.txt || { echo 'report.txt is missing or empty'; exit 1; }", timeout=30)
REFUSED = "Your last completion claim was refused"


@pytest.mark.parametrize("verification", ["passes", "fails"])
async def test_a_claim_in_a_superseding_followups_turn_is_decided(
    verification: str, db_path: Path, tmp_path: Path
) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    gate = Gate()
    continuations: list[str] = []

    async def rule(request: ModelRequest) -> Reply:
        text, step = latest_user(request)
        if text.startswith("Do the slow task"):
            await gate.hold()
            return Reply.say("slow task done")
        if text.startswith("A person asks"):
            if step == 0 and verification == "passes":
                return call("write_file", path="report.txt", content="the report\n")
            if step <= 1:
                return call("goal_complete", summary="report written", evidence="report.txt")
            return Reply.say("claimed")
        assert round_of(text) == 1
        if step == 0:
            continuations.append(text)
            return call("write_file", path="report.txt", content="the report, at last\n")
        if step == 1:
            return call("goal_complete", summary="report written", evidence="report.txt")
        return Reply.say("claimed again")

    decisions: list[tuple[PolicyInput, Decision]] = []
    async with goal_runtime(db_path, rule, f"claims-{verification}", grace=0.2) as (rt, engine, model):
        engine.add_decision_listener(lambda inp, d: decisions.append((inp, d)))
        sid = await rt.create_session(workdir=workdir)
        agent = await rt.agent(sid)
        await agent.followup("Do the slow task first.")
        await gate.reached()
        goal = await engine.create(
            GoalSpec(objective="Write the report.", session_id=sid, verify=[CHECK], rules=StopRules(stall_rounds=5))
        )
        await agent.followup("A person asks: please finish the report now.")
        assert goal_messages(db_path, goal) == [(f"{goal.id}#1", "cancelled", "superseded")]
        gate.opened.set()
        changed = await wait_status(rt, goal, GoalStatus.COMPLETED)
        await engine.settled()
        final = await engine.get(goal.id)
        events = await rt.store.events_after(sid, 0, limit=100_000)
    model.assert_done()

    verified = [e.data for e in events if e.type == GOAL_VERIFIED]
    assert final.status is GoalStatus.COMPLETED and changed["reason"] == "verified"
    first = decisions[0]
    # The first decision is the one at the follow-up's idle: it read the superseded continuation and the claim.
    assert first[0].interval.claims and first[0].interval.cancel_reason == "superseded"
    if verification == "passes":
        assert [d.kind for _, d in decisions] == [DecisionKind.COMPLETE]
        assert [v["passed"] for v in verified] == [True]
        # Not re-issued: the only continuation is the superseded one, and no round ran.
        assert goal_messages(db_path, goal) == [(f"{goal.id}#1", "cancelled", "superseded")]
        assert final.rounds == 0 and final.refused_claims == 0 and continuations == []
    else:
        assert [d.kind for _, d in decisions] == [DecisionKind.REISSUE, DecisionKind.COMPLETE]
        assert first[1].goal.refused_claims == 1 and first[1].round == 1
        assert [v["passed"] for v in verified] == [False, True]
        assert goal_messages(db_path, goal) == [
            (f"{goal.id}#1", "cancelled", "superseded"),
            (f"{goal.id}#1", "admitted", None),
        ]
        # The refusal and its output reached the model in the re-issued continuation.
        (text,) = continuations
        assert REFUSED in text and "report.txt is missing or empty" in text
        reissued = [r for r in inbox(db_path, sid) if r["source_kind"] == "goal"][1]
        assert reissued["text"] == text
        assert final.refused_claims == 1 and final.rounds == 1
