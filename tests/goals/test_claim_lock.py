"""A goal's creation holds the work-directory claims' lock, not the whole cluster (issue 30).

Two stores on one PostgreSQL database are two nodes. Work-directory nesting is a rule over every
goal and session, so the transactions that claim a directory run one at a time
(``goals.locks.CLAIMS``), but a session's write on another node goes on meanwhile (before, a goal's
creation held the writer lock alone and waited for it, and every session's write waited for the
creation). Pins both: a creation commits while another node's session write is held open, and a
second claim of a nested directory waits for the first (PostgreSQL shows it waiting on an advisory
lock) and is then refused, naming the goal in the way.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from goalkit import goal_runtime
from lockkit import LIMIT, Held, until_waiting

from agent import ModelRequest, Reply, Store, Tx
from agent.sessions import create_session
from goals import GoalConflict, GoalSpec


def quiet() -> tuple[Any, asyncio.Event]:
    """A model rule whose calls wait until the test ends (the goals' rounds stay still)."""
    release = asyncio.Event()

    async def rule(request: ModelRequest) -> Reply:
        await release.wait()
        return Reply.say("done")

    return rule, release


async def test_a_goal_is_created_while_another_nodes_session_write_is_open(pg_dsn: str, tmp_path: Path) -> None:
    rule, release = quiet()
    work = tmp_path / "work"
    work.mkdir()
    a = await Store.open(pg_dsn)
    try:
        async with goal_runtime(pg_dsn, rule) as (_, engine, _):
            sid = await a.transact(lambda tx: create_session(tx))
            held = Held()
            task = asyncio.create_task(a.transact(held(sid), session=sid))
            try:
                await held.entered()
                goal = await asyncio.wait_for(engine.create(GoalSpec(objective="Go on.", workdir=str(work))), LIMIT)
                assert not task.done()  # created while node A's write was still open
            finally:
                held.release()
                release.set()
            await task
    finally:
        await a.close()
    assert goal.workdir == str(work.resolve())


async def test_claims_of_nested_work_directories_run_one_at_a_time(pg_dsn: str, tmp_path: Path) -> None:
    rule, release = quiet()
    outer = tmp_path / "outer"
    inner = outer / "inner"
    inner.mkdir(parents=True)
    inside, go = threading.Event(), threading.Event()

    def hold(tx: Tx, made: Any) -> None:  # in node A's creation, on its store thread
        inside.set()
        assert go.wait(LIMIT), "node A's creation was never released"

    async with (
        goal_runtime(pg_dsn, rule, name="a") as (_, engine_a, _),
        goal_runtime(pg_dsn, rule, name="b") as (
            _,
            engine_b,
            _,
        ),
    ):
        first = asyncio.create_task(engine_a.create(GoalSpec(objective="Outer.", workdir=str(outer)), also=hold))
        try:
            assert await asyncio.to_thread(inside.wait, LIMIT), "node A's creation never began"
            second = asyncio.create_task(engine_b.create(GoalSpec(objective="Inner.", workdir=str(inner))))
            await until_waiting(pg_dsn)  # B's claim waits on the claims' lock while A's is open
            assert not second.done()
        finally:
            go.set()
        made = await asyncio.wait_for(first, LIMIT)
        with pytest.raises(GoalConflict) as refused:
            await asyncio.wait_for(second, LIMIT)
        release.set()
    assert made.id in str(refused.value)
