"""What the host reports about itself: uptime, goals by status, the ``daemon/health`` answer,
systemd's one-line ``STATUS=``, and the asyncio tasks' stacks on SIGUSR1.

:class:`HostStatus` is that part of :class:`daemon.host.Host` (which sets these attributes).
"""

from __future__ import annotations

import asyncio
import io
import time
from datetime import UTC, datetime
from typing import Any

from loguru import logger

from agent import AgentStatus, Runtime
from agent.db import pg_errors
from agent.errors import StorageUnavailable
from agent.models.health import ProviderHealth
from daemon import __version__
from daemon.cluster import LeaseManager
from daemon.metrics import SlotSemaphore
from daemon.run_state import RunState
from goals import GoalEngine, goal_counts


def dump_tasks() -> None:
    """Log every asyncio task with its stack (SIGUSR1): what a stuck daemon is waiting for."""
    tasks = asyncio.all_tasks()
    logger.warning("{} asyncio task(s):", len(tasks))
    for task in tasks:
        stack = io.StringIO()
        task.print_stack(limit=12, file=stack)
        logger.warning("{}\n{}", task.get_name(), stack.getvalue())


class HostStatus:
    """The host's observation of itself (mixed into :class:`daemon.host.Host`)."""

    state: RunState
    started: float
    rt: Runtime | None
    engine: GoalEngine | None
    leases: LeaseManager | None
    healths: dict[str, ProviderHealth]
    _slots: SlotSemaphore

    def uptime(self) -> float:
        """Seconds since the process started serving."""
        return time.monotonic() - self.started

    async def goal_counts(self) -> dict[str, int]:
        """Goals by status."""
        assert self.rt is not None
        return await self.rt.store.read(goal_counts)

    def sessions_running(self) -> int:
        """Live sessions whose status is running."""
        if self.rt is None:
            return 0
        return sum(1 for a in self.rt.live_agents.values() if a.status is AgentStatus.RUNNING)

    def status_line(self, *, live: int | None = None) -> str:
        """The one-line status for systemd's ``STATUS=`` (``live``: the live goals, when the engine
        has not loaded them yet)."""
        engine = self.engine
        if live is None:
            live = engine.live_goal_count if engine is not None else 0
        return f"{self.state.value}; {live} live goal(s); {self.sessions_running()} session(s) running"

    async def _goal_counts_now(self) -> dict[str, int]:
        if self.rt is None:
            return {}
        try:
            return await self.goal_counts()
        except StorageUnavailable:  # unreachable (PostgreSQL): "storage" says so, the health still answers
            return {}

    async def health(self) -> dict[str, Any]:
        """The ``daemon/health`` answer."""
        return {
            "status": self.state.value,
            "version": __version__,
            "uptimeSeconds": round(self.uptime(), 3),
            "goals": await self._goal_counts_now(),
            "sessionsRunning": self.sessions_running(),
            # Turn slots (max_concurrent_turns): taken, and turns waiting for one.
            "slots": self._slots.snapshot(),
            "providers": {name: h.snapshot() for name, h in self.healths.items()},
            # Whether the store can write; if not, the error and what to do (cleared by the next write).
            "storage": self.rt.store.storage_health() if self.rt is not None else {"ok": True},
            "time": datetime.now(UTC).isoformat(),
            # A node of a cluster (PostgreSQL): this node, and every node with its leases.
            "cluster": await self._cluster_view(),
        }

    async def _cluster_view(self) -> dict[str, Any] | None:
        if self.leases is None:
            return None
        view = self.leases.snapshot()
        try:
            view["nodes"] = await self.leases.nodes()
        except pg_errors() as exc:  # unreachable: "storage" says so; this node's own view stands
            view["nodes"] = None
            view["error"] = view["error"] or str(exc).strip().splitlines()[0]
        return view
