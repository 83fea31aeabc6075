"""The scheduler service: schedules are rows in the goald store; APScheduler does the timing.

The rows are the single source of truth. APScheduler 3's ``AsyncIOScheduler`` holds in-memory
jobs rebuilt from the rows at start and after every change, with ``misfire_grace_time=None``
(a late fire is never dropped by APScheduler) and without its own coalescing: every instant it
hands over reaches :meth:`Scheduler._run_due`, which records what became of it. Its job triggers
wrap :func:`daemon.schedule.timing.next_fire`, so the times a job fires at and the next fire time that
``schedule list`` shows come from the same arithmetic.

Every scheduled instant ends as exactly one ``schedule_runs`` row (``fired``,
``skipped_concurrency``, ``missed``, ``coalesced`` or ``error``, with a reason) and a
``schedule/run`` event in the schedule's own session, committed in one transaction with the
schedule's cursor ``last_fire_at`` (the latest instant handled) and ``last_goal_id``. The goal
itself is created by the ``fire`` callback before that transaction, with the idempotency key
``<schedule id>@<instant>``: if goald dies in between, the instant is still due at the next
start and firing it again finds the goal it already made.

At start, fires that came due while goald was down are settled from ``last_fire_at`` and the
injected clock (:func:`daemon.schedule.timing.missed_runs`). The clock is also the authority for
deadlines; APScheduler's own wall clock only decides when to wake up.

APScheduler is imported, and its scheduler made, when the first schedule is armed: its import
scans every installed distribution's entry points, which the daemon's start (on the way to
``READY=1``) need not pay when no schedule exists.

The rows and every query of them are in :mod:`daemon.schedule.store`, the APScheduler trigger and
executor in :mod:`daemon.schedule.adapter`; the table's schema and event names are re-exported here.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from loguru import logger

from agent import AgentError, InvalidInput, NotFound, Store, TaskSet
from daemon.schedule.adapter import aps_classes
from daemon.schedule.model import RunOutcome, Schedule, ScheduleRun, ScheduleSpec
from daemon.schedule.store import (
    MIGRATIONS,
    SCHEDULE_CHANGED,
    SCHEDULE_RUN,
    RunRow,
    delete_schedule,
    iso,
    list_runs,
    list_schedules,
    load_schedule,
    record_runs,
    resolve_schedule,
    save_schedule,
)
from daemon.schedule.timing import missed_runs, next_fire

#: Goal statuses during which the previous goal still counts as running (concurrency policy).
_LIVE = ("active", "paused")
#: How long :meth:`Scheduler.stop` lets fires in flight finish before cancelling them.
STOP_GRACE_SECONDS = 10.0

Clock = Callable[[], datetime]
FireFn = Callable[[Schedule, datetime], Awaitable[str]]


def _utcnow() -> datetime:
    return datetime.now(UTC)


class Scheduler:
    """Durable schedules that create goals. ``await start()`` … ``await stop()``."""

    def __init__(
        self,
        store: Store,
        *,
        fire: FireFn,
        goal_status: Callable[[str], Awaitable[str | None]],
        cancel_goal: Callable[[str], Awaitable[None]],
        clock: Clock = _utcnow,
    ) -> None:
        self.store = store
        self.clock = clock
        self._fire = fire
        self._goal_status = goal_status
        self._cancel_goal = cancel_goal
        #: APScheduler's scheduler, made when the first schedule is armed (``None``: none yet, or stopped).
        self._aps: Any = None
        self._running = False
        self._locks: dict[str, asyncio.Lock] = {}
        self._tasks = TaskSet()
        self._stopping = False

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Migrate, settle the fires missed while goald was down, and start timing."""
        await self.store.migrate("schedules", MIGRATIONS)
        self._stopping = False
        self._running = True
        schedules = await self.list()
        for sched in schedules:
            await self._catch_up(sched)
            self._plan(await self.get(sched.id))
        logger.info("scheduler started: {} schedule(s), {} armed", len(schedules), len(self.planned()))

    async def stop(self) -> None:
        """Stop timing; fires in flight get a grace period to finish, then are cancelled."""
        self._stopping = True
        self._running = False
        if self._aps is not None and self._aps.running:
            self._aps.shutdown(wait=False)
            # AsyncIOScheduler.shutdown runs as a loop callback; callbacks run in order.
            done = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_soon(done.set_result, None)
            await done
        self._aps = None
        await self._tasks.drain(STOP_GRACE_SECONDS)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        if self._stopping:
            coro.close()
            return
        self._tasks.spawn(coro)

    # -- the public API --------------------------------------------------------------------

    async def add(self, spec: ScheduleSpec | Mapping[str, Any]) -> Schedule:
        """Add a schedule, or update the one with the same ``key`` (declared schedules reload by key).

        Raises:
            InvalidInput: the spec is invalid (a bad cron expression, time zone, interval or
                template), or a one-shot time is already past; nothing is written.
        """
        spec = ScheduleSpec.parse(spec)
        now = self.clock()

        schedule_id = await self.store.transact(lambda tx: save_schedule(tx, spec, now))
        sched = await self.get(schedule_id)
        self._plan(sched)
        return sched

    async def get(self, ref: str) -> Schedule:
        """A schedule by id, unique id prefix or key, with its next fire time and last outcome."""
        sched = await self.store.read(lambda conn: load_schedule(conn, resolve_schedule(conn, ref)))
        return self._with_next(sched)

    async def list(self) -> list[Schedule]:
        """Every schedule, oldest first, with its next fire time and last outcome."""

        return [self._with_next(s) for s in await self.store.read(list_schedules)]

    async def remove(self, ref: str) -> Schedule:
        """Remove a schedule (by id, unique id prefix or key); its runs and session stay as history."""

        sched = await self.store.transact(lambda tx: delete_schedule(tx, ref))
        if self._aps is not None and self._aps.get_job(sched.id) is not None:
            self._aps.remove_job(sched.id)
        self._locks.pop(sched.id, None)
        return sched

    async def runs(self, ref: str, limit: int = 20) -> builtins.list[ScheduleRun]:
        """A schedule's runs, newest first."""
        if limit < 1:
            raise InvalidInput("limit must be at least 1")

        return await self.store.read(lambda conn: list_runs(conn, ref, limit))

    async def fire_now(
        self, schedule_id: str, scheduled_for: datetime, *, note: str | None = None
    ) -> ScheduleRun | None:
        """Fire one scheduled instant: the path every job takes.

        Applies the concurrency policy against the schedule's previous goal, creates the goal,
        and records the run (with its event and the cursor) in one transaction. An instant at or
        before the cursor was already handled: nothing happens and ``None`` is returned.
        """
        async with self._lock(schedule_id):
            return await self._fire_locked(schedule_id, scheduled_for, note)

    def planned(self) -> dict[str, datetime]:
        """The next wake-up of every APScheduler job, by schedule id (what timing is armed)."""
        if self._aps is None:
            return {}
        return {job.id: job.next_run_time for job in self._aps.get_jobs()}

    # -- internals -------------------------------------------------------------------------

    def _lock(self, schedule_id: str) -> asyncio.Lock:
        return self._locks.setdefault(schedule_id, asyncio.Lock())

    def _with_next(self, sched: Schedule) -> Schedule:
        after = self.clock()
        if sched.last_fire_at is not None:
            after = max(after, sched.last_fire_at)
        return sched.model_copy(update={"next_fire_at": next_fire(sched.effective_trigger(), sched.timezone, after)})

    def _plan(self, sched: Schedule) -> None:
        """(Re)build the schedule's APScheduler job from its row."""
        if not self._running:
            return
        if self._aps is not None and self._aps.get_job(sched.id) is not None:
            self._aps.remove_job(sched.id)
        if sched.next_fire_at is None:
            return
        scheduler_class, trigger_class, executor_class = aps_classes()
        if self._aps is None:
            self._aps = scheduler_class(
                timezone=UTC,
                executors={"default": executor_class(self._spawn)},
                job_defaults={"misfire_grace_time": None, "coalesce": False},
            )
            self._aps.start()
        self._aps.add_job(
            self._run_due,
            trigger=trigger_class(sched.effective_trigger(), sched.timezone),
            args=(sched.id,),
            id=sched.id,
            name=sched.key or sched.id,
            next_run_time=sched.next_fire_at,
            misfire_grace_time=None,
            coalesce=False,
        )

    async def _catch_up(self, sched: Schedule) -> None:
        since = max(t for t in (sched.last_fire_at, sched.active_since) if t is not None)
        plan = missed_runs(
            sched.effective_trigger(),
            sched.timezone,
            since,
            self.clock(),
            sched.misfire,
            sched.starting_deadline_seconds,
        )
        settled: list[RunRow] = [
            (r.scheduled_for, r.outcome, r.reason, None) for r in plan if r.outcome != RunOutcome.FIRED
        ]
        async with self._lock(sched.id):
            if settled:
                await self.store.transact(lambda tx: record_runs(tx, sched, settled))
                logger.info("schedule {}: {} fire(s) missed while goald was down", sched.id, len(settled))
            for r in plan:
                if r.outcome == RunOutcome.FIRED:
                    await self._fire_locked(sched.id, r.scheduled_for, r.reason)

    async def _run_due(self, schedule_id: str, run_times: Sequence[datetime] = ()) -> None:
        """What a job runs: settle the instants APScheduler found due (normally exactly one).

        ``run_times`` is passed by the executor of :mod:`daemon.schedule.adapter` (APScheduler
        checks the job's signature against its ``args``, hence the default).
        """
        try:
            async with self._lock(schedule_id):
                try:
                    sched = await self.store.read(lambda conn: load_schedule(conn, schedule_id))
                except NotFound:
                    return
                cursor = sched.last_fire_at
                due = sorted(t for t in run_times if cursor is None or t > cursor)
                if not due:
                    return
                *earlier, last = due
                settled: list[RunRow] = []
                kind = RunOutcome.COALESCED if sched.misfire == "coalesce" else RunOutcome.MISSED
                for t in earlier:
                    settled.append(
                        (t, kind, f"the scheduler woke late; {kind.value} (a later fire, {iso(last)}, runs)", None)
                    )
                late = (self.clock() - last).total_seconds()
                deadline = sched.starting_deadline_seconds
                fire = deadline is None or late <= deadline
                if not fire:
                    settled.append(
                        (
                            last,
                            RunOutcome.MISSED,
                            f"missed: {late:.0f}s late, past the starting deadline of {deadline:g}s",
                            None,
                        )
                    )
                if settled:
                    await self.store.transact(lambda tx: record_runs(tx, sched, settled))
                if fire:
                    await self._fire_locked(schedule_id, last, None)
        except Exception:
            logger.exception("schedule {}: settling due fires failed", schedule_id)

    async def _fire_locked(self, schedule_id: str, scheduled_for: datetime, note: str | None) -> ScheduleRun | None:
        sched = await self.store.read(lambda conn: load_schedule(conn, schedule_id))
        if sched.last_fire_at is not None and scheduled_for <= sched.last_fire_at:
            logger.debug("schedule {}: {} was already handled", schedule_id, scheduled_for)
            return None
        outcome, goal_id, reason = await self._attempt(sched, scheduled_for)
        if note:
            reason = f"{reason}; {note}"
        runs = await self.store.transact(lambda tx: record_runs(tx, sched, [(scheduled_for, outcome, reason, goal_id)]))
        logger.info("schedule {} at {}: {} ({})", schedule_id, iso(scheduled_for), outcome.value, reason)
        return runs[0]

    async def _attempt(self, sched: Schedule, scheduled_for: datetime) -> tuple[RunOutcome, str | None, str]:
        """Apply the concurrency policy and fire; returns the outcome, the goal id and the reason."""
        replaced = ""
        try:
            prev = sched.last_goal_id
            if prev is not None and sched.concurrency != "allow":
                status = await self._goal_status(prev)
                if status in _LIVE:
                    if sched.concurrency == "forbid":
                        reason = f"the previous goal {prev} is still {status} (concurrency forbid)"
                        return RunOutcome.SKIPPED_CONCURRENCY, None, reason
                    try:
                        await self._cancel_goal(prev)
                        replaced = f"; cancelled the previous goal {prev}, which was {status} (concurrency replace)"
                    except Exception:
                        # It may have ended between the two calls; only a goal still live is a problem.
                        now_status = await self._goal_status(prev)
                        if now_status in _LIVE:
                            raise
                        replaced = f"; the previous goal {prev} ended ({now_status}) before it could be replaced"
            goal_id = await self._fire(sched, scheduled_for)
        except Exception as exc:
            if isinstance(exc, AgentError | ValueError | LookupError):  # bad template, workdir, model: no trace
                logger.warning("schedule {}: firing {} failed: {}", sched.id, iso(scheduled_for), exc)
            else:
                logger.opt(exception=exc).error("schedule {}: firing {} failed", sched.id, iso(scheduled_for))
            return RunOutcome.ERROR, None, f"{type(exc).__name__}: {exc}"
        return RunOutcome.FIRED, goal_id, f"created goal {goal_id}{replaced}"


__all__ = ["MIGRATIONS", "SCHEDULE_CHANGED", "SCHEDULE_RUN", "STOP_GRACE_SECONDS", "Clock", "FireFn", "Scheduler"]
