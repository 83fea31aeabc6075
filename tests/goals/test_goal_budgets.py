"""Goal budgets on a real SQLite file: tokens, cost, the deadline, wall time and the round limit.

The spend guard binds *before* a model call: it reserves the prompt's upper bound plus the call's
``max_tokens`` (and their price), so a goal never spends more than its budget, and a call the budget
cannot cover is never made. Time-based limits run on a frozen wall clock (freezegun, with asyncio's
own clock left running): the model's call "takes a minute" by moving the frozen time, and the
engine's durable timers notice a deadline that passes while the goal waits at idle.

The only stand-in is the shipped scripted model; the file tools write real files in the goal's real
work directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from freezegun.api import FrozenDateTimeFactory
from goalkit import goal_runtime, wait_status
from harness import toml_text

from agent import (
    EventType,
    InvalidInput,
    ModelErrorKind,
    ModelRequest,
    Price,
    Reply,
    Runtime,
    ScriptedModel,
    TextBlock,
    ToolCall,
    ToolRegistry,
    Usage,
    file_tools,
)
from goals import (
    GOAL_CHANGED,
    GOAL_VERIFIED,
    Budgets,
    Decision,
    DecisionKind,
    Goal,
    GoalEngine,
    GoalSpec,
    GoalStatus,
    PolicyInput,
    StopRules,
    VerifyCommand,
    tools_for_goal_sessions,
)
from goals.verify import run_command, within

Rule = Callable[[ModelRequest], Reply | Awaitable[Reply]]

#: Rules that never stall or pause a goal in these tests (budgets are what end them).
PATIENT = StopRules(stall_rounds=50, max_model_errors=50, error_backoff_seconds=0.01)


def _text(msg: Any) -> str:
    return "".join(b.text for b in msg.content if isinstance(b, TextBlock))


def where_am_i(request: ModelRequest) -> tuple[int, int]:
    """(round, model steps already taken in it) from a model request."""
    msgs = list(request.messages)
    for i in range(len(msgs) - 1, -1, -1):
        found = re.search(r"\bRound (\d+)\b", _text(msgs[i])) if msgs[i].role == "user" else None
        if found:
            return int(found.group(1)), sum(1 for m in msgs[i + 1 :] if m.role == "assistant")
    raise AssertionError("no continuation in the request")


def write(path: str, content: str, **kw: Any) -> Reply:
    """A reply that writes one file in the work directory."""
    return Reply(tool_calls=[ToolCall("write_file", {"path": path, "content": content})], **kw)


async def model_calls(rt: Runtime, goal: Goal) -> list[dict[str, Any]]:
    """The goal session's ``model_calls`` rows (one per attempt), oldest first."""
    rows = await rt.store.read(
        lambda conn: conn.execute(
            "SELECT * FROM model_calls WHERE session_id=? ORDER BY started_at, id", (goal.session_id,)
        ).fetchall()
    )
    return [dict(r) for r in rows]


def charged_tokens(row: dict[str, Any]) -> int:
    return int(row["input_tokens"] + row["output_tokens"] + row["cache_read_tokens"] + row["cache_write_tokens"])


async def continuation_refs(rt: Runtime, goal: Goal) -> list[tuple[str, str]]:
    """(source ref, fate) of the goal's continuations, oldest first."""
    rows = await rt.store.read(
        lambda conn: conn.execute(
            "SELECT source_ref, fate FROM inbox WHERE session_id=? AND source_kind='goal' ORDER BY queued_seq",
            (goal.session_id,),
        ).fetchall()
    )
    return [(r["source_ref"], r["fate"]) for r in rows]


async def queued(rt: Runtime, goal: Goal) -> int:
    """How many messages of the goal's session are still queued."""
    return int(
        await rt.store.read(
            lambda conn: conn.execute(
                "SELECT count(*) FROM inbox WHERE session_id=? AND fate='queued'", (goal.session_id,)
            ).fetchone()[0]
        )
    )


async def last_turn_end(rt: Runtime, goal: Goal) -> dict[str, Any]:
    events = await rt.store.events_after(goal.session_id, 0, limit=100_000)
    return [e.data for e in events if e.type == EventType.TURN_END][-1]


# -- tokens -----------------------------------------------------------------------------------------


async def test_token_budget_is_never_overspent(db_path: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    limit, max_tokens = 12_000, 300

    def rule(request: ModelRequest) -> Reply:
        # Every call reports its whole prompt and uses its whole output allowance: the worst case.
        usage = Usage(input_tokens=request.prompt_bytes // 4, output_tokens=request.max_tokens)
        n, step = where_am_i(request)
        if step == 0:
            return write(f"part{n}.txt", f"part {n}\n", usage=usage)
        return Reply.say(f"part {n} written", usage=usage)

    model = ScriptedModel(rule, name="tokens", max_tokens=max_tokens)
    async with goal_runtime(db_path, model) as (rt, engine, _):
        goal = await engine.create(
            GoalSpec(
                objective="Write parts until the budget runs out.",
                workdir=str(workdir),
                budgets=Budgets(max_tokens_total=limit),
                rules=PATIENT,
            )
        )
        changed = await wait_status(rt, goal, GoalStatus.EXHAUSTED)
        await engine.settled()
        final = await engine.get(goal.id)
        calls = await model_calls(rt, goal)
        end = await last_turn_end(rt, goal)
        left_queued = await queued(rt, goal)
    model.assert_done()

    assert final.status is GoalStatus.EXHAUSTED and final.status_reason == "token_budget" == changed["reason"]
    assert final.rounds >= 3, "the budget should allow several rounds"
    # Every attempt was reserved before it was made and settled within its reservation.
    assert len(calls) == model.call_count
    assert all(c["state"] == "settled" for c in calls)
    assert all(charged_tokens(c) <= c["reserved_tokens"] for c in calls)
    # What was charged is what the goal counted, and it is within the budget: no overshoot at all.
    charged = sum(charged_tokens(c) for c in calls)
    assert final.tokens == charged <= limit
    # The next call was refused, not made: it might have taken more than what was left.
    assert end["reason"] == "budget"
    refused = re.fullmatch(r"token budget: this call may take (\d+) tokens, (\d+) left", end["error"])
    assert refused is not None, end
    may_take, left = int(refused.group(1)), int(refused.group(2))
    assert left == limit - charged < may_take
    assert may_take > max_tokens  # the reservation covers the prompt as well as the output
    assert left_queued == 0


# -- cost -----------------------------------------------------------------------------------------


async def test_cost_budget_with_a_price_table(db_path: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    price = Price(input=100.0, output=400.0)  # per million tokens
    max_cost = 1.0

    def rule(request: ModelRequest) -> Reply:
        usage = Usage(input_tokens=request.prompt_bytes // 4, output_tokens=request.max_tokens)
        n, step = where_am_i(request)
        if step == 0:
            return write(f"part{n}.txt", f"part {n}\n", usage=usage)
        return Reply.say(f"part {n} written", usage=usage)

    model = ScriptedModel(rule, name="priced", price=price, max_tokens=100)
    async with goal_runtime(db_path, model) as (rt, engine, _):
        goal = await engine.create(
            GoalSpec(
                objective="Write parts until the money runs out.",
                workdir=str(workdir),
                budgets=Budgets(max_cost=max_cost),
                rules=PATIENT,
            )
        )
        changed = await wait_status(rt, goal, GoalStatus.EXHAUSTED)
        await engine.settled()
        final = await engine.get(goal.id)
        calls = await model_calls(rt, goal)
        end = await last_turn_end(rt, goal)
    model.assert_done()

    assert final.status is GoalStatus.EXHAUSTED and final.status_reason == "cost_budget" == changed["reason"]
    assert final.rounds >= 2
    assert all(c["state"] == "settled" for c in calls) and len(calls) == model.call_count
    for c in calls:
        usage = Usage(input_tokens=c["input_tokens"], output_tokens=c["output_tokens"])
        assert c["cost"] == pytest.approx(price.cost(usage)) and c["cost"] <= c["reserved_cost"] + 1e-12
    spent = sum(c["cost"] for c in calls)
    assert final.cost == pytest.approx(spent)
    assert 0 < final.cost <= max_cost
    assert end["reason"] == "budget"
    refused = re.fullmatch(r"cost budget: this call may cost ([\d.]+), ([\d.]+) left", end["error"])
    assert refused is not None, end
    assert float(refused.group(2)) == pytest.approx(max_cost - spent, abs=1e-6)
    assert float(refused.group(1)) > float(refused.group(2))


async def test_cost_budget_with_the_price_table_of_the_daemon_config(tmp_path: Path) -> None:
    """The price comes from ``[providers.X.prices]`` of a real config file, read the way the daemon
    reads it (``load_settings`` → ``build_registry``); ``max_cost`` binds before the call."""
    from daemon.models import build_registry
    from daemon.settings import load_settings

    config = {
        "state_dir": str(tmp_path / "state"),
        "default_model": "test:worker",
        "providers": {
            "test": {
                "kind": "scripted",
                # goald_testmodels' ``worker``: writes a file, notes progress and reports, each round.
                "script": "goald_testmodels:slow",
                "max_tokens": 1024,
                # Only ``worker`` is priced; ``chat`` is not.
                "prices": {"worker": {"input": 2.0, "output": 8.0}},
            }
        },
    }
    path = tmp_path / "goald.toml"
    path.write_text(toml_text(config))
    settings = load_settings(path)
    price = settings.providers["test"].prices["worker"]
    assert price == Price(input=2.0, output=8.0)
    registry = build_registry(settings)
    worker, chat = registry.get("test:worker"), registry.get("test:chat")
    assert isinstance(worker, ScriptedModel) and isinstance(chat, ScriptedModel)
    assert worker.price == price and chat.price is None
    max_cost = 0.04

    def tools(row: Any) -> ToolRegistry:
        return ToolRegistry(list(file_tools()) + tools_for_goal_sessions(row.config))

    priced_dir, unpriced_dir = tmp_path / "priced", tmp_path / "unpriced"
    priced_dir.mkdir()
    unpriced_dir.mkdir()
    async with Runtime.open(settings.database_path, models=registry, tools=tools) as rt:
        async with GoalEngine.running(rt, timer_interval=0.05) as engine:
            goal = await engine.create(
                GoalSpec(
                    objective="Write a file per round until the money runs out. [rounds=1000]",
                    workdir=str(priced_dir),
                    model="test:worker",
                    budgets=Budgets(max_cost=max_cost),
                    rules=PATIENT,
                )
            )
            # A model with no price in the table: a cost budget cannot be kept, so no call is made.
            unpriced = await engine.create(
                GoalSpec(
                    objective="Chat until the money runs out.",
                    workdir=str(unpriced_dir),
                    model="test:chat",
                    budgets=Budgets(max_cost=max_cost),
                    rules=PATIENT,
                )
            )
            changed = await wait_status(rt, goal, GoalStatus.EXHAUSTED)
            unpriced_changed = await wait_status(rt, unpriced, GoalStatus.EXHAUSTED)
            await engine.settled()
            final = await engine.get(goal.id)
            calls = await model_calls(rt, goal)
            end = await last_turn_end(rt, goal)
            unpriced_final = await engine.get(unpriced.id)
            unpriced_calls = await model_calls(rt, unpriced)
            unpriced_end = await last_turn_end(rt, unpriced)

    assert final.status is GoalStatus.EXHAUSTED and final.status_reason == "cost_budget" == changed["reason"]
    assert final.rounds >= 2, "the budget should allow a few rounds"
    # Each attempt was priced from the config's table, within what was reserved for it.
    assert len(calls) == worker.call_count > 0
    for c in calls:
        assert c["state"] == "settled"
        usage = Usage(input_tokens=c["input_tokens"], output_tokens=c["output_tokens"])
        assert c["cost"] > 0 and c["cost"] == pytest.approx(price.cost(usage))
        assert c["reserved_cost"] >= c["cost"] - 1e-12
    spent = sum(c["cost"] for c in calls)
    # No overshoot: the goal's cost is what was charged, and within max_cost.
    assert final.cost == pytest.approx(spent) and 0 < final.cost <= max_cost
    # The next call was refused, not made: it might have cost more than what was left.
    assert end["reason"] == "budget"
    refused = re.fullmatch(r"cost budget: this call may cost ([\d.]+), ([\d.]+) left", end["error"])
    assert refused is not None, end
    may_cost, left = float(refused.group(1)), float(refused.group(2))
    assert left == pytest.approx(max_cost - spent, abs=1e-6) and may_cost > left
    # The reservation assumed the configured price: at least the whole output allowance at its rate.
    assert may_cost >= price.output * worker.max_tokens / 1_000_000

    assert unpriced_final.status is GoalStatus.EXHAUSTED and unpriced_final.status_reason == "cost_budget"
    assert unpriced_changed["reason"] == "cost_budget"
    assert chat.call_count == 0 and unpriced_calls == []
    assert unpriced_end["reason"] == "budget" and "no price" in unpriced_end["error"]
    assert unpriced_final.cost == 0 and unpriced_final.rounds == 0  # refused before its first call: no round


# -- the deadline and wall time ---------------------------------------------------------------------


def time_budget(kind: str, start: datetime) -> Budgets:
    """A budget that runs out one minute after ``start``: a deadline, or a wall-time limit."""
    if kind == "deadline":
        return Budgets(deadline=start + timedelta(seconds=60))
    return Budgets(max_wall_seconds=60)


@pytest.mark.parametrize("kind", ["deadline", "wall_time"])
async def test_no_model_call_after_the_time_runs_out_mid_round(
    kind: str, db_path: Path, tmp_path: Path, frozen_clock: FrozenDateTimeFactory
) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    start = datetime.now(UTC)
    cutoff = start + timedelta(seconds=60)
    called_at: list[datetime] = []

    def rule(request: ModelRequest) -> Reply:
        called_at.append(datetime.now(UTC))
        n, step = where_am_i(request)
        if step == 0:
            if n == 3:
                # This step is slow: over a minute of wall time passes while it runs.
                frozen_clock.move_to(start + timedelta(seconds=61))
            return write(f"part{n}.txt", f"part {n}\n", delay=0.01)
        return Reply.say(f"part {n} written", delay=0.01)

    model = ScriptedModel(rule, name=f"slow-{kind}")
    async with goal_runtime(db_path, model) as (rt, engine, _):
        goal = await engine.create(
            GoalSpec(
                objective="Keep writing parts, slowly.",
                workdir=str(workdir),
                budgets=time_budget(kind, start),
                rules=PATIENT,
            )
        )
        changed = await wait_status(rt, goal, GoalStatus.EXHAUSTED)
        await engine.settled()
        final = await engine.get(goal.id)
        calls = await model_calls(rt, goal)
        end = await last_turn_end(rt, goal)
        refs = await continuation_refs(rt, goal)
        left_queued = await queued(rt, goal)
    model.assert_done()

    assert final.status is GoalStatus.EXHAUSTED and final.status_reason == kind == changed["reason"]
    # Rounds 1 and 2 took two steps each; round 3's first step ran past the limit, and the guard
    # refused its second step: the call was not made.
    assert model.call_count == 5 == len(calls)
    assert all(at < cutoff for at in called_at)
    assert all(datetime.fromisoformat(c["started_at"]) < cutoff for c in calls)
    assert end["reason"] == "budget" and end["steps"] == 1
    assert end["error"].startswith("deadline")
    assert final.rounds == 3 and refs == [(f"{goal.id}#{i}", "admitted") for i in (1, 2, 3)]
    assert left_queued == 0
    if kind == "wall_time":
        assert final.wall_used >= 60


@pytest.mark.parametrize("kind", ["deadline", "wall_time"])
async def test_a_durable_timer_ends_a_waiting_goal_when_the_time_runs_out(
    kind: str, db_path: Path, tmp_path: Path, frozen_clock: FrozenDateTimeFactory
) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    start = datetime.now(UTC)

    # The model fails once (not retryable); the goal then waits an hour at idle before retrying.
    model = ScriptedModel([Reply.fail(ModelErrorKind.BAD_REQUEST, "the request was malformed")], name=f"t-{kind}")
    decisions: list[tuple[PolicyInput, Decision]] = []
    waiting = asyncio.Event()

    def on_decision(inp: PolicyInput, decision: Decision) -> None:
        decisions.append((inp, decision))
        if decision.kind is DecisionKind.WAIT:
            waiting.set()

    async with goal_runtime(db_path, model) as (rt, engine, _):
        engine.add_decision_listener(on_decision)
        goal = await engine.create(
            GoalSpec(
                objective="Wait for the provider.",
                workdir=str(workdir),
                budgets=time_budget(kind, start),
                rules=StopRules(error_backoff_seconds=3600, error_backoff_max_seconds=3600),
            )
        )
        async with asyncio.timeout(30):
            await waiting.wait()
        held = await engine.get(goal.id)
        assert held.status is GoalStatus.ACTIVE and held.not_before == start + timedelta(seconds=3600)
        assert (await rt.store.session_state(goal.session_id)).status == "idle"

        # A minute and a second pass while the goal waits: no turn runs, yet the timer ends it.
        frozen_clock.move_to(start + timedelta(seconds=61))
        changed = await wait_status(rt, goal, GoalStatus.EXHAUSTED)
        await engine.settled()
        final = await engine.get(goal.id)
        calls = await model_calls(rt, goal)
        left_queued = await queued(rt, goal)
    model.assert_done()

    assert final.status is GoalStatus.EXHAUSTED and final.status_reason == kind == changed["reason"]
    assert model.call_count == 1 == len(calls)
    assert [d.kind for _, d in decisions] == [DecisionKind.WAIT, DecisionKind.EXHAUST]
    timer_input, _ = decisions[-1]
    assert timer_input.interval.turns == 0 and timer_input.now == start + timedelta(seconds=61)
    assert final.rounds == 1 and left_queued == 0


# -- rounds -----------------------------------------------------------------------------------------


async def test_round_limit_then_resume_with_a_raised_limit(db_path: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    seen: list[str] = []

    def rule(request: ModelRequest) -> Reply:
        n, step = where_am_i(request)
        if step == 0:
            seen.append(_text(request.messages[-1]).split("---\n", 1)[1].splitlines()[0])
            return write(f"part{n}.txt", f"part {n}\n")
        return Reply.say(f"part {n} written")

    model = ScriptedModel(rule, name="rounds")
    async with goal_runtime(db_path, model) as (rt, engine, _):
        goal = await engine.create(
            GoalSpec(
                objective="Write one part per round.",
                workdir=str(workdir),
                budgets=Budgets(max_rounds=3),
                rules=PATIENT,
            )
        )
        changed = await wait_status(rt, goal, GoalStatus.EXHAUSTED)
        await engine.settled()
        first = await engine.get(goal.id)
        first_refs = await continuation_refs(rt, goal)
        calls_then = model.call_count

        # Resuming without more rounds is refused and changes nothing.
        with pytest.raises(InvalidInput, match="round_limit"):
            await engine.resume(goal.id)
        assert await engine.get(goal.id) == first

        resumed = await engine.resume(goal.id, budgets=Budgets(max_rounds=5))
        assert resumed.status is GoalStatus.ACTIVE
        async with asyncio.timeout(30):
            async with contextlib.aclosing(rt.store.hub.subscribe(rt.store, goal.session_id, 0)) as events:
                async for event in events:
                    if event.type == GOAL_CHANGED and event.data["status"] == "exhausted" and event.data["rounds"] == 5:
                        break
        await engine.settled()
        final = await engine.get(goal.id)
        refs = await continuation_refs(rt, goal)
    model.assert_done()

    assert first.status is GoalStatus.EXHAUSTED and first.status_reason == "round_limit" == changed["reason"]
    assert first.rounds == 3 and calls_then == 6
    assert first_refs == [(f"{goal.id}#{i}", "admitted") for i in (1, 2, 3)]
    assert final.status is GoalStatus.EXHAUSTED and final.status_reason == "round_limit"
    assert final.rounds == 5 and model.call_count == 10
    assert refs == [(f"{goal.id}#{i}", "admitted") for i in (1, 2, 3, 4, 5)]
    assert [s.split(". Budget")[0] for s in seen] == [
        "Round 1 of 3",
        "Round 2 of 3",
        "Round 3 of 3",
        "Round 4 of 5",
        "Round 5 of 5",
    ]
    assert sorted(p.name for p in workdir.iterdir()) == [f"part{i}.txt" for i in range(1, 6)]


# -- the goal's commands inside its time -------------------------------------------------------------


async def test_a_command_is_cut_at_the_time_left_and_not_run_without_any(tmp_path: Path) -> None:
    # Time left: the command runs as it is, its own timeout untouched.
    quick = await within(run_command, 600)(VerifyCommand(cmd="echo fine", timeout=30), tmp_path)
    assert quick.passed and quick.output_tail == "fine\n" and not quick.out_of_time
    # Less time left than the command's timeout: the command is cut when the goal's time ends.
    cut = await within(run_command, 0.5)(VerifyCommand(cmd="sleep 120", timeout=600), tmp_path)
    assert cut.timed_out and cut.out_of_time and not cut.passed
    assert "[cut short: the goal's deadline or wall time left 0.5s of the command's 600s]" in cut.output_tail
    # No time left: not run at all (the file it would make is not there), and it says why.
    late = within(run_command, 0.0)
    gone = await late(VerifyCommand(cmd="touch ran", timeout=30), tmp_path)
    assert not gone.passed and gone.out_of_time and not gone.timed_out
    assert gone.output_tail == "not run: the goal's deadline or wall time ran out"
    assert not (tmp_path / "ran").exists()


async def test_a_verification_never_runs_past_the_goal_s_wall_time(db_path: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()

    def rule(request: ModelRequest) -> Reply:
        n, step = where_am_i(request)
        if n == 1 and step == 0:
            return Reply(tool_calls=[ToolCall("goal_complete", {"summary": "done", "evidence": "all of it"})])
        return Reply.say(f"round {n}: claimed")

    model = ScriptedModel(rule, name="claims-at-once")
    async with goal_runtime(db_path, model) as (rt, engine, _):
        goal = await engine.create(
            GoalSpec(
                objective="Finish, and let the slow check judge it.",
                workdir=str(workdir),
                # Ten seconds: the spend guard starts a model call only with five left.
                budgets=Budgets(max_wall_seconds=10),
                # The check would take two minutes, far past the goal's wall time.
                verify=[VerifyCommand(cmd="sleep 120", timeout=600)],
                # One refused claim would pause the goal `unverified`: a check cut by the goal's time
                # is not counted, so the spent budget decides.
                rules=PATIENT.model_copy(update={"max_refused_claims": 1}),
            )
        )
        changed = await wait_status(rt, goal, GoalStatus.EXHAUSTED, within=60)
        await engine.settled()
        final = await engine.get(goal.id)
        events = await rt.store.events_after(goal.session_id, 0, limit=100_000)

    assert final.status is GoalStatus.EXHAUSTED and changed["reason"] == "wall_time"
    # Decided at the idle the check ended at: no second round was queued or started.
    assert final.rounds == 1 and sum(1 for e in events if e.type == "turn/start") == 1
    assert final.refused_claims == 0 and final.wall_used >= 10
    verified = [e.data for e in events if e.type == GOAL_VERIFIED]
    assert len(verified) == 1 and not verified[0]["passed"]
    (result,) = verified[0]["results"]
    # Cut where the goal's time ended (or, on a machine slow enough that the time was gone by the
    # idle, not run at all): the claim is refused, never completed after the goal's time.
    assert result["exit_code"] is None and result["out_of_time"]
    assert (
        "[cut short: the goal's deadline or wall time left" in result["output_tail"]
        or result["output_tail"] == "not run: the goal's deadline or wall time ran out"
    ), result
    assert final.wall_used < 60
