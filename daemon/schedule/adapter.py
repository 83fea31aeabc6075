"""APScheduler 3, adapted to goald's schedules: a trigger over goald's own fire-time arithmetic,
and an executor that hands a due job its run times.

APScheduler is imported, and these classes made, on first use (:func:`aps_classes`): its import
scans every installed distribution's entry points, which the daemon's start (on the way to
``READY=1``) need not pay when no schedule exists.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import Any

from daemon.schedule.model import AnyTrigger, zone
from daemon.schedule.timing import next_fire


@functools.cache
def aps_classes() -> tuple[Any, type, type]:
    """APScheduler's ``AsyncIOScheduler`` and goald's trigger and executor for it, made on first use
    (APScheduler is imported here: see the module docstring)."""
    from apscheduler.executors.base import BaseExecutor  # type: ignore[import-untyped]
    from apscheduler.schedulers.asyncio import AsyncIOScheduler  # type: ignore[import-untyped]
    from apscheduler.triggers.base import BaseTrigger  # type: ignore[import-untyped]

    class _AtFireTimes(BaseTrigger):  # type: ignore[misc]
        """An APScheduler trigger over :func:`daemon.schedule.timing.next_fire`."""

        __slots__ = ("_trigger", "_tz")

        def __init__(self, trigger: AnyTrigger, tz: str) -> None:
            self._trigger = trigger
            self._tz = zone(tz)

        def get_next_fire_time(self, previous_fire_time: datetime | None, now: datetime) -> datetime | None:
            return next_fire(self._trigger, self._tz, previous_fire_time or now)

    class _DueExecutor(BaseExecutor):  # type: ignore[misc]
        """Hands a due job its run times: APScheduler 3's executors call the job without them.

        No instance limit applies: each schedule's fires are serialized by the scheduler's own lock,
        so an instant is never dropped because the previous fire is still running.
        """

        def __init__(self, spawn: Callable[[Coroutine[Any, Any, None]], None]) -> None:
            super().__init__()
            self._spawn = spawn

        def submit_job(self, job: Any, run_times: list[datetime]) -> None:
            self._do_submit_job(job, run_times)

        def _do_submit_job(self, job: Any, run_times: list[datetime]) -> None:
            self._spawn(job.func(*job.args, run_times=list(run_times)))

    return AsyncIOScheduler, _AtFireTimes, _DueExecutor


__all__ = ["aps_classes"]
