"""Retention on each store (a real SQLite file, a real PostgreSQL database): ended goals pruned to
what they keep, live goals untouched, numbering continued, the file given back (SQLite's; the
PostgreSQL server reuses the space itself), work directories removed unless kept.

The goals run for real (the runtime, the goal engine, the shipped scripted model); each round
calls a tool whose output is large, as a long unattended goal's would be. Ages are in seconds and
"now" is passed to each retention run, so the test states exactly how old each goal is.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import storekit
from goalkit import goal_runtime, wait_status
from pydantic import BaseModel

from agent import (
    Delivery,
    EventType,
    FunctionTool,
    ModelRequest,
    Reply,
    Runtime,
    ScriptedModel,
    Store,
    TextBlock,
    ToolContext,
    Tx,
    enqueue,
    parse_content,
    retention,
)
from goals import (
    GOAL_CHANGED,
    Budgets,
    Goal,
    GoalEngine,
    GoalId,
    GoalSpec,
    GoalStatus,
    StopRules,
)
from goals.retention import RetentionPolicy, compact, run_retention
from goals.store import goal_retention

#: The store contract: every test here runs on SQLite and on PostgreSQL.
pytestmark = pytest.mark.both_stores

BIG = 20_000  # bytes of each tool output
#: Rounds without a changed work directory are not a stall here (the goals only produce output).
QUIET = StopRules(stall_rounds=1000)


class NoArgs(BaseModel):
    """No arguments."""


async def _big(args: NoArgs, ctx: ToolContext) -> str:
    return "x" * BIG


def _where(request: ModelRequest) -> tuple[int, int, str]:
    msgs = list(request.messages)
    for i in range(len(msgs) - 1, -1, -1):
        if msgs[i].role != "user":
            continue
        text = "".join(b.text for b in msgs[i].content if isinstance(b, TextBlock))
        found = re.search(r"\bRound (\d+)\b", text)
        if found:
            return int(found.group(1)), sum(1 for m in msgs[i + 1 :] if m.role == "assistant"), text
    raise AssertionError("no continuation in the request")


def rule(request: ModelRequest) -> Reply:
    """Each round: one large tool output, then finish (``done after N``) or report being blocked."""
    n, step, text = _where(request)
    if step == 0:
        return Reply.call("big")
    if "CANNOT-PROCEED" in text:
        return Reply.call("goal_blocked", reason="waiting for a person") if step == 1 else Reply.say("noted")
    done_after = int(re.search(r"done after (\d+)", text).group(1))  # type: ignore[union-attr]
    if step == 1 and n == done_after:
        return Reply.call("goal_complete", summary=f"finished in {n} rounds", evidence="the big outputs")
    return Reply.say(f"round {n} done")


def retention_runtime(
    db_path: Path,
) -> contextlib.AbstractAsyncContextManager[tuple[Runtime, GoalEngine, ScriptedModel]]:
    """The goal runtime with only the ``big`` tool (large outputs) and the goal tools."""
    big = FunctionTool("big", "a large output", NoArgs, _big, repeat_safe=True)
    return goal_runtime(db_path, rule, "r", extra_tools=[big], with_file_tools=False)


async def run_goals(rt: Runtime, engine: GoalEngine, rounds: int = 6) -> tuple[Goal, Goal, Goal]:
    """Two goals that complete after ``rounds`` rounds and one that ends paused (blocked, still live)."""
    spec = GoalSpec(
        objective=f"Produce output; done after {rounds} rounds.", budgets=Budgets(max_rounds=50), rules=QUIET
    )
    a = await engine.create(spec)
    b = await engine.create(spec.model_copy(update={"objective": f"Other output; done after {rounds} rounds."}))
    live = await engine.create(GoalSpec(objective="Try; CANNOT-PROCEED.", budgets=Budgets(max_rounds=50), rules=QUIET))
    await wait_status(rt, a, GoalStatus.COMPLETED, within=60.0)
    await wait_status(rt, b, GoalStatus.COMPLETED, within=60.0)
    await wait_status(rt, live, GoalStatus.PAUSED, within=60.0)
    await engine.settled()
    return await engine.get(a.id), await engine.get(b.id), await engine.get(live.id)


def policy(**kw: Any) -> RetentionPolicy:
    return RetentionPolicy(**{"history_seconds": 60.0, "keep_events": 10, "workdir_seconds": 0, **kw})


def ended_view(goal: Goal) -> dict[str, Any]:
    return goal.model_dump(include={"status", "status_reason", "result_summary", "evidence", "rounds", "tokens",
                                    "cost", "memory", "budgets", "revision"})  # fmt: skip


async def test_ended_goals_are_pruned_by_age_in_seconds_and_keep_outcome_summary_and_counters(db_path: Path) -> None:
    async with retention_runtime(db_path) as (rt, engine, _):
        a, b, live = await run_goals(rt, engine)
        live_events = await rt.store.events_after(live.session_id, 0, limit=100_000)
        before = {g.id: (await rt.store.session_state(g.session_id)).last_seq for g in (a, b)}
        ended_at = max(a.updated_at, b.updated_at)

        # 59 seconds after the later one ended: younger than 60 seconds, nothing is pruned.
        early = await run_retention(rt.store, policy(), now=ended_at + timedelta(seconds=59))
        assert early.goals_pruned == 0 and early.events == 0
        assert await rt.store.first_kept_seq(a.session_id) == 1

        # 61 seconds after: both ended goals are pruned to their last events.
        report = await run_retention(rt.store, policy(), now=ended_at + timedelta(seconds=61))
        assert report.goals_pruned == 2 and report.sessions_pruned == 2
        assert report.events > 0 and report.event_bytes > 6 * BIG

        for goal in (a, b):
            after = await engine.get(goal.id)
            assert ended_view(after) == ended_view(goal)
            assert after.status is GoalStatus.COMPLETED and after.result_summary == "finished in 6 rounds"
            assert after.rounds == 6 and after.tokens > 0
            assert (await rt.store.read(lambda c, g=goal: goal_retention(c, g.id)))["historyPrunedAt"] is not None
            state = await rt.store.session_state(goal.session_id)
            assert state.last_seq == before[goal.id] and state.status == "idle"
            kept = await rt.store.events_after(goal.session_id, 0, limit=100_000)
            first = await rt.store.first_kept_seq(goal.session_id)
            assert first is not None and first > 1 and kept[0].seq == first
            # One contiguous run from the first kept event to the last, holding the latest status and
            # the goal's final goal/changed; a turn is never cut (it starts with turn/start).
            assert [e.seq for e in kept] == list(range(first, state.last_seq + 1))
            assert len(kept) >= 10 and kept[0].type in (EventType.TURN_START, EventType.STATUS)
            assert any(e.seq == state.status_seq for e in kept)
            assert kept[-1].type == GOAL_CHANGED or any(e.type == GOAL_CHANGED for e in kept)
            summary = await rt.store.read(lambda c, g=goal: retention.session_retention(c, g.session_id))
            assert summary is not None and summary["prunedThroughSeq"] == first - 1
            assert summary["prunedEvents"] == first - 1 and summary["prunedBytes"] > 4 * BIG

        # The live (paused) goal and its session are untouched.
        assert ended_view(await engine.get(live.id)) == ended_view(live)
        assert await rt.store.events_after(live.session_id, 0, limit=100_000) == live_events
        assert (await rt.store.read(lambda c: goal_retention(c, live.id)))["historyPrunedAt"] is None

        # A second run finds nothing more to do.
        again = await run_retention(rt.store, policy(), now=ended_at + timedelta(seconds=3600))
        assert again.goals_pruned == 0 and again.events == 0


async def test_a_pruned_session_continues_its_numbering_after_a_restart(db_path: Path) -> None:
    async with retention_runtime(db_path) as (rt, engine, _):
        a, _, _ = await run_goals(rt, engine, rounds=3)
        last = (await rt.store.session_state(a.session_id)).last_seq
        report = await run_retention(rt.store, policy(keep_events=0), now=a.updated_at + timedelta(hours=2))
        assert report.goals_pruned == 2
    # A new process: the session's state is rebuilt from the store, pruned rows and all.
    async with retention_runtime(db_path) as (rt, engine, _):
        assert (await rt.store.session_state(a.session_id)).last_seq == last
        first = await rt.store.first_kept_seq(a.session_id)
        assert first is not None and first > 1
        agent = await rt.agent(a.session_id)
        await agent.inject("a note after pruning")
        events = await rt.store.events_after(a.session_id, last, limit=10)
        assert events[0].seq == last + 1 and events[0].type == EventType.MESSAGE_QUEUED
        watermark = await rt.store.read(
            lambda c: c.execute("SELECT seq_watermark FROM sessions WHERE id=?", (a.session_id,)).fetchone()[0]
        )
        assert watermark == last


async def test_compact_gives_the_space_back_and_steps_stay_bounded(db_path: Path | str) -> None:
    # Giving space back is SQLite's (incremental vacuum, a checkpoint, a smaller file); on
    # PostgreSQL the server's autovacuum reuses it, so compaction there is the bounded pruning.
    on_postgres = storekit.is_postgres(db_path)
    async with retention_runtime(db_path) as (rt, engine, _):
        a, _, _ = await run_goals(rt, engine, rounds=8)
        stats = await rt.store.read(lambda c: retention.database_stats(c, rt.store.path))
        assert stats["autoVacuum"] == ("server" if on_postgres else "incremental")
        assert stats["rows"]["events"] > 0 and stats["largestSessions"][0]["eventBytes"] > 8 * BIG
        if not on_postgres:
            await rt.store.maintain(retention.checkpoint)
            size_before = retention.file_bytes(rt.store.path)
        report = await compact(
            rt.store, policy(batch_rows=20, vacuum_pages=16), now=a.updated_at + timedelta(seconds=120)
        )
        assert report.goals_pruned == 2
        # Bounded: many small steps, not one long one.
        assert report.steps > report.events // 20
        if on_postgres:
            assert report.pages_freed == 0
        else:
            size_after = retention.file_bytes(rt.store.path)
            assert report.pages_freed > 0
            assert size_after < size_before - 8 * BIG, (size_before, size_after)
        after = await rt.store.read(lambda c: retention.database_stats(c, rt.store.path))
        assert after["freePages"] == 0 and after["rows"]["events"] < stats["rows"]["events"]


async def test_a_busy_session_is_skipped_and_pruned_at_a_later_run(db_path: Path) -> None:
    async with retention_runtime(db_path) as (rt, engine, _):
        a, b, _ = await run_goals(rt, engine, rounds=2)
        # Queued input waits in a's session: pruning leaves it whole, and does not mark the goal.
        sid = a.session_id

        def queue(tx: Tx) -> None:
            enqueue(tx, sid, parse_content("later"), delivery=Delivery.CONTEXT)

        await rt.store.transact(queue)
        now = max(a.updated_at, b.updated_at) + timedelta(seconds=120)
        report = await run_retention(rt.store, policy(keep_events=0), now=now)
        assert report.sessions_busy == 1 and report.goals_pruned == 1
        assert await rt.store.first_kept_seq(sid) == 1
        assert (await rt.store.read(lambda c: goal_retention(c, a.id)))["historyPrunedAt"] is None


async def test_work_directories_are_removed_after_their_own_period_unless_kept(tmp_path: Path) -> None:
    root = tmp_path / "work"
    root.mkdir()
    own = tmp_path / "theirs"
    own.mkdir()
    (own / "keep.txt").write_text("mine")
    async with retention_runtime(tmp_path / "goald.db") as (rt, engine, _):
        goals = []
        for i, key in enumerate(("made", "kept", "named", "spec-kept")):
            gid = GoalId.new()
            workdir = own if key == "named" else root / gid
            workdir.mkdir(exist_ok=True)
            (workdir / "out.txt").write_text("x" * 1000)
            spec = GoalSpec(
                objective=f"Work {i}; done after 1 rounds.",
                key=key,
                workdir=str(workdir),
                rules=QUIET,
                keep_workdir=key == "spec-kept",
            )
            goal = await engine.create(spec, goal_id=gid)
            await wait_status(rt, goal, GoalStatus.COMPLETED, within=60.0)
            goals.append(await engine.get(goal.id))
        await engine.settled()
        made, kept, _, spec_kept = goals
        assert spec_kept.keep_workdir and not made.keep_workdir
        ended = max(g.updated_at for g in goals)
        snaps = tmp_path / "snapshots"
        for g in (made, kept):  # checkpoints of theirs: they go after the period, the directory kept or not
            (snaps / g.id).mkdir(parents=True)
            (snaps / g.id / "base.json").write_text("{}")
        pol = policy(
            history_seconds=0, workdir_seconds=30, keep_workdirs=["kept"], workdir_roots=[root], snapshots_root=snaps
        )
        assert (await run_retention(rt.store, pol, now=ended + timedelta(seconds=29))).workdirs_removed == []
        report = await run_retention(rt.store, pol, now=ended + timedelta(seconds=31))
        assert report.workdirs_removed == [made.workdir] and report.workdirs_kept == 3
        assert not await asyncio.to_thread(Path(str(made.workdir)).exists)
        assert await asyncio.to_thread(Path(str(kept.workdir)).is_dir)
        assert not await asyncio.to_thread((snaps / made.id).exists)
        assert not await asyncio.to_thread((snaps / kept.id).exists)
        assert await asyncio.to_thread(Path(str(spec_kept.workdir)).is_dir)
        assert await asyncio.to_thread((own / "keep.txt").read_text) == "mine"
        views = [await rt.store.read(lambda c, g=g: goal_retention(c, g.id)) for g in goals]
        assert views[0]["workdirRemovedAt"] not in (None, "kept")
        assert views[1]["workdirRemovedAt"] == "kept" and views[2]["workdirRemovedAt"] == "kept"
        assert views[3]["workdirRemovedAt"] == "kept"
        assert (await engine.get(made.id)).status is GoalStatus.COMPLETED


async def test_offline_vacuum_switches_an_older_database_to_incremental(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE filler (x BLOB)")
    conn.execute("INSERT INTO filler SELECT randomblob(4000) FROM (SELECT 1 UNION ALL SELECT 2)")
    conn.commit()
    conn.close()
    async with await Store.open(path) as store:
        stats = await store.read(lambda c: retention.database_stats(c, path))
        assert stats["autoVacuum"] == "none" and stats["rows"]["filler"] == 2
    result = retention.vacuum_offline(path)
    assert result["autoVacuumBefore"] == "none" and result["autoVacuum"] == "incremental"
    async with await Store.open(path) as store:
        assert (await store.read(lambda c: retention.database_stats(c, path)))["autoVacuum"] == "incremental"


def test_the_policy_refuses_bad_values() -> None:
    with pytest.raises(ValueError, match="history_seconds"):
        RetentionPolicy(history_seconds=-1)
    with pytest.raises(ValueError, match="batch_rows"):
        RetentionPolicy(batch_rows=0)
