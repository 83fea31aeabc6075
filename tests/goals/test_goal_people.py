"""People and goals, and goals across restarts, on each store (a real SQLite file, a real PostgreSQL
database).

A person's follow-up supersedes a goal's queued continuation and runs first; steering joins a
running goal turn. Pause, edit (``engine.update``), resume and cancel are durable: each test closes
the runtime and the engine, checks the goal's row through a second connection, reopens the
same store, and watches the engine carry on by itself. A continuation queued when the process stops
is recognized by its ``MessageId`` after the restart and never issued twice.

The only stand-in is the shipped scripted model. A model step that must be "in flight" at a given
moment waits on a gate the test opens; closing a runtime while a step waits interrupts that turn
after the runtime's grace period, as a shutdown does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shlex
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import storekit
from goalkit import goal_runtime, wait_status

from agent import (
    CancelReason,
    EventType,
    MessageId,
    ModelRequest,
    Reply,
    TextBlock,
    ToolCall,
)
from goals import (
    GOAL_VERIFIED,
    Budgets,
    ContinuationFate,
    Decision,
    DecisionKind,
    Goal,
    GoalSpec,
    GoalStatus,
    PolicyInput,
    StopRules,
    VerifyCommand,
)

#: The store contract: every test here runs on SQLite and on PostgreSQL.
pytestmark = pytest.mark.both_stores

Rule = Callable[[ModelRequest], Reply | Awaitable[Reply]]
Listener = Callable[[PolicyInput, Decision], None]
RULES = StopRules(stall_rounds=5, error_backoff_seconds=0.01)


class Gate:
    """A point a model step waits at until the test opens it."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.opened = asyncio.Event()

    async def hold(self) -> None:
        self.entered.set()
        await self.opened.wait()

    async def reached(self, within: float = 30.0) -> None:
        async with asyncio.timeout(within):
            await self.entered.wait()


def _text(msg: Any) -> str:
    return "".join(b.text for b in msg.content if isinstance(b, TextBlock))


def latest_user(request: ModelRequest, pattern: str = "") -> tuple[str, int]:
    """The text of the latest user message (matching ``pattern``), and how many model steps followed it."""
    msgs = list(request.messages)
    for i in range(len(msgs) - 1, -1, -1):
        if msgs[i].role == "user" and re.search(pattern, _text(msgs[i])):
            return _text(msgs[i]), sum(1 for m in msgs[i + 1 :] if m.role == "assistant")
    raise AssertionError("no such user message in the request")


def round_of(text: str) -> int | None:
    found = re.search(r"\bRound (\d+)\b", text)
    return int(found.group(1)) if found else None


def call(name: str, **args: Any) -> Reply:
    return Reply(tool_calls=[ToolCall(name, args)])


async def wait_decision(seen: asyncio.Event, within: float = 30.0) -> None:
    async with asyncio.timeout(within):
        await seen.wait()


def stored(db_path: Path | str, sql: str, *args: Any) -> list[dict[str, Any]]:
    """Rows read through a second, independent connection."""
    with contextlib.closing(storekit.connect(db_path)) as conn:
        return [dict(r) for r in conn.execute(sql, args).fetchall()]


def goal_row(db_path: Path | str, goal: Goal) -> dict[str, Any]:
    (row,) = stored(db_path, "SELECT * FROM goals WHERE id=?", goal.id)
    return row


def inbox(db_path: Path, session_id: str) -> list[dict[str, Any]]:
    """Every inbox row of a session, oldest first, with its text."""
    rows = stored(db_path, "SELECT * FROM inbox WHERE session_id=? ORDER BY queued_seq", session_id)
    return [{**r, "text": "".join(b.get("text", "") for b in json.loads(r["content"]))} for r in rows]


def goal_messages(db_path: Path, goal: Goal) -> list[tuple[str, str, str | None]]:
    """(source ref, fate, cancel reason) of the goal's continuations, oldest first."""
    return [
        (r["source_ref"], r["fate"], r["cancel_reason"])
        for r in inbox(db_path, goal.session_id)
        if r["source_kind"] == "goal"
    ]


def session_status(db_path: Path, session_id: str) -> str:
    """The session's status as its latest durable ``status`` event records it."""
    (row,) = stored(
        db_path, "SELECT data FROM events WHERE session_id=? AND type='status' ORDER BY seq DESC LIMIT 1", session_id
    )
    return str(json.loads(row["data"])["status"])


# -- a person's follow-up and steering --------------------------------------------------------------


async def test_a_persons_followup_supersedes_the_queued_continuation_and_runs_first(
    db_path: Path, tmp_path: Path
) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    gate = Gate()
    answered: list[str] = []

    async def rule(request: ModelRequest) -> Reply:
        text, step = latest_user(request)
        if step == 0:
            answered.append(text.splitlines()[0] if round_of(text) is None else f"round {round_of(text)}")
        if text.startswith("Do the slow task"):
            await gate.hold()
            return Reply.say("slow task done")
        if text.startswith("A person asks"):
            return Reply.say("it is going fine")
        if step == 0:
            return call("goal_complete", summary="done", evidence="nothing to check")
        return Reply.say("claimed")

    decisions: list[tuple[PolicyInput, Decision]] = []
    person = MessageId.new()
    async with goal_runtime(db_path, rule, "people", grace=0.2) as (rt, engine, model):
        engine.add_decision_listener(lambda inp, d: decisions.append((inp, d)))
        sid = await rt.create_session(workdir=workdir)
        agent = await rt.agent(sid)
        await agent.followup("Do the slow task first.")
        await gate.reached()

        # The agent is busy: the goal's round-1 continuation waits in the queue.
        goal = await engine.create(GoalSpec(objective="Report when done.", session_id=sid, rules=RULES))
        assert goal.session_id == sid and goal.continuation_round == 1
        assert goal_messages(db_path, goal) == [(f"{goal.id}#1", "queued", None)]
        # A person's follow-up supersedes it, in the follow-up's own transaction.
        await agent.followup("A person asks: how is it going?", message_id=person)
        assert goal_messages(db_path, goal) == [(f"{goal.id}#1", "cancelled", "superseded")]
        gate.opened.set()

        changed = await wait_status(rt, goal, GoalStatus.COMPLETED)
        await engine.settled()
        final = await engine.get(goal.id)
        events = await rt.store.events_after(sid, 0, limit=100_000)
    model.assert_done()

    assert final.status is GoalStatus.COMPLETED and changed["reason"] == "no_verification"
    # The person's message ran before the goal's round; the round was re-issued with number 1.
    assert answered == ["Do the slow task first.", "A person asks: how is it going?", "round 1"]
    assert goal_messages(db_path, goal) == [
        (f"{goal.id}#1", "cancelled", "superseded"),
        (f"{goal.id}#1", "admitted", None),
    ]
    first, reissued = (r for r in inbox(db_path, sid) if r["source_kind"] == "goal")
    assert first["id"] == goal.continuation_id != reissued["id"] == final.continuation_id
    assert first["text"] == reissued["text"]
    cancelled = [e.data for e in events if e.type == EventType.MESSAGE_CANCELLED]
    assert cancelled == [{"messageId": first["id"], "reason": "superseded", "by": person}]
    admitted = [e.data["messageId"] for e in events if e.type == EventType.MESSAGE_ADMITTED]
    assert admitted[1:] == [person, reissued["id"]]
    # The interval with the person's turn was no round; the re-issue was its decision.
    assert [d.kind for _, d in decisions] == [DecisionKind.REISSUE, DecisionKind.COMPLETE]
    assert decisions[0][0].interval.continuation_fate is ContinuationFate.CANCELLED
    assert decisions[0][1].round == 1 and decisions[0][1].goal.rounds == 0
    assert final.rounds == 1


async def test_steering_joins_the_running_goal_turn(db_path: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    gate = Gate()
    saw_steer: list[bool] = []

    async def rule(request: ModelRequest) -> Reply:
        text, step = latest_user(request, r"\bRound \d+\b")
        assert round_of(text) == 1
        if step == 0:
            await gate.hold()
            return call("write_file", path="report.md", content="body\n")
        if step == 1:
            saw_steer.append(_text(request.messages[-1]) == "Also add a title line.")
            return call("write_file", path="report.md", content="# Title\nbody\n")
        if step == 2:
            return call("goal_complete", summary="report written with a title", evidence="report.md")
        return Reply.say("done")

    steer = MessageId.new()
    async with goal_runtime(db_path, rule, "steered", grace=0.2) as (rt, engine, model):
        goal = await engine.create(GoalSpec(objective="Write report.md.", workdir=str(workdir), rules=RULES))
        await gate.reached()
        await rt.live_agents[goal.session_id].steer("Also add a title line.", message_id=steer)
        gate.opened.set()
        await wait_status(rt, goal, GoalStatus.COMPLETED)
        await engine.settled()
        final = await engine.get(goal.id)
        events = await rt.store.events_after(goal.session_id, 0, limit=100_000)
    model.assert_done()

    rows = {r["id"]: r for r in inbox(db_path, goal.session_id)}
    assert rows[steer]["delivery"] == "steer" and rows[steer]["fate"] == "admitted"
    # Admitted into the goal's own running turn, at its next model step; the continuation stood.
    assert rows[steer]["turn_id"] == rows[goal.continuation_id]["turn_id"]
    assert saw_steer == [True]
    assert goal_messages(db_path, goal) == [(f"{goal.id}#1", "admitted", None)]
    assert len([e for e in events if e.type == EventType.TURN_START]) == 1
    assert final.status is GoalStatus.COMPLETED and final.rounds == 1
    assert (workdir / "report.md").read_text() == "# Title\nbody\n"


# -- durable across a restart -----------------------------------------------------------------------


async def test_pause_edit_and_resume_are_durable_across_restarts(db_path: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()

    # 1. Round 2 is running when a person pauses the goal; the turn finishes, nothing new starts.
    gate = Gate()

    async def first_rule(request: ModelRequest) -> Reply:
        text, step = latest_user(request)
        n = round_of(text)
        if step == 0:
            if n == 2:
                await gate.hold()
            return call("write_file", path=f"part{n}.md", content=f"part {n}\n")
        return Reply.say(f"part {n} written")

    bookkept = asyncio.Event()
    async with goal_runtime(db_path, first_rule, "restarts", grace=0.2) as (rt, engine, model):
        engine.add_decision_listener(lambda inp, d: bookkept.set() if d.kind is DecisionKind.BOOKKEEP else None)
        goal = await engine.create(
            GoalSpec(objective="Write parts.", workdir=str(workdir), budgets=Budgets(max_rounds=10), rules=RULES)
        )
        await gate.reached()
        paused = await engine.pause(goal.id)
        assert paused.status is GoalStatus.PAUSED and paused.status_reason == "by_request"
        gate.opened.set()
        await wait_decision(bookkept)
        # Edited while paused: a new objective and a smaller round limit.
        edited = await engine.update(
            goal.id, objective="Write parts, each with a header.", budgets=Budgets(max_rounds=4)
        )
        assert edited.status is GoalStatus.PAUSED
    model.assert_done()
    assert model.call_count == 4

    row = goal_row(db_path, goal)
    assert (row["status"], row["status_reason"], row["rounds"]) == ("paused", "by_request", 2)
    assert row["objective"] == "Write parts, each with a header."
    assert json.loads(row["budgets"])["max_rounds"] == 4
    assert goal_messages(db_path, goal) == [(f"{goal.id}#{i}", "admitted", None) for i in (1, 2)]
    assert session_status(db_path, goal.session_id) == "idle"

    # 2. Reopened: still paused, nothing runs by itself. Resumed: round 3 starts with the edits;
    #    the process stops while it runs.
    gate = Gate()
    seen: list[str] = []

    async def second_rule(request: ModelRequest) -> Reply:
        text, _ = latest_user(request)
        seen.append(text)
        await gate.hold()  # still running when the runtime closes
        raise AssertionError("unreachable")

    async with goal_runtime(db_path, second_rule, "restarts", grace=0.2) as (rt, engine, model):
        await engine.settled()
        assert (await engine.get(goal.id)).status is GoalStatus.PAUSED
        assert model.call_count == 0
        resumed = await engine.resume(goal.id)
        assert resumed.status is GoalStatus.ACTIVE and resumed.continuation_round == 3
        await gate.reached()
    assert len(seen) == 1
    assert "Write parts, each with a header." in seen[0] and "Round 3 of 4." in seen[0]

    row = goal_row(db_path, goal)
    assert (row["status"], row["status_reason"]) == ("active", None)
    assert goal_messages(db_path, goal) == [(f"{goal.id}#{i}", "admitted", None) for i in (1, 2, 3)]
    ends = stored(db_path, "SELECT end_reason FROM turns WHERE session_id=? ORDER BY start_seq", goal.session_id)
    assert [e["end_reason"] for e in ends] == ["end_turn", "end_turn", "interrupted"]

    # 3. Reopened: the engine resumes the goal by itself, round 3 (cut short by the stop, not
    #    counted) runs again, and the edited round limit ends it after round 4.
    rounds_seen: list[int | None] = []

    def third_rule(request: ModelRequest) -> Reply:
        text, step = latest_user(request)
        n = round_of(text)
        if step == 0:
            rounds_seen.append(n)
            return call("write_file", path=f"part{n}.md", content=f"# Part {n}\n")
        return Reply.say(f"part {n} written")

    async with goal_runtime(db_path, third_rule, "restarts", grace=0.2) as (rt, engine, model):
        changed = await wait_status(rt, goal, GoalStatus.EXHAUSTED)
        await engine.settled()
        final = await engine.get(goal.id)
    model.assert_done()

    assert rounds_seen == [3, 4]
    assert final.status is GoalStatus.EXHAUSTED and final.status_reason == "round_limit" == changed["reason"]
    assert (final.rounds, final.infra_rounds, final.infra_streak) == (4, 1, 0)
    refs = [f"{goal.id}#{i}" for i in (1, 2, 3)] + [f"{goal.id}#3/retry1", f"{goal.id}#4"]
    assert goal_messages(db_path, goal) == [(ref, "admitted", None) for ref in refs]


async def test_edited_verification_is_durable_and_checks_the_next_claim(db_path: Path, tmp_path: Path) -> None:
    """Verification commands edited while paused survive a restart, and the next claim is checked
    with them (the old command never runs). Each command logs its runs outside the work directory."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    runs = tmp_path / "runs.log"

    def check(name: str, script: str) -> VerifyCommand:
        return VerifyCommand(cmd=f"echo {name} >> {shlex.quote(str(runs))}\necho {name}-check\n{script}", timeout=30)

    old = [check("old", "true")]  # would pass any claim
    new = [check("new", 'echo "answer is $(cat answer.txt)"; test "$(cat answer.txt)" = 42')]

    # 1. Round 1 is running when the goal is paused; its verification is edited while paused.
    gate = Gate()

    async def first_rule(request: ModelRequest) -> Reply:
        await gate.hold()
        return Reply.say("still reading")

    bookkept = asyncio.Event()
    async with goal_runtime(db_path, first_rule, "reverify", grace=0.2) as (rt, engine, model):
        engine.add_decision_listener(lambda inp, d: bookkept.set() if d.kind is DecisionKind.BOOKKEEP else None)
        goal = await engine.create(
            GoalSpec(objective="Put the answer (42) in answer.txt.", workdir=str(workdir), verify=old, rules=RULES)
        )
        await gate.reached()
        await engine.pause(goal.id)
        gate.opened.set()
        await wait_decision(bookkept)
        edited = await engine.update(goal.id, verify=new)
        assert edited.verify == new and edited.status is GoalStatus.PAUSED
    model.assert_done()

    row = goal_row(db_path, goal)
    assert [VerifyCommand.model_validate(v) for v in json.loads(row["verify"])] == new
    assert not runs.exists()

    # 2. Reopened and resumed: the first claim (answer 41) is refused by the new command, the
    #    second (answer 42) passes it.
    seen: list[str] = []

    def second_rule(request: ModelRequest) -> Reply:
        text, step = latest_user(request, r"\bRound \d+\b")
        if step == 0:
            seen.append(text)
        answer = "42" if "refused" in text else "41"
        steps = [
            call("write_file", path="answer.txt", content=answer),
            call("goal_complete", summary=f"answered {answer}", evidence="answer.txt"),
            Reply.say("claimed"),
        ]
        return steps[step]

    async with goal_runtime(db_path, second_rule, "reverify", grace=0.2) as (rt, engine, model):
        await engine.settled()
        assert (await engine.get(goal.id)).verify == new
        await engine.resume(goal.id)
        await wait_status(rt, goal, GoalStatus.COMPLETED)
        await engine.settled()
        final = await engine.get(goal.id)
        events = await rt.store.events_after(goal.session_id, 0, limit=100_000)
    model.assert_done()

    assert final.status is GoalStatus.COMPLETED and final.refused_claims == 1 and final.result_summary == "answered 42"
    assert runs.read_text().splitlines() == ["new", "new"]
    verified = [e.data for e in events if e.type == GOAL_VERIFIED]
    assert [(v["passed"], [r["cmd"] for r in v["results"]]) for v in verified] == [
        (False, [new[0].cmd]),
        (True, [new[0].cmd]),
    ]
    assert "new-check" in verified[0]["results"][0]["output_tail"]
    assert "answer is 41" in verified[0]["results"][0]["output_tail"]
    # The refusal, with the new command's output, reached the next round; the old command is nowhere.
    assert len(seen) == 2 and "answer is 41" in seen[1] and "new-check" in seen[1]
    assert not any("old-check" in text for text in seen)


async def test_cancel_is_durable_across_a_restart(db_path: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    gate = Gate()

    async def rule(request: ModelRequest) -> Reply:
        text, _ = latest_user(request)
        assert text.startswith("Do the slow task")
        await gate.hold()  # interrupted by the cancel
        raise AssertionError("unreachable")

    async with goal_runtime(db_path, rule, "cancelled", grace=0.2) as (rt, engine, model):
        sid = await rt.create_session(workdir=workdir)
        agent = await rt.agent(sid)
        await agent.followup("Do the slow task first.")
        await gate.reached()
        goal = await engine.create(GoalSpec(objective="Report when done.", session_id=sid, rules=RULES))
        assert goal_messages(db_path, goal) == [(f"{goal.id}#1", "queued", None)]

        # Cancel: the queued continuation is cancelled and the running turn is interrupted.
        cancelled = await engine.cancel(goal.id)
        assert cancelled.status is GoalStatus.CANCELLED
        snap = await agent.when_idle()
        assert snap.status == "idle"
        await engine.settled()
    assert model.call_count == 1

    row = goal_row(db_path, goal)
    assert (row["status"], row["status_reason"]) == ("cancelled", "by_request")
    assert goal_messages(db_path, goal) == [(f"{goal.id}#1", "cancelled", "goal cancelled")]
    ends = stored(db_path, "SELECT end_reason FROM turns WHERE session_id=?", sid)
    assert [e["end_reason"] for e in ends] == ["cancelled"]

    # Reopened: the goal stays cancelled; nothing is queued, nothing runs.
    async with goal_runtime(db_path, [], "cancelled", grace=0.2) as (rt, engine, model):
        await engine.settled()
        assert (await engine.get(goal.id)).status is GoalStatus.CANCELLED
        assert await engine.list_goals(GoalStatus.ACTIVE) == []
        assert (await rt.store.session_state(sid)).status == "idle"
        assert sid not in rt.live_agents
    model.assert_done()
    assert model.call_count == 0
    assert [r["fate"] for r in inbox(db_path, sid)] == ["admitted", "cancelled"]


@pytest.mark.parametrize(
    ("how", "reason"),
    [("cancel_message", "the person withdrew it"), ("interrupt_discarding", CancelReason.DISCARDED.value)],
)
async def test_a_continuation_cancelled_by_anything_else_pauses_the_goal_with_that_reason(
    how: str, reason: str, db_path: Path, tmp_path: Path
) -> None:
    """Not superseded, so not re-issued: the goal pauses, saying why, and stays paused across a restart."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    gate = Gate()

    async def rule(request: ModelRequest) -> Reply:
        text, _ = latest_user(request)
        assert text.startswith("Do the slow task"), "only the person's message may reach the model"
        await gate.hold()
        return Reply.say("slow task done")

    decisions: list[tuple[PolicyInput, Decision]] = []
    async with goal_runtime(db_path, rule, "withdrawn", lambda inp, d: decisions.append((inp, d)), grace=0.2) as (
        rt,
        engine,
        model,
    ):
        sid = await rt.create_session(workdir=workdir)
        agent = await rt.agent(sid)
        await agent.followup("Do the slow task first.")
        await gate.reached()
        goal = await engine.create(GoalSpec(objective="Report when done.", session_id=sid, rules=RULES))
        assert goal_messages(db_path, goal) == [(f"{goal.id}#1", "queued", None)]

        # Cancelled by the agent's own API, not by a person's follow-up and not by the engine.
        if how == "cancel_message":
            assert goal.continuation_id is not None
            await agent.cancel_message(goal.continuation_id, reason=reason)
            gate.opened.set()  # the person's turn finishes normally
        else:
            await agent.interrupt(discard_queued=True)  # the person's turn ends cancelled
        changed = await wait_status(rt, goal, GoalStatus.PAUSED)
        await engine.settled()
        paused = await engine.get(goal.id)
    assert model.call_count == 1

    expected = f"continuation cancelled: {reason}"
    assert paused.status is GoalStatus.PAUSED and paused.status_reason == expected == changed["reason"]
    assert paused.rounds == 0
    (kind,) = [d.kind for _, d in decisions]
    assert kind is DecisionKind.PAUSE
    assert decisions[0][0].interval.continuation_fate is ContinuationFate.CANCELLED
    assert decisions[0][0].interval.cancel_reason == reason
    # Durable: the row says so through a second connection; the continuation was never re-issued.
    row = goal_row(db_path, goal)
    assert (row["status"], row["status_reason"], row["rounds"]) == ("paused", expected, 0)
    assert goal_messages(db_path, goal) == [(f"{goal.id}#1", "cancelled", reason)]
    ends = stored(db_path, "SELECT end_reason FROM turns WHERE session_id=?", sid)
    assert [e["end_reason"] for e in ends] == (["end_turn"] if how == "cancel_message" else ["cancelled"])

    # Reopened: still paused with that reason; nothing is queued, decided or run.
    reopened: list[tuple[PolicyInput, Decision]] = []
    async with goal_runtime(db_path, [], "withdrawn", lambda inp, d: reopened.append((inp, d)), grace=0.2) as (
        rt,
        engine,
        model,
    ):
        await engine.settled()
        again = await engine.get(goal.id)
        assert (again.status, again.status_reason) == (GoalStatus.PAUSED, expected)
        assert (await rt.store.session_state(sid)).status == "idle"
    model.assert_done()
    assert model.call_count == 0 and reopened == []
    assert goal_row(db_path, goal)["revision"] == row["revision"]
    assert goal_messages(db_path, goal) == [(f"{goal.id}#1", "cancelled", reason)]


async def test_an_active_goal_resumes_by_itself_exactly_once(db_path: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()

    # 1. The process stops while the goal's round-1 continuation is still queued behind a
    #    person's turn.
    gate = Gate()

    async def busy(request: ModelRequest) -> Reply:
        await gate.hold()  # interrupted by the shutdown
        raise AssertionError("unreachable")

    async with goal_runtime(db_path, busy, "resumes", grace=0.2) as (rt, engine, model):
        sid = await rt.create_session(workdir=workdir)
        await (await rt.agent(sid)).followup("Do the slow task first.")
        await gate.reached()
        goal = await engine.create(
            GoalSpec(objective="Write done.md.", session_id=sid, workdir=str(workdir), rules=RULES)
        )
    first_id = goal.continuation_id
    assert first_id is not None
    assert goal_messages(db_path, goal) == [(f"{goal.id}#1", "queued", None)]
    assert goal_row(db_path, goal)["continuation_id"] == first_id

    # 2. Started again: the runtime runs the queued continuation; the engine, finding it queued
    #    (then running), adds nothing. The process stops again mid-round.
    gate = Gate()

    async def round_one(request: ModelRequest) -> Reply:
        text, _ = latest_user(request)
        assert round_of(text) == 1
        await gate.hold()
        raise AssertionError("unreachable")

    decisions: list[tuple[PolicyInput, Decision]] = []
    record: Listener = lambda inp, d: decisions.append((inp, d))  # noqa: E731
    async with goal_runtime(db_path, round_one, "resumes", record, grace=0.2) as (rt, engine, model):
        await gate.reached()
        await engine.settled()
        assert decisions == []
        rows = [r for r in inbox(db_path, sid) if r["source_kind"] == "goal"]
        assert [(r["id"], r["fate"]) for r in rows] == [(first_id, "admitted")]
    assert model.call_count == 1

    # 3. Started again at idle: the engine decides by itself, once: round 1, cut short by the stop,
    #    is not counted and runs again (the same number, a retry's ref).
    def finish(request: ModelRequest) -> Reply:
        text, step = latest_user(request)
        assert round_of(text) == 1
        if step == 0:
            return call("write_file", path="done.md", content="done\n")
        if step == 1:
            return call("goal_complete", summary="wrote done.md", evidence="done.md exists")
        return Reply.say("finished")

    async with goal_runtime(db_path, finish, "resumes", record, grace=0.2) as (rt, engine, model):
        await wait_status(rt, goal, GoalStatus.COMPLETED)
        await engine.settled()
        final = await engine.get(goal.id)
    model.assert_done()

    assert [d.kind for _, d in decisions] == [DecisionKind.CONTINUE, DecisionKind.COMPLETE]
    start_input, start_decision = decisions[0]
    assert start_input.interval.continuation_fate is ContinuationFate.ADMITTED
    assert start_input.goal.continuation_id == first_id and start_decision.round == 1
    rows = [r for r in inbox(db_path, sid) if r["source_kind"] == "goal"]
    assert [(r["source_ref"], r["fate"]) for r in rows] == [
        (f"{goal.id}#1", "admitted"),
        (f"{goal.id}#1/retry1", "admitted"),
    ]
    assert rows[0]["id"] == first_id and rows[1]["id"] == final.continuation_id
    assert final.status is GoalStatus.COMPLETED and (final.rounds, final.infra_rounds) == (1, 1)
    ends = stored(db_path, "SELECT end_reason FROM turns WHERE session_id=? ORDER BY start_seq", sid)
    assert [e["end_reason"] for e in ends] == ["interrupted", "interrupted", "end_turn"]
