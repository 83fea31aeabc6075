"""This daemon as a node: the lease manager joined to the runtime and the goal engine.

- the runtime loads (and so drives) an agent only for a session this node holds (``rt.leases``);
- the goal engine follows, times and decides only the goals of held sessions, and none while the
  node drains (``engine.owns``), so a drained goal's session rests at its next idle and is released;
- a session taken over is repaired first — for it and its subagents only — then its goal adopted
  (paused, with the reason, when its work directory is not on this node and the config does not
  declare them shared), and its driver started if it has queued work;
- a session lost or released is let go: its goal no longer followed, its agent unloaded (a write it
  still tries is refused by the fence).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from loguru import logger

from agent import AgentStatus, NotFound, Runtime, Tx
from agent.inbox import queued_waking
from agent.retention import session_descendants
from agent.subagents import settle_orphans
from agent.turns import repair
from daemon.cluster.lease_rows import MIGRATIONS
from daemon.cluster.leases import LeaseManager, expected_failure
from daemon.cluster.settings import ClusterSettings
from goals import GoalEngine
from goals.model import Goal


async def join(dsn: str, rt: Runtime, engine: GoalEngine, settings: ClusterSettings) -> LeaseManager:
    """Make this daemon a node of the cluster on ``dsn`` (see the module docstring); the first
    heartbeat, which claims free work, follows at once."""
    await rt.store.migrate("cluster", MIGRATIONS)
    leases = LeaseManager(dsn, rt.store, settings)
    rt.leases = leases
    engine.owns = leases.drives  # a draining node decides nothing: its sessions come to rest

    async def claimed(session_id: str, previous: str | None) -> None:
        await _take_up(rt, engine, settings, session_id, previous)

    async def lost(session_id: str) -> None:
        engine.drop(session_id)
        for sid in [s for s in rt.live_agents if leases.root(s) == session_id]:
            with contextlib.suppress(Exception):  # its last writes are refused by the fence
                await rt.unload(sid, grace=0)

    async def releasable(session_id: str, done_only: bool) -> bool:
        agent = rt.live_agents.get(session_id)
        if agent is not None and agent.status is not AgentStatus.IDLE:
            return False
        if done_only and engine.follows(session_id):
            return False
        state = await rt.store.session_state(session_id)
        if state.status is not AgentStatus.IDLE or state.open_turn is not None:
            return False
        return not await rt.store.read(lambda conn: queued_waking(conn, session_id))

    async def undrained() -> None:
        # A drained goal's session that came to rest but was not yet released: decide for it again.
        for sid in list(leases.held):
            if not engine.follows(sid):
                try:
                    await engine.adopt(sid)
                except Exception as exc:  # the next idle or a restart takes it up; the heartbeat goes on
                    if (why := expected_failure(exc)) is None:
                        logger.exception("could not take up session {} again after the drain", sid)
                    else:
                        logger.warning("could not take up session {} again after the drain: {}", sid, why)

    leases.on_claimed, leases.on_lost, leases.releasable = claimed, lost, releasable
    leases.on_undrained = undrained
    await leases.start(rt.spawn)
    return leases


async def _take_up(
    rt: Runtime, engine: GoalEngine, settings: ClusterSettings, session_id: str, previous: str | None
) -> None:
    subtree = [session_id, *await rt.store.read(lambda conn: session_descendants(conn, session_id))]

    def fix(tx: Tx) -> list[str]:
        tx.fence(session_id)
        return settle_orphans(tx, repair(tx, subtree), subtree[1:])

    # A session without subagents is repaired under its own lock (the writer lock shared: the other
    # sessions' writes go on meanwhile); a tree touches several sessions: the cluster to itself.
    with_work = await rt.store.transact(fix, session=session_id if len(subtree) == 1 else None)
    # Held, so of use here: read now, it is published from this read on even when a notification of
    # another node's commit to it is lost (the slow poll covers it: agent.relay.follow).
    with contextlib.suppress(NotFound):
        await rt.store.session_state(session_id)
    if previous is not None:
        what = "queued work resumes" if with_work else "nothing queued"
        logger.info("session {} taken over from node {}: repaired; {}", session_id, previous, what)

    def workdir_missing(goal: Goal) -> str | None:
        if settings.shared_workdirs or goal.workdir is None or Path(goal.workdir).is_dir():
            return None
        return (
            f"its work directory {goal.workdir} is not on this node; run it on the node that has it"
            " (or declare [cluster] shared_workdirs) and resume it"
        )

    await engine.adopt(session_id, check=workdir_missing)
    if session_id in with_work:
        rt.wake(session_id)


__all__ = ["join"]
