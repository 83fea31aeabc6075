"""Running a job on one node of the cluster at a time (the notification sender with the dead-man
request, retention): :func:`one_at_a_time`. Without a cluster the job simply runs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from loguru import logger

from daemon.cluster.leases import LeaseManager, expected_failure


async def one_at_a_time(leases: LeaseManager | None, job: str, start: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``start()`` while this node holds ``job`` (at once without a cluster); cancel it when the
    node loses the job, and run it again when it gets it back. Until cancelled."""
    if leases is None:
        await start()
        return
    leases.wanted_jobs.add(job)
    leases.kick()
    while True:
        while not leases.runs(job):
            leases.jobs_changed.clear()
            await leases.jobs_changed.wait()
        task = asyncio.create_task(start())
        try:
            while leases.runs(job) and not task.done():
                leases.jobs_changed.clear()
                waiter = asyncio.create_task(leases.jobs_changed.wait())
                try:
                    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
        finally:
            if not task.done():
                task.cancel()
                await asyncio.wait({task})
            # Retrieved on every way out, a cancel of this loop included (else "Task exception was
            # never retrieved" when the job failed as it was stopped).
            failure = None if task.cancelled() else task.exception()
        if failure is not None:
            if (why := expected_failure(failure)) is not None:
                logger.warning("the cluster's {} stopped: {}; it starts again", job, why)
            else:
                logger.opt(exception=failure).error("the cluster's {} failed; it starts again", job)
            await asyncio.sleep(leases.settings.heartbeat_seconds)


__all__ = ["one_at_a_time"]
