"""A node takes up a session it claimed (repairs what the last holder left mid-turn) under that
session's own lock when the session has no subagents: the writer lock shared, so every other
session's writes in the cluster go on meanwhile (issue 30: the take-up was one of the transactions
that held the cluster alone while goals ran). A session with subagents is a tree the repair touches
as a whole: it still takes the writer lock alone.

Each take-up's transaction is told apart by its first statement, the repair's read of open turns,
and the opening sent before it on the same store thread (the trace names the thread).
"""

from __future__ import annotations

import threading
from pathlib import Path

from goalkit import goal_runtime

from agent import Reply
from agent.backends import WRITER_LOCK
from agent.sessions import create_session
from daemon.cluster.node import _take_up
from daemon.cluster.settings import ClusterSettings

REPAIR = "SELECT id, session_id, start_seq FROM turns WHERE end_reason IS NULL"


def opening_of_take_up(trace: list[tuple[str, str]], session_id: str) -> str:
    """The opening of the transaction whose repair read the open turns of ``session_id``'s tree."""
    for i, (thread, sql) in enumerate(trace):
        if sql.startswith(REPAIR):
            opening = next(s for t, s in reversed(trace[:i]) if t == thread and s.startswith("BEGIN"))
            if "goald_" not in opening or f"'{session_id}'" in opening:
                return opening
    raise AssertionError(f"no take-up of {session_id} in the trace")


async def test_a_session_without_subagents_is_taken_up_under_its_own_lock(pg_dsn: str, tmp_path: Path) -> None:
    async with goal_runtime(pg_dsn, [Reply.say("unused")]) as (rt, engine, _):
        lone = await rt.create_session()
        root = await rt.create_session()
        await rt.store.transact(lambda tx: create_session(tx, parent_session_id=root))
        trace: list[tuple[str, str]] = []
        await rt.store.trace(lambda sql: trace.append((threading.current_thread().name, sql)))
        try:
            await _take_up(rt, engine, ClusterSettings(node_name="a"), lone, "node-x")
            lone_opening = opening_of_take_up(trace, lone)
            trace.clear()
            await _take_up(rt, engine, ClusterSettings(node_name="a"), root, "node-x")
            tree_opening = opening_of_take_up(trace, root)
        finally:
            await rt.store.trace(None)
    # The lone session: its lock and the writer lock shared (goald_begin, or goald_check on the
    # state this node knows), never the writer lock alone.
    assert f"({WRITER_LOCK}, " in lone_opening and f"'{lone}'" in lone_opening, lone_opening
    assert f"pg_advisory_xact_lock({WRITER_LOCK})" not in lone_opening, lone_opening
    # The tree: the cluster to itself.
    assert tree_opening.strip() == f"BEGIN; SELECT pg_advisory_xact_lock({WRITER_LOCK})", tree_opening
