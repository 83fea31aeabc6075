"""The scheduler service: schedules are rows in the goald store; APScheduler does the timing.

The rows are the single source of truth. APScheduler 3's ``AsyncIOScheduler`` holds in-memory
jobs rebuilt from the rows at start and after every change (this node's, or another node's: below),
with ``misfire_grace_time=None`` (a late fire is never dropped by APScheduler) and without its own
coalescing: every instant it hands over reaches :meth:`Scheduler._run_due`, which records what
became of it. Its job triggers wrap :func:`daemon.schedule.timing.next_fire`, so the times a job
fires at and the next fire time that ``schedule list`` shows come from the same arithmetic.

Every scheduled instant ends as exactly one ``schedule_runs`` row (``fired``,
``skipped_concurrency``, ``missed``, ``coalesced`` or ``error``, with a reason) and a
``schedule/run`` event in the schedule's own session, committed in one transaction with the
schedule's cursor ``last_fire_at`` (the latest instant handled) and ``last_goal_id``. That row is
also the instant's *claim*: several daemons sharing one store all time the same schedules, and the
first to write the row handles the instant while the others write nothing
(:mod:`daemon.schedule.claims`). A ``fired`` row is written in the goal's own creation transaction
(the ``fire`` callback gets the :class:`~daemon.schedule.claims.FireClaim` to record), so a goal
and its run commit together or not at all.

At start, fires that came due while goald was down are settled from ``last_fire_at`` and the
injected clock (:func:`daemon.schedule.timing.missed_runs`). The clock is also the authority for
deadlines; APScheduler's own wall clock only decides when to wake up.

**Every node follows the table** (PostgreSQL). A schedule added, re-timed or removed through one
node's socket must be timed by every node, or it fires only where it was added and not at all once
that node dies. So a node on PostgreSQL re-reads the table every :data:`FOLLOW_SECONDS` (at once on
a relayed ``schedule/changed``, for a schedule whose session it already follows: a new schedule's
session is known to no other node, so the poll is what finds it): one query of ids and
``active_since``, which changes exactly when a schedule is added or its timing changes (its other
columns are read at each fire). What is new or re-timed is armed as at start: the instants that
came due before this node armed it are settled by the misfire policy (a live node that already fired
one wins its claim, so this settles only what no node handled), the later ones timed. What is gone
is disarmed. A cheap poll and not ``LISTEN``: schedules change rarely, and the poll also covers a
notification missed while a connection was down. On SQLite the one daemon makes every change itself,
so nothing is re-read. Since every node times every schedule, a node's death changes nothing for
the others: they fire the next instants as before; instants when no node was up are settled once
by the claims at the next start.

APScheduler is imported, and its scheduler made, when the first schedule is armed: its import
scans every installed distribution's entry points, which the daemon's start (on the way to
``READY=1``) need not pay when no schedule exists.

The rows and every query of them are in :mod:`daemon.schedule.store`, the APScheduler trigger and
executor in :mod:`daemon.schedule.adapter`, what becomes of each due instant in
:mod:`daemon.schedule.due`.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from datetime import UTC, datetime
from typing import Any

from loguru import logger

from agent import Event, InvalidInput, NotFound, Store, TaskSet
from daemon.schedule.adapter import aps_classes
from daemon.schedule.claims import FireClaim
from daemon.schedule.due import DueInstants, FireFn
from daemon.schedule.model import RunOutcome, Schedule, ScheduleRun, ScheduleSpec
from daemon.schedule.store import (
    MIGRATIONS,
    SCHEDULE_CHANGED,
    delete_schedule,
    iso,
    list_runs,
    list_schedules,
    load_schedule,
    resolve_schedule,
    save_schedule,
    schedule_timings,
    set_suspended,
)
from daemon.schedule.timing import next_fire

#: How long :meth:`Scheduler.stop` lets fires in flight finish before cancelling them.
STOP_GRACE_SECONDS = 10.0
#: How often a node on PostgreSQL re-reads the table for schedules other nodes added, re-timed or
#: removed (sooner on a relayed ``schedule/changed``). A schedule first armed this late has its
#: instants of the delay settled by its misfire policy, so it bounds how late such a fire can be.
FOLLOW_SECONDS = 2.0
#: When the fires settled at start came due; and when those settled on learning of a schedule came due.
_WHILE_DOWN = "while goald was not running"
_BEFORE_ARMED = "before this node armed the schedule"

Clock = Callable[[], datetime]


def _utcnow() -> datetime:
    return datetime.now(UTC)


class Scheduler(DueInstants):
    """Durable schedules that create goals. ``await start()`` … ``await stop()``."""

    def __init__(
        self,
        store: Store,
        *,
        fire: FireFn,
        goal_status: Callable[[str], Awaitable[str | None]],
        cancel_goal: Callable[[str], Awaitable[None]],
        clock: Clock = _utcnow,
        follow_seconds: float = FOLLOW_SECONDS,
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
        #: Re-read the table this often (PostgreSQL: other nodes write it); ``None`` on SQLite.
        self._follow_every = follow_seconds if store.kind == "postgresql" else None
        #: Per schedule armed (or known to need no job), the ``active_since`` of the timing armed.
        self._armed: dict[str, datetime] = {}
        self._follower = TaskSet()
        self._poke = asyncio.Event()
        self._unlisten: Callable[[], None] | None = None

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Migrate, settle the fires missed while goald was down, and start timing."""
        await self.store.migrate("schedules", MIGRATIONS)
        self._stopping = False
        self._running = True
        schedules = await self.list()
        for sched in schedules:
            await self._arm(sched, _WHILE_DOWN)
        if self._follow_every is not None:
            self._poke.clear()
            self._unlisten = self.store.hub.add_listener(self._on_event)
            self._follower.spawn(self._follow(self._follow_every), name="schedules-follow")
        logger.info("scheduler started: {} schedule(s), {} armed", len(schedules), len(self.planned()))

    async def stop(self) -> None:
        """Stop timing; fires in flight get a grace period to finish, then are cancelled."""
        self._stopping = True
        self._running = False
        if self._unlisten is not None:
            self._unlisten()
            self._unlisten = None
        self._poke.set()  # the follower ends after the pass in flight (its fires finish, as below)
        await self._follower.drain(STOP_GRACE_SECONDS)
        self._armed.clear()
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
        self._disarm(sched.id)
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

    async def suspend(self, ref: str) -> Schedule:
        """Suspend a schedule: its job stays armed, and each instant that comes due (or came due
        while goald was down) is recorded ``skipped_suspended`` instead of fired. Taken under the
        schedule's lock: a fire in flight on this node ends first, and every later one is skipped."""
        schedule_id = await self.store.read(lambda conn: resolve_schedule(conn, ref))
        async with self._lock(schedule_id):
            await self.store.transact(lambda tx: set_suspended(tx, schedule_id, True))
        return await self.get(schedule_id)

    async def resume(self, ref: str) -> tuple[Schedule, ScheduleRun | None]:
        """Resume a suspended schedule, following its misfire policy for the instants skipped while
        it was suspended (as Kubernetes does for a CronJob unsuspended): ``coalesce`` fires once now
        for the latest of them, unless it is older than the starting deadline; ``skip`` fires
        nothing. Returns the schedule and the run of that fire (``None``: none). Taken under the
        schedule's lock, as a suspension is: a fire in flight on this node that read the schedule
        suspended records its skip before the resumption, never after it."""
        schedule_id = await self.store.read(lambda conn: resolve_schedule(conn, ref))
        run = None
        async with self._lock(schedule_id):
            before, changed = await self.store.transact(lambda tx: set_suspended(tx, schedule_id, False))
            if changed and before.misfire == "coalesce":
                latest = await self.runs(before.id, 1)
                skipped = latest[0] if latest and latest[0].outcome == RunOutcome.SKIPPED_SUSPENDED else None
                if skipped is not None:
                    now = self.clock()
                    late = (now - skipped.scheduled_for).total_seconds()
                    deadline = before.starting_deadline_seconds
                    if deadline is None or late <= deadline:
                        sched = await self.store.read(lambda conn: load_schedule(conn, before.id))
                        note = (
                            f"resumed: fires once for {iso(skipped.scheduled_for)}, skipped while suspended"
                            " (misfire policy coalesce)"
                        )
                        run = await self._attempt(FireClaim(self.store, sched, now, note, off_trigger=True))
        return await self.get(before.id), run

    async def run_now(self, ref: str) -> ScheduleRun:
        """Fire a schedule now, by hand (``goald schedule run``; like ``kubectl create job
        --from=cronjob``): one run row marked ``manual``, at this moment, not at one of the trigger's
        instants, so the cursor and the next fire are unchanged. The concurrency policy does not
        apply (it was asked for), nor does a suspension; the goal becomes the schedule's last, which
        the next scheduled fire's concurrency policy sees."""
        sched = await self.get(ref)
        async with self._lock(sched.id):
            sched = await self.store.read(lambda conn: load_schedule(conn, sched.id))
            claim = FireClaim(self.store, sched, self.clock(), None, off_trigger=True, manual=True)
            run = await self._attempt(claim, policy=False)
        if run is None:  # the same microsecond claimed twice: not a person's doing
            raise InvalidInput(f"schedule {sched.id}: a run at this instant exists already; try again")
        logger.info("schedule {}: run by hand: {} ({})", sched.id, run.outcome.value, run.reason)
        return run

    def planned(self) -> dict[str, datetime]:
        """The next wake-up of every APScheduler job, by schedule id (what timing is armed)."""
        if self._aps is None:
            return {}
        return {job.id: job.next_run_time for job in self._aps.get_jobs()}

    # -- internals -------------------------------------------------------------------------

    def _with_next(self, sched: Schedule) -> Schedule:
        after = self.clock()
        if sched.last_fire_at is not None:
            after = max(after, sched.last_fire_at)
        return sched.model_copy(update={"next_fire_at": next_fire(sched.effective_trigger(), sched.timezone, after)})

    def _plan(self, sched: Schedule, after: datetime | None = None) -> None:
        """(Re)build the schedule's APScheduler job from its row: its first wake-up is the row's
        next fire time, or (``after`` given) the first instant after ``after`` and the cursor."""
        if not self._running:
            return
        if self._aps is not None and self._aps.get_job(sched.id) is not None:
            self._aps.remove_job(sched.id)
        self._armed[sched.id] = sched.active_since
        first = sched.next_fire_at
        if after is not None:
            since = after if sched.last_fire_at is None else max(after, sched.last_fire_at)
            first = next_fire(sched.effective_trigger(), sched.timezone, since)
        if first is None:
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
            next_run_time=first,
            misfire_grace_time=None,
            coalesce=False,
        )

    def _disarm(self, schedule_id: str) -> None:
        if self._aps is not None and self._aps.get_job(schedule_id) is not None:
            self._aps.remove_job(schedule_id)
        self._locks.pop(schedule_id, None)
        self._armed.pop(schedule_id, None)

    async def _arm(self, sched: Schedule, gap: str) -> None:
        """Settle the schedule's instants up to now (by its misfire policy; ``gap`` says when they
        came due), then time the ones after: one ``now`` for both, so no instant falls between."""
        now = self.clock()
        await self._catch_up(sched, now, gap)
        try:
            current = await self.get(sched.id)
        except NotFound:  # removed meanwhile (through another node)
            self._disarm(sched.id)
            return
        self._plan(current, after=now)

    # -- following the table (PostgreSQL) --------------------------------------------------

    def _on_event(self, event: Event) -> None:
        # Another node changed a schedule whose session this node follows: re-read at once.
        if event.type == SCHEDULE_CHANGED and self.store.relaying:
            self._poke.set()

    async def _follow(self, every: float) -> None:
        """Re-read the table every ``every`` seconds (or when poked), and :meth:`sync`."""
        failing = False
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(every):
                    await self._poke.wait()
            self._poke.clear()
            if self._stopping:
                return
            try:
                await self.sync()
            except Exception as exc:
                if not failing:
                    logger.warning("schedules: could not re-read the table ({}); retrying every {:g}s", exc, every)
                failing = True
            else:
                if failing:
                    logger.info("schedules: the table can be read again")
                failing = False

    async def sync(self) -> None:
        """Arm what other nodes added or re-timed, and disarm what they removed (what the table says).

        A schedule is compared by when its current timing took effect (``active_since``); its other
        columns are read at each fire. Its instants that came due before this node armed it are
        settled as at start (a live node that fired them already wins their claims).
        """
        known = dict(self._armed)  # what was armed before the read (this node may add one meanwhile)
        timings = await self.store.read(schedule_timings)
        for schedule_id, armed in known.items():
            if schedule_id not in timings and self._armed.get(schedule_id) == armed:
                logger.info("schedule {}: removed (through another node); disarmed", schedule_id)
                self._disarm(schedule_id)
        for schedule_id, active_since in timings.items():
            if not self._running:
                return
            if self._armed.get(schedule_id) == active_since:
                continue
            try:
                sched = await self.get(schedule_id)
            except NotFound:
                continue
            logger.info(
                "schedule {}: {} (through another node); armed",
                schedule_id,
                "added" if schedule_id not in self._armed else "re-timed",
            )
            await self._arm(sched, _BEFORE_ARMED)


__all__ = [
    "FOLLOW_SECONDS",
    "STOP_GRACE_SECONDS",
    "Clock",
    "Scheduler",
]
