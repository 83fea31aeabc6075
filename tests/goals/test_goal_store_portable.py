"""The goals table's constraints mean the same on both stores.

The work-directory lock is two triggers on each store (SQLite's ``RAISE(ABORT, …)``, PostgreSQL's
plpgsql function raising a check violation with the same text); the unique indexes are named by
column on SQLite and by index on PostgreSQL. Each refusal must reach the engine as the same
``GoalConflict``, raised by the writing transaction, which then writes nothing (on PostgreSQL the
row goes with the transaction's next round trip, and the refusal is raised there). Real stores,
the shipped scripted model.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path

import pytest

from agent import ModelRegistry, Reply, Runtime, ScriptedModel, ToolRegistry, Tx
from agent.db import integrity_errors
from goals import GoalEngine, GoalSpec, tools_for_goal_sessions
from goals.errors import GoalConflict
from goals.model import Goal, GoalId
from goals.rows import COLUMNS, row_values
from goals.store import insert_goal, save_goal

pytestmark = pytest.mark.both_stores

HELD = "goals.workdir is held by another active or paused goal"


@contextlib.asynccontextmanager
async def engine_on(db_path: Path | str) -> AsyncIterator[tuple[Runtime, GoalEngine]]:
    model = ScriptedModel(lambda request: Reply.say("working"), name="g", record=False)
    registry = ModelRegistry({model.spec: model}, default=model.spec)
    tools = lambda row: ToolRegistry(tools_for_goal_sessions(row.config))  # noqa: E731
    async with Runtime.open(db_path, models=registry, tools=tools) as rt:
        async with GoalEngine.running(rt, timer_interval=0.05) as engine:
            yield rt, engine


def copy_of(goal: Goal, **changes: object) -> Goal:
    """A second goal row like ``goal`` (a new id and session unless given)."""
    fresh = {"id": GoalId.new(), "session_id": "ses_copy_" + GoalId.new()[-8:], "key": None, "idempotency_key": None}
    return goal.model_copy(update=fresh | changes)


async def test_each_refusal_is_a_goal_conflict_and_its_transaction_writes_nothing(
    db_path: Path | str, tmp_path: Path
) -> None:
    """Each refusal of a goal row is a GoalConflict on both stores, raised by its transaction (on
    PostgreSQL by the round trip that carries the row: here the COMMIT), which writes nothing else;
    a transaction whose function caught the refusal fails all the same."""
    (tmp_path / "a" / "in").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    async with engine_on(db_path) as (rt, engine):
        holder = await engine.create(GoalSpec(objective="hold a", workdir=str(tmp_path / "a"), key="the-key"))
        ended = await engine.create(GoalSpec(objective="in b", workdir=str(tmp_path / "b")))
        await engine.cancel(ended.id)
        free = copy_of(holder, workdir=str(tmp_path / "b"))

        def refused(goal: Goal, caught: bool) -> Callable[[Tx], None]:
            def run(tx: Tx) -> None:
                with contextlib.suppress(GoalConflict) if caught else contextlib.nullcontext():
                    insert_goal(tx, goal)
                insert_goal(tx, free)  # would go in: the transaction's refusal takes it back

            return run

        seen = []
        for goal in (
            copy_of(holder, workdir=str(tmp_path / "a" / "in")),  # the trigger: inside a held directory
            copy_of(holder, workdir=None, key="the-key"),  # goals.key
            copy_of(holder, workdir=None, session_id=holder.session_id),  # one live goal per session
        ):
            for caught in (False, True):
                with pytest.raises(GoalConflict) as info:
                    await rt.store.transact(refused(goal, caught))
                seen.append(str(info.value))

        def revive(tx: Tx) -> None:  # the update trigger: reviving the ended goal into the held directory
            current = tx.one("SELECT revision FROM goals WHERE id=?", (ended.id,))
            assert current is not None
            revived = copy_of(ended, id=ended.id, session_id=ended.session_id, status=holder.status)
            save_goal(tx, revived.model_copy(update={"workdir": str(tmp_path / "a")}), int(current[0]))
            insert_goal(tx, free)

        with pytest.raises(GoalConflict) as info:
            await rt.store.transact(revive)
        seen.append(str(info.value))
        assert all("is held by another active or paused goal" in s for s in seen[0:2]), seen
        assert all("a goal with key 'the-key' already exists" in s for s in seen[2:4]), seen
        assert all(f"session {holder.session_id} already has an active or paused goal" in s for s in seen[4:6])
        assert "is held by another active or paused goal" in seen[6]
        count = await rt.store.read(lambda c: c.execute("SELECT COUNT(*) FROM goals").fetchone()[0])
        assert int(count) == 2
        await rt.store.transact(lambda tx: insert_goal(tx, free))  # a goal in a free directory goes in
        count = await rt.store.read(lambda c: c.execute("SELECT COUNT(*) FROM goals").fetchone()[0])
        assert int(count) == 3


async def test_the_triggers_refuse_a_raw_write_with_the_same_text(db_path: Path | str, tmp_path: Path) -> None:
    (tmp_path / "a" / "in").mkdir(parents=True)
    (tmp_path / "ab").mkdir()
    async with engine_on(db_path) as (rt, engine):
        holder = await engine.create(GoalSpec(objective="hold a", workdir=str(tmp_path / "a")))
        # The schema refuses a write that skips the engine's checks: the same directory, one inside
        # it, one around it.
        for workdir in (tmp_path / "a", tmp_path / "a" / "in", tmp_path):
            with pytest.raises(integrity_errors(), match=HELD):
                await rt.store.transact(partial(insert_raw, goal=copy_of(holder, workdir=str(workdir))))
        # A neighbour whose name merely starts with the holder's is free; reviving it (ended) into
        # the held directory is refused by the update trigger.
        sibling = copy_of(holder, workdir=str(tmp_path / "ab"))
        await rt.store.transact(lambda tx: insert_raw(tx, sibling))
        await rt.store.transact(
            lambda tx: tx.execute(
                "UPDATE goals SET status='cancelled', workdir=? WHERE id=?", (str(tmp_path / "a"), sibling.id)
            )
        )
        with pytest.raises(integrity_errors(), match=HELD):
            await rt.store.transact(lambda tx: tx.execute("UPDATE goals SET status='active' WHERE id=?", (sibling.id,)))
        # An update that leaves status and directory as they are is not checked again.
        await rt.store.transact(lambda tx: tx.execute("UPDATE goals SET title='renamed' WHERE id=?", (holder.id,)))


def insert_raw(tx: Tx, goal: Goal) -> None:
    """``goal``'s row by a plain INSERT, past the engine's own checks (the schema alone refuses it)."""
    values = row_values(goal)
    tx.execute(
        f"INSERT INTO goals({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})",
        [values[c] for c in COLUMNS],
    )
