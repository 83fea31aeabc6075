"""The goal engine end to end on a real SQLite file: rounds to completion, the goal tools, bad input.

The only stand-in is the shipped scripted model, driven by a rule that reads the round number from
the continuation it was given ("Round N"). Verification commands are real subprocesses in the
goal's real work directory; the file tools write real files there.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from goalkit import goal_runtime, wait_status
from pydantic import ValidationError

from agent import (
    Conflict,
    EventType,
    InvalidInput,
    InvalidTransition,
    ModelRegistry,
    ModelRequest,
    NotFound,
    Reply,
    Runtime,
    ScriptedModel,
    SessionId,
    TextBlock,
    ToolRegistry,
    file_tools,
)
from goals import (
    GOAL_PROGRESS,
    GOAL_VERIFIED,
    Budgets,
    ContinuationFate,
    Decision,
    DecisionKind,
    Goal,
    GoalEngine,
    GoalId,
    GoalSpec,
    GoalStatus,
    PolicyInput,
    StopRules,
    VerifyCommand,
    VerifyResult,
    decide,
    run_command,
    tools_for_goal_sessions,
)

#: The store contract: every test here runs on SQLite and on PostgreSQL.
pytestmark = pytest.mark.both_stores

TABLES = ("goals", "sessions", "inbox", "events", "guards")
Rule = Callable[[ModelRequest], Reply | Awaitable[Reply]]


def _text(msg: Any) -> str:
    return "".join(b.text for b in msg.content if isinstance(b, TextBlock))


def where_am_i(request: ModelRequest) -> tuple[int, int, str]:
    """(round, model steps already taken in it, the continuation's text) from a model request."""
    msgs = list(request.messages)
    for i in range(len(msgs) - 1, -1, -1):
        if msgs[i].role != "user":
            continue
        text = _text(msgs[i])
        found = re.search(r"\bRound (\d+)\b", text)
        if found:
            steps = sum(1 for m in msgs[i + 1 :] if m.role == "assistant")
            return int(found.group(1)), steps, text
    raise AssertionError("no continuation in the request")


async def counts(rt: Runtime) -> dict[str, int]:
    """Rows in every table a goal writes to."""
    return await rt.store.read(
        lambda conn: {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}
    )


async def continuations(rt: Runtime, goal: Goal) -> list[dict[str, Any]]:
    """The goal's continuation inbox rows, oldest first."""
    rows = await rt.store.read(
        lambda conn: conn.execute(
            "SELECT * FROM inbox WHERE session_id=? AND source_kind='goal' ORDER BY queued_seq", (goal.session_id,)
        ).fetchall()
    )
    return [dict(r) for r in rows]


def content_of(row: dict[str, Any]) -> str:
    return "".join(b.get("text", "") for b in json.loads(row["content"]))


# -- 1. rounds to a verified completion -------------------------------------------------------------


async def test_five_rounds_then_a_verified_completion(db_path: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()

    holder: dict[str, Any] = {}

    async def rule(request: ModelRequest) -> Reply:
        n, step, _ = where_am_i(request)
        if n == 3 and step == 0:
            # A person writes while round 3 runs: their turn follows before the session is idle.
            await holder["rt"].live_agents[holder["sid"]].followup("A person asks: how is it going?")
        if step == 0:
            return Reply.call("write_file", path=f"f{n}.txt", content=f"part {n}\n")
        if n == 5 and step == 1:
            return Reply.call("goal_complete", summary="wrote f1..f5", evidence="all five files exist")
        return Reply.say(f"step {n} written")

    decisions: list[tuple[PolicyInput, Decision]] = []
    async with goal_runtime(db_path, rule) as (rt, engine, model):
        engine.add_decision_listener(lambda inp, d: decisions.append((inp, d)))
        goal = await engine.create(
            GoalSpec(
                objective="Write the files f1.txt to f5.txt, one per step.",
                workdir=str(workdir),
                budgets=Budgets(max_rounds=10),
                verify=[VerifyCommand(cmd="test -f f5.txt", timeout=30)],
                rules=StopRules(stall_rounds=2, error_backoff_seconds=0.01),
            )
        )
        holder.update(rt=rt, sid=goal.session_id)
        assert goal.status is GoalStatus.ACTIVE and goal.continuation_round == 1
        changed = await wait_status(rt, goal, GoalStatus.COMPLETED)
        await engine.settled()
        final = await engine.get(goal.id)
        rows = await continuations(rt, goal)
        events = await rt.store.events_after(goal.session_id, 0, limit=100_000)
    model.assert_done()

    assert final.status is GoalStatus.COMPLETED and final.status_reason == "verified"
    assert final.rounds == 5 and changed["rounds"] == 5
    assert final.result_summary == "wrote f1..f5" and final.evidence == "all five files exist"
    assert sorted(p.name for p in workdir.iterdir()) == [f"f{i}.txt" for i in range(1, 6)]

    # Exactly five continuations, round 1..5, each admitted once, each in its own turn.
    assert [r["source_ref"] for r in rows] == [f"{goal.id}#{i}" for i in range(1, 6)]
    assert [r["fate"] for r in rows] == ["admitted"] * 5
    assert len({r["turn_id"] for r in rows}) == 5
    admitted = [e.data["messageId"] for e in events if e.type == EventType.MESSAGE_ADMITTED]
    assert sorted(a for a in admitted if a in {r["id"] for r in rows}) == sorted(r["id"] for r in rows)
    assert all(f"Round {i} of 10." in content_of(r) for i, r in enumerate(rows, 1))

    # The decisions: four continuations, then completion, each taken from its inputs alone.
    assert [d.kind for _, d in decisions] == [DecisionKind.CONTINUE] * 4 + [DecisionKind.COMPLETE]
    assert [d.round for _, d in decisions] == [2, 3, 4, 5, None]
    for inp, decision in decisions:
        assert decide(inp) == decision
        assert inp.interval.continuation_fate is ContinuationFate.ADMITTED
    last_inp, last = decisions[-1]
    assert [r.cmd for r in last_inp.verification or []] == ["test -f f5.txt"]
    assert all(r.passed for r in last_inp.verification or [])
    assert last.goal.status is GoalStatus.COMPLETED and last.goal.rounds == 5
    assert final.tokens == sum(inp.interval.tokens for inp, _ in decisions) > 0

    # Decided only at whole-agent idle, never at turn/end: each decision's interval ends on a
    # committed `status: idle` event, one decision per idle, and the rounds' turn/ends lie inside.
    by_seq = {e.seq: e for e in events}
    idles = [e.seq for e in events if e.type == EventType.STATUS and e.data["status"] == "idle"]
    ends = [inp.interval.end_seq for inp, _ in decisions]
    assert ends == idles
    for end in ends:
        assert by_seq[end].type == EventType.STATUS and by_seq[end].data["status"] == "idle"
    # Round 3's turn/end was not an idle (the person's turn followed): still one decision for it.
    turn_ends = [e.seq for e in events if e.type == EventType.TURN_END]
    per_interval = [sum(lo < t <= hi for t in turn_ends) for lo, hi in zip([0, *ends], ends, strict=False)]
    assert per_interval == [1, 1, 2, 1, 1]
    assert [inp.interval.turns for inp, _ in decisions] == per_interval
    person = [e for e in events if e.type == EventType.MESSAGE_ADMITTED and e.data["source"]["kind"] != "goal"]
    assert len(person) == 1 and ends[1] < person[0].seq < ends[2]
    # Each next continuation was queued after the idle it was decided at.
    queued = [r["queued_seq"] for r in rows]
    assert all(end < q for end, q in zip(ends, queued[1:], strict=False))


# -- a stale or replayed idle changes nothing ---------------------------------------------------------


async def goal_state(rt: Runtime, goal: Goal) -> dict[str, Any]:
    """What an evaluation could write: the goal row, its continuations and its session's goal events."""

    def run(conn: Any) -> dict[str, Any]:
        row = dict(conn.execute("SELECT * FROM goals WHERE id=?", (goal.id,)).fetchone())
        sent = conn.execute(
            "SELECT id, fate FROM inbox WHERE session_id=? AND source_kind='goal' ORDER BY queued_seq",
            (goal.session_id,),
        ).fetchall()
        marks = conn.execute(
            "SELECT seq, type FROM events WHERE session_id=? AND type LIKE 'goal/%' ORDER BY seq", (goal.session_id,)
        ).fetchall()
        return {"goal": row, "continuations": [tuple(r) for r in sent], "goal_events": [tuple(r) for r in marks]}

    return await rt.store.read(run)


async def test_a_stale_or_replayed_idle_changes_nothing(db_path: Path, tmp_path: Path) -> None:
    """The engine is driven by hand (its listener and timers stopped), so each ``evaluate`` is one
    decision at a known moment: a replay of an idle already decided, a decision whose idle was
    overtaken by a person's message while the verification ran, and an evaluation while a turn runs."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    person_gate, round_2_entered, round_2_gate = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def rule(request: ModelRequest) -> Reply:
        last = _text(request.messages[-1]) if request.messages[-1].role == "user" else ""
        if last.startswith("A person asks"):
            await person_gate.wait()
            return Reply.say("it is going fine")
        n, step, _ = where_am_i(request)
        if n == 1:
            return [Reply.call("write_file", path="draft.txt", content="draft\n"), Reply.say("drafted")][step]
        if step == 0:
            round_2_entered.set()
            await round_2_gate.wait()
        return [
            Reply.call("write_file", path="done.txt", content="done\n"),
            Reply.call("goal_complete", summary="done.txt written", evidence="done.txt exists"),
            Reply.say("claimed"),
        ][step]

    runs: list[str] = []
    interfere: list[Callable[[], Awaitable[None]]] = []

    async def runner(command: VerifyCommand, where: Path) -> VerifyResult:
        # The real check; on request, a person's message arrives while it runs (a newer status).
        runs.append(command.cmd)
        if interfere:
            await interfere.pop()()
        return await run_command(command, where)

    model = ScriptedModel(rule, name="g")
    registry = ModelRegistry({model.spec: model}, default=model.spec)

    def tools(row: Any) -> ToolRegistry:
        return ToolRegistry(list(file_tools()) + tools_for_goal_sessions(row.config))

    async with Runtime.open(db_path, models=registry, tools=tools) as rt:
        engine = GoalEngine(rt, runner=runner)
        await engine.start()
        await engine.stop()  # migrated; from here on it decides only when the test calls evaluate()
        decisions: list[Decision] = []
        engine.add_decision_listener(lambda inp, d: decisions.append(d))
        goal = await engine.create(
            GoalSpec(
                objective="Write done.txt.",
                workdir=str(workdir),
                verify=[VerifyCommand(cmd="test -f done.txt", timeout=30)],
                rules=StopRules(stall_rounds=5),
            )
        )
        agent = await rt.agent(goal.session_id)
        async with asyncio.timeout(30):
            await agent.when_idle()

        # Round 1 ran; at its idle the engine issues round 2 (the enqueue makes the session busy in
        # the same transaction), and round 2's first model step holds.
        decided = await engine.evaluate(goal.id)
        assert isinstance(decided, Decision) and decided.kind is DecisionKind.CONTINUE and decided.round == 2
        async with asyncio.timeout(30):
            await round_2_entered.wait()
        after_round_1 = await goal_state(rt, goal)
        assert [f for _, f in after_round_1["continuations"]] == ["admitted", "admitted"]

        # The same idle replayed: a newer status (running) exists, so nothing is decided or written.
        assert await engine.evaluate(goal.id) is None
        assert await goal_state(rt, goal) == after_round_1

        round_2_gate.set()
        async with asyncio.timeout(30):
            await agent.when_idle()
        # Round 2 claimed completion. While the check runs, a person writes: the idle the engine
        # read is no longer the session's latest status when it comes to commit.
        at_claim = await goal_state(rt, goal)
        seq_at_claim = (await rt.store.session_state(goal.session_id)).last_seq

        async def person() -> None:
            await agent.followup("A person asks: how is it going?")

        interfere.append(person)
        assert await engine.evaluate(goal.id) is None  # stale, and the session is busy
        assert runs == ["test -f done.txt"]  # the check did run …
        assert await goal_state(rt, goal) == at_claim  # … but nothing of its decision was written
        newer = await rt.store.events_after(goal.session_id, seq_at_claim, limit=1000)
        assert newer and not any(e.type.startswith("goal/") for e in newer)
        assert {e.type for e in newer} <= {
            EventType.MESSAGE_QUEUED,
            EventType.MESSAGE_ADMITTED,
            EventType.STATUS,
            EventType.TURN_START,
        }

        # Evaluated while the person's turn runs (its idle is gone): nothing, and the check does not run.
        assert (await rt.store.session_state(goal.session_id)).status != "idle"
        assert await engine.evaluate(goal.id) is None
        assert await goal_state(rt, goal) == at_claim and len(runs) == 1

        person_gate.set()
        async with asyncio.timeout(30):
            await agent.when_idle()
        # At the new idle the claim is decided once, from everything since the last decision.
        done = await engine.evaluate(goal.id)
        assert isinstance(done, Decision) and done.kind is DecisionKind.COMPLETE
        final = await engine.get(goal.id)
        assert final.status is GoalStatus.COMPLETED and final.rounds == 2 and len(runs) == 2
        completed = await goal_state(rt, goal)

        # Replayed once more after the goal ended: nothing.
        assert await engine.evaluate(goal.id) is None
        assert await goal_state(rt, goal) == completed
    model.assert_done()

    assert [d.kind for d in decisions] == [DecisionKind.CONTINUE, DecisionKind.COMPLETE]
    assert completed["goal"]["revision"] == at_claim["goal"]["revision"] + 1 == after_round_1["goal"]["revision"] + 1
    verified = [t for _, t in completed["goal_events"] if t == GOAL_VERIFIED]
    assert verified == [GOAL_VERIFIED]
    assert [f for _, f in completed["continuations"]] == ["admitted", "admitted"]


# -- 2. the goal tools --------------------------------------------------------------------------------


async def test_progress_notes_reach_the_next_continuation_and_blocked_counts(db_path: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    seen: dict[int, str] = {}

    def rule(request: ModelRequest) -> Reply:
        n, step, text = where_am_i(request)
        seen[n] = text
        if step == 0 and n == 1:
            return Reply.call("goal_progress", note="drafted the outline")
        if step == 0:
            return Reply.call("goal_blocked", reason="the data file is missing")
        return Reply.say("ok")

    async with goal_runtime(db_path, rule) as (rt, engine, model):
        goal = await engine.create(
            GoalSpec(
                objective="Summarize the data file.",
                workdir=str(workdir),
                rules=StopRules(blocked_rounds=3, stall_rounds=5),
            )
        )
        changed = await wait_status(rt, goal, GoalStatus.PAUSED)
        await engine.settled()
        final = await engine.get(goal.id)
        rows = await continuations(rt, goal)
        events = await rt.store.events_after(goal.session_id, 0, limit=100_000)
    model.assert_done()

    # The note reached round 2's continuation (the model saw it) and no earlier one.
    assert "Latest progress notes:\n- drafted the outline" in seen[2]
    assert "drafted the outline" not in seen[1]
    assert "- drafted the outline" in content_of(rows[1])
    notes = [e.data for e in events if e.type == GOAL_PROGRESS]
    assert notes == [{"goalId": goal.id, "turnId": notes[0]["turnId"], "note": "drafted the outline"}]

    results: dict[str, list[str]] = {}
    for e in events:
        if e.type == EventType.TOOL_RESULT:
            results.setdefault(e.data["name"], []).append(e.data["content"])
    assert results["goal_progress"] == ["progress noted"]
    assert results["goal_blocked"] == [
        "noted (1/3); keep trying",
        "noted (2/3); keep trying",
        "noted (3/3); the goal will be paused as blocked when this turn ends",
    ]

    # Blocked in three consecutive rounds: paused with the model's words; nothing more queued.
    assert final.status is GoalStatus.PAUSED
    assert final.status_reason == "blocked: the data file is missing" == changed["reason"]
    assert final.rounds == 4 and final.blocked_streak == 3
    assert [r["source_ref"] for r in rows] == [f"{goal.id}#{i}" for i in range(1, 5)]
    assert all(r["fate"] == "admitted" for r in rows)


# -- 9. bad input ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: GoalSpec(objective=""), ("objective",)),
        (lambda: GoalSpec(objective=" \n\t"), ("objective",)),
        (lambda: GoalSpec(objective="x", title="  "), ()),
        (lambda: Budgets(max_tokens_total=-1), ("max_tokens_total",)),
        (lambda: Budgets(max_rounds=0), ("max_rounds",)),
        (lambda: Budgets(max_cost=-0.5), ("max_cost",)),
        (lambda: Budgets(max_wall_seconds=0), ("max_wall_seconds",)),
        (lambda: Budgets(deadline=datetime(2030, 1, 1)), ("deadline",)),
        (
            lambda: GoalSpec.model_validate({"objective": "x", "budgets": {"max_tokens_total": -1}}),
            ("budgets", "max_tokens_total"),
        ),
        (lambda: GoalSpec.model_validate({"objective": "x", "budgets": {"tokens": 5}}), ("budgets", "tokens")),
        (lambda: VerifyCommand(cmd=""), ("cmd",)),
        (lambda: StopRules(stall_rounds=0), ("stall_rounds",)),
        (lambda: GoalSpec(objective="x", idempotency_key=""), ("idempotency_key",)),
    ],
    ids=[
        "empty objective",
        "blank objective",
        "blank title",
        "negative token budget",
        "zero rounds",
        "negative cost",
        "zero wall time",
        "naive deadline",
        "nested negative budget",
        "unknown budget field",
        "empty verify command",
        "zero stall rounds",
        "empty idempotency key",
    ],
)
def test_invalid_specs_are_rejected_naming_the_field(make: Callable[[], Any], field: tuple[str, ...]) -> None:
    with pytest.raises(ValidationError) as info:
        make()
    assert [tuple(e["loc"]) for e in info.value.errors()] == [field]


async def test_bad_input_gives_clear_errors_and_writes_nothing(db_path: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    (tmp_path / "a_file").write_text("not a directory")

    async with goal_runtime(db_path, lambda request: Reply.say("ok")) as (rt, engine, model):
        first = await engine.create(
            GoalSpec(
                objective="Tidy the notes.",
                key="tidy",
                idempotency_key="once",
                workdir=str(workdir),
                rules=StopRules(stall_rounds=1),
            )
        )
        # It makes no progress, so it pauses itself as stalled: a live goal on an idle session.
        changed = await wait_status(rt, first, GoalStatus.PAUSED)
        assert changed["reason"] == "stalled"
        await engine.settled()
        held = await engine.get(first.id)
        start = await counts(rt)

        async def rejected(call: Callable[[], Any], error: type[Exception], match: str) -> None:
            before = await counts(rt)
            with pytest.raises(error, match=match):
                await call()
            assert await counts(rt) == before

        # Goal ids: unknown, malformed, and a prefix of nothing.
        unknown = GoalId.new()
        for op in (engine.get, engine.pause, engine.resume, engine.cancel):
            await rejected(lambda op=op: op(unknown), NotFound, f"no goal {unknown}")
            for bad in ("", "goal_!!", "goal_" + "0" * 27):
                await rejected(lambda op=op, bad=bad: op(bad), InvalidInput, "malformed goal id")
            for key in ("nope", "ses_" + "0" * 26):  # not an id: looked up as a goal key
                await rejected(lambda op=op, key=key: op(key), NotFound, f"no goal with key {key!r}")
        await rejected(lambda: engine.update(unknown, title="t"), NotFound, "no goal")
        await rejected(lambda: engine.update(first.id, objective="  "), InvalidInput, "objective must not be empty")

        # A second live goal on one session, and sessions that do not exist or are malformed.
        await rejected(
            lambda: engine.create(GoalSpec(objective="Another.", session_id=first.session_id)),
            Conflict,
            "already has an active or paused goal",
        )
        await rejected(
            lambda: engine.create(GoalSpec(objective="Another.", session_id=SessionId.new())), NotFound, "no session"
        )
        await rejected(
            lambda: engine.create(GoalSpec(objective="Another.", session_id="ses_bad")),
            InvalidInput,
            "malformed SessionId",
        )
        await rejected(
            lambda: engine.create(GoalSpec(objective="Another.", key="tidy")), Conflict, "key 'tidy' already exists"
        )

        # Work directories: relative, missing, a file.
        await rejected(
            lambda: engine.create(GoalSpec(objective="Another.", workdir="work")),
            InvalidInput,
            "must be an absolute path",
        )
        await rejected(
            lambda: engine.create(GoalSpec(objective="Another.", workdir=str(tmp_path / "missing"))),
            InvalidInput,
            "does not exist",
        )
        await rejected(
            lambda: engine.create(GoalSpec(objective="Another.", workdir=str(tmp_path / "a_file"))),
            InvalidInput,
            "not a directory",
        )

        # Illegal transitions are refused the same way.
        await rejected(lambda: engine.pause(first.id), InvalidTransition, "paused cannot become paused")

        # A repeated idempotency key returns the first goal and writes nothing.
        before = await counts(rt)
        again = await engine.create(GoalSpec(objective="Something else entirely.", idempotency_key="once"))
        assert await counts(rt) == before
        assert again.id == first.id and again.objective == "Tidy the notes."

        assert await counts(rt) == start
        assert await engine.get(first.id) == held
        assert [g.id for g in await engine.list_goals()] == [first.id]
    model.assert_done()
