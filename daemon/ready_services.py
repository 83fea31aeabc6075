"""The services the host starts once it is ready and stops as it stops: the systemd watchdog,
retention, metrics and notifications.

They start after ``READY=1``, so readiness waits on none of them. They stop in two steps around
the goal engine's stop: the watchdog and retention first (they take no part in stopping turns),
the metrics' last write and the notification sender last, while the store is still open.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from agent import Runtime
from daemon.alerts import Alerts
from daemon.cluster.jobs import one_at_a_time
from daemon.cluster.leases import LeaseManager
from daemon.metrics_service import MetricsService
from daemon.notify import Notifier, StatusFn, watchdog_loop
from daemon.settings import Settings
from goals.retention import retention_loop


@dataclass
class ReadyServices:
    """The tasks and services started after ``READY=1`` (runtime handles, never serialized)."""

    watchdog: asyncio.Task[None]
    #: Periodic retention; ``None`` when ``[retention] interval_seconds = 0``.
    retainer: asyncio.Task[None] | None
    metrics: MetricsService
    alerts: asyncio.Task[None]

    @classmethod
    async def start(
        cls,
        rt: Runtime,
        settings: Settings,
        *,
        notifier: Notifier,
        status: StatusFn,
        metrics: MetricsService,
        alerts: Alerts,
        healthy: Callable[[], bool],
        leases: LeaseManager | None = None,
    ) -> ReadyServices:
        """Start each service in the runtime's task group; in a cluster (``leases``), retention and
        the notification sender (with the dead-man request) run on one node at a time."""
        s = settings
        watchdog = rt.spawn(watchdog_loop(notifier, status))
        retainer = None
        if s.retention.interval_seconds > 0:
            policy, every = s.retention.policy(s.roots, s.snapshots_dir), s.retention.interval_seconds
            retainer = rt.spawn(one_at_a_time(leases, "retention", lambda: retention_loop(rt.store, policy, every)))
        await metrics.start(rt.spawn)
        sender = rt.spawn(one_at_a_time(leases, "notifications", lambda: alerts.run(rt.store, healthy)))
        return cls(watchdog, retainer, metrics, sender)

    def stop_first(self) -> None:
        """Stop the watchdog and retention (the first step of stopping)."""
        self.watchdog.cancel()
        if self.retainer is not None:
            self.retainer.cancel()

    async def stop_last(self) -> None:
        """The metrics file's last write and the notification sender, before the store closes."""
        await self.metrics.stop()
        self.alerts.cancel()
