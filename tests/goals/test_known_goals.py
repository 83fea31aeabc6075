"""A goal tool records on the goal as this process last wrote it, checked in the same write
(``goals.known``; issue 30: one round trip where it was two), on both stores.

Pins: a goal this process wrote is recorded on without reading its row; a goal another process
changed since is refused by the check, nothing of that write kept, read again, and recorded on
as it now is (paused: the tool says so); a goal another process ended leaves the tool with no live
goal and records nothing; on PostgreSQL the record on a known goal is one round trip; and a process
remembers at most ``goals.known.LIMIT`` goals, the least recently written forgotten first.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from goalkit import goal_runtime

import goals.known
import goals.tools
from agent import ModelRequest, Reply, Store, ToolContext
from goals import GoalSpec, GoalStatus
from goals.queries import load_goal
from goals.store import GOAL_CLAIM, GOAL_PROGRESS, save_goal
from goals.tools import CompleteArgs, GoalComplete, GoalProgress, ProgressArgs

pytestmark = pytest.mark.both_stores

WAIT = 10.0


async def test_a_goal_tool_records_on_the_goal_this_process_wrote(
    db_path: Path | str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = 0
    read = goals.tools.live_goal_of_session

    def counted(tx: Any, session_id: str) -> Any:
        nonlocal reads
        reads += 1
        return read(tx, session_id)

    monkeypatch.setattr(goals.tools, "live_goal_of_session", counted)
    calling, release = asyncio.Event(), asyncio.Event()

    async def rule(request: ModelRequest) -> Reply:
        calling.set()
        await release.wait()  # the round's turn stays open while the test calls the tools
        return Reply.say("done")

    workdir = tmp_path / "work"
    workdir.mkdir()
    async with goal_runtime(db_path, rule) as (rt, engine, _):
        goal = await engine.create(GoalSpec(objective="Hold still.", workdir=str(workdir)))
        async with asyncio.timeout(WAIT):
            await calling.wait()
        ctx = ToolContext(session_id=goal.session_id, turn_id="turn_t", call_id="call_t", store=rt.store)
        progress, complete = GoalProgress(), GoalComplete()

        trips = rt.store.round_trips
        first = await progress.run(ProgressArgs(note="one"), ctx)
        trips = None if trips is None else rt.store.round_trips - trips  # type: ignore[operator]
        reads_known = reads

        # Another process pauses the goal: this one's known row is at an older revision now.
        other = await Store.open(db_path)
        try:
            stored = await other.read(lambda conn: load_goal(conn, goal.id))
            paused = stored.model_copy(update={"status": GoalStatus.PAUSED})
            await other.transact(lambda tx: save_goal(tx, paused, stored.revision), session=goal.session_id)
            claimed = await complete.run(CompleteArgs(summary="s", evidence="e"), ctx)
            reads_changed = reads
            again = await progress.run(ProgressArgs(note="two"), ctx)
            reads_again = reads

            # Another process ends it: no live goal is left to record on.
            stored = await other.read(lambda conn: load_goal(conn, goal.id))
            ended = stored.model_copy(update={"status": GoalStatus.CANCELLED})
            await other.transact(lambda tx: save_goal(tx, ended, stored.revision), session=goal.session_id)
            none = await progress.run(ProgressArgs(note="three"), ctx)
        finally:
            await other.close()
        events = await rt.store.events_after(goal.session_id, 0, types=[GOAL_PROGRESS, GOAL_CLAIM])
        release.set()

    assert first.content == "progress noted" and reads_known == 0
    if trips is not None:
        assert trips == 1  # PostgreSQL: the check and the event in one write sent whole
    assert "the goal is paused" in claimed.content and reads_changed == 1
    assert again.content == "progress noted" and reads_again == 1  # the row read is known now
    assert none.is_error and "no active goal" in none.content
    assert [(e.type, e.data["goalId"], e.data.get("note")) for e in events] == [
        (GOAL_PROGRESS, goal.id, "one"),
        (GOAL_CLAIM, goal.id, None),
        (GOAL_PROGRESS, goal.id, "two"),
    ]


async def test_a_process_remembers_at_most_its_limit_of_goals(
    db_path: Path | str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(goals.known, "LIMIT", 2)
    calling, release = asyncio.Event(), asyncio.Event()

    async def rule(request: ModelRequest) -> Reply:
        calling.set()
        await release.wait()
        return Reply.say("done")

    made = []
    async with goal_runtime(db_path, rule) as (rt, engine, _):
        for n in range(3):
            workdir = tmp_path / f"work{n}"
            workdir.mkdir()
            made.append(await engine.create(GoalSpec(objective=f"Goal {n}.", workdir=str(workdir))))
        known = [goals.known.known_goal(rt.store, g.session_id) for g in made]
        release.set()
    # The least recently written is forgotten first; the others are known as written.
    assert known[0] is None
    assert [k.id if k else None for k in known[1:]] == [g.id for g in made[1:]]
