"""The functions through which other packages reach a package's tables, on a real SQLite file.

The runtime offers what the goal engine and the daemon once did with their own SQL: cancel the
queued message holding a pending key (through the inbox's fate transition), tell whether a key is
pending, attach a guard and settings to a session, list sessions, follow a session's parents, read
the first kept sequence number. ``goals.store`` offers the goal queries the daemon needs (counts by
status, the live goals, the live goal of a chain of sessions, a session's latest goal). Bad input
is refused with a clear error and writes nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from agent import (
    EventType,
    Fate,
    InvalidInput,
    Limits,
    NotFound,
    Store,
    Tx,
    cancel_pending,
    create_guard,
    create_session,
    enqueue,
    first_kept_seq,
    get_message,
    is_pending,
    list_sessions,
    load_session,
    parse_content,
    session_chain,
    update_session,
)
from goals import (
    MIGRATIONS,
    Budgets,
    Goal,
    GoalId,
    GoalStatus,
    StopRules,
    goal_by_key,
    goal_counts,
    latest_goal_of_session,
    live_goal_of_chain,
    live_goals,
)
from goals.store import insert_goal

NOW = datetime(2025, 1, 1, tzinfo=UTC)


async def _store(path: Path) -> Store:
    store = await Store.open(path)
    await store.migrate("goals", MIGRATIONS)
    return store


def _goal(session_id: str, guard_id: str, status: GoalStatus, key: str | None = None) -> Goal:
    return Goal(
        id=GoalId.new(),
        key=key,
        title="t",
        objective="o",
        status=status,
        session_id=session_id,
        guard_id=guard_id,
        budgets=Budgets(),
        verify=[],
        rules=StopRules(),
        created_at=NOW,
        updated_at=NOW,
    )


async def test_cancel_pending_cancels_the_queued_message_holding_the_key(db_path: Path) -> None:
    async with await _store(db_path) as store:
        sid = await store.transact(lambda tx: create_session(tx))
        receipt = await store.transact(
            lambda tx: enqueue(tx, sid, parse_content("go on"), pending_key="k:1", yields_to_followup=True)
        )
        assert await store.read(lambda conn: is_pending(conn, "k:1"))
        assert (await store.session_state(sid)).status == "running"

        with pytest.raises(InvalidInput, match="cancel reason must not be empty"):
            await store.transact(lambda tx: cancel_pending(tx, "k:1", " "))
        assert await store.read(lambda conn: is_pending(conn, "k:1"))

        assert await store.transact(lambda tx: cancel_pending(tx, "k:1", "goal paused")) == [receipt.message_id]
        row = await store.read(lambda conn: get_message(conn, receipt.message_id))
        assert row is not None and (row["fate"], row["cancel_reason"]) == (Fate.CANCELLED, "goal paused")
        events = await store.events_after(sid, receipt.seq)
        assert [(e.type, e.data.get("messageId"), e.data.get("reason"), e.data.get("status")) for e in events] == [
            (EventType.STATUS, None, None, "running"),
            (EventType.MESSAGE_CANCELLED, receipt.message_id, "goal paused", None),
            (EventType.STATUS, None, None, "idle"),
        ]
        # Nothing else keeps the session running: it commits idle in the same transaction.
        assert (await store.session_state(sid)).status == "idle"
        assert not await store.read(lambda conn: is_pending(conn, "k:1"))
        # Nothing queued under the key any more: a second cancel finds nothing and writes nothing.
        last = (await store.session_state(sid)).last_seq
        assert await store.transact(lambda tx: cancel_pending(tx, "k:1", "again")) == []
        assert (await store.session_state(sid)).last_seq == last


async def test_update_session_sets_the_guard_and_merges_config_keys(db_path: Path) -> None:
    async with await _store(db_path) as store:
        sid = await store.transact(lambda tx: create_session(tx, config={"agent": {"max_steps": 3}, "policy": 1}))
        guard = await store.transact(lambda tx: create_guard(tx, Limits(max_tokens=10)))
        row = await store.transact(
            lambda tx: update_session(tx, sid, guard_id=guard, config={"goal": True, "policy": 2})
        )
        assert row == await store.read(lambda conn: load_session(conn, sid))
        assert row.guard_id == guard
        assert row.config == {"agent": {"max_steps": 3}, "policy": 2, "goal": True}

        for call, match in [
            (lambda tx: update_session(tx, "ses_" + "0" * 26, config={"x": 1}), "no session"),
            (lambda tx: update_session(tx, sid, guard_id="grd_" + "0" * 26), "no spend guard"),
        ]:
            with pytest.raises(NotFound, match=match):
                await store.transact(call)
        assert await store.read(lambda conn: load_session(conn, sid)) == row


async def test_sessions_their_chain_of_parents_and_first_kept_seq(db_path: Path) -> None:
    async with await _store(db_path) as store:

        def tree(tx: Tx) -> tuple[str, str, str]:
            root = create_session(tx, model="scripted:echo")
            child = create_session(tx, parent_session_id=root)
            return root, child, create_session(tx, parent_session_id=child)

        root, child, grandchild = await store.transact(tree)
        assert await store.read(lambda conn: session_chain(conn, grandchild)) == [grandchild, child, root]
        assert await store.read(lambda conn: session_chain(conn, root)) == [root]
        assert await store.read(lambda conn: session_chain(conn, "ses_" + "0" * 26)) == []

        listed = await store.read(lambda conn: list_sessions(conn, "ses_", 2))
        assert [s.id for s in listed] == [grandchild, child]
        assert listed[0].parent_session_id == child
        assert [s.id for s in await store.read(lambda conn: list_sessions(conn, root, 10))] == [root]

        assert await store.first_kept_seq(root) == 1
        assert await store.read(lambda conn: first_kept_seq(conn, "ses_" + "0" * 26)) is None


async def test_goal_queries_for_other_packages(db_path: Path) -> None:
    async with await _store(db_path) as store:

        def setup(tx: Tx) -> tuple[str, str, str, Goal, Goal]:
            guard = create_guard(tx, Limits())
            root = create_session(tx)
            child = create_session(tx, parent_session_id=root)
            other = create_session(tx)
            done = _goal(root, guard, GoalStatus.COMPLETED, key="old")
            live = _goal(root, guard, GoalStatus.PAUSED, key="now")
            for goal in (done, live):
                insert_goal(tx, goal)
            return root, child, other, done, live

        root, child, other, done, live = await store.transact(setup)
        counts = await store.read(goal_counts)
        assert counts == {s.value: 0 for s in GoalStatus} | {"completed": 1, "paused": 1}
        assert [g.id for g in await store.read(live_goals)] == [live.id]
        # A subagent's session works under its root's live goal.
        found = await store.read(lambda conn: live_goal_of_chain(conn, session_chain(conn, child)))
        assert found is not None and found.id == live.id
        assert await store.read(lambda conn: live_goal_of_chain(conn, session_chain(conn, other))) is None
        latest = await store.read(lambda conn: latest_goal_of_session(conn, root))
        assert latest is not None and latest.id == live.id
        assert await store.read(lambda conn: latest_goal_of_session(conn, other)) is None
        by_key = await store.read(lambda conn: goal_by_key(conn, "old"))
        assert by_key is not None and by_key.id == done.id
        assert await store.read(lambda conn: goal_by_key(conn, "nope")) is None
