"""What becomes of each instant a schedule comes due at: exactly one ``schedule_runs`` row.

:class:`DueInstants` is the part of :class:`daemon.schedule.service.Scheduler` that settles them
(mixed in; the scheduler sets these attributes): the instants missed while goald was down or before
this node armed the schedule, settled by the schedule's misfire policy (:meth:`_catch_up`); the
instants APScheduler hands over, late ones coalesced or missed and one past the starting deadline
missed (:meth:`_run_due`); and a fire, under the concurrency policy (``forbid`` skips, ``replace``
cancels the previous goal) and the instant's claim (:meth:`_attempt`: the goal and its run commit
together, or another node's claim wins and nothing is written).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime

from loguru import logger

from agent import AgentError, NotFound, Store
from daemon.schedule.claims import FireClaim, FireTaken
from daemon.schedule.model import RunOutcome, Schedule, ScheduleRun
from daemon.schedule.store import RunRow, iso, load_schedule, record_runs
from daemon.schedule.timing import missed_runs, prev_fire

#: Goal statuses during which the previous goal still counts as running (concurrency policy).
_LIVE = ("active", "paused", "waiting")
#: Makes the goal of one fire and returns its id, calling the claim's ``record`` in the goal's
#: creation transaction (or ``commit`` before making a goal outside the store); raises
#: :class:`~daemon.schedule.claims.FireTaken` (from ``record``) when the instant was another's.
FireFn = Callable[[Schedule, datetime, FireClaim], Awaitable[str]]


class DueInstants:
    """Settles a schedule's due instants (see the module docstring)."""

    store: Store
    clock: Callable[[], datetime]
    _fire: FireFn
    _goal_status: Callable[[str], Awaitable[str | None]]
    _cancel_goal: Callable[[str], Awaitable[None]]
    _poke: asyncio.Event
    #: One lock per schedule: its instants are settled one at a time.
    _locks: dict[str, asyncio.Lock]

    def _lock(self, schedule_id: str) -> asyncio.Lock:
        return self._locks.setdefault(schedule_id, asyncio.Lock())

    async def _catch_up(self, sched: Schedule, now: datetime, gap: str) -> None:
        since = max(t for t in (sched.last_fire_at, sched.active_since) if t is not None)
        plan = missed_runs(
            sched.effective_trigger(),
            sched.timezone,
            since,
            now,
            sched.misfire,
            sched.starting_deadline_seconds,
            gap=gap,
        )
        if sched.suspended_at is not None:
            plan = [
                r._replace(outcome=RunOutcome.SKIPPED_SUSPENDED, reason=f"skipped {gap}: the schedule is suspended")
                for r in plan
            ]
        settled: list[RunRow] = [
            (r.scheduled_for, r.outcome, r.reason, None) for r in plan if r.outcome != RunOutcome.FIRED
        ]
        async with self._lock(sched.id):
            if settled:
                recorded = await self.store.transact(lambda tx: record_runs(tx, sched, settled))
                if recorded:
                    logger.info("schedule {}: {} fire(s) missed {}", sched.id, len(recorded), gap)
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
                current = [t for t in due if self._current(sched, t)]
                if len(current) < len(due):
                    # A job timed from an older trigger: another node re-timed the schedule and this
                    # node has not re-read the table yet. Those instants are not the schedule's.
                    logger.info("schedule {}: its timing changed through another node; re-arming", schedule_id)
                    self._poke.set()
                    due = current
                if not due:
                    return
                if sched.suspended_at is not None:
                    since = iso(sched.suspended_at)
                    skipped: list[RunRow] = [
                        (t, RunOutcome.SKIPPED_SUSPENDED, f"skipped: the schedule is suspended (since {since})", None)
                        for t in due
                    ]
                    await self.store.transact(lambda tx: record_runs(tx, sched, skipped))
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

    @staticmethod
    def _current(sched: Schedule, at: datetime) -> bool:
        """Whether ``at`` is an instant of the schedule's current trigger (a job armed before another
        node re-timed it may still hand over instants of the old one)."""
        return prev_fire(sched.effective_trigger(), sched.timezone, at) == at

    async def _fire_locked(self, schedule_id: str, scheduled_for: datetime, note: str | None) -> ScheduleRun | None:
        sched = await self.store.read(lambda conn: load_schedule(conn, schedule_id))
        if sched.last_fire_at is not None and scheduled_for <= sched.last_fire_at:
            logger.debug("schedule {}: {} was already handled", schedule_id, scheduled_for)
            return None
        run = await self._attempt(FireClaim(self.store, sched, scheduled_for, note))
        if run is not None:
            logger.info("schedule {} at {}: {} ({})", schedule_id, iso(scheduled_for), run.outcome.value, run.reason)
        return run

    async def _attempt(self, claim: FireClaim, *, policy: bool = True) -> ScheduleRun | None:
        """Apply the concurrency policy (unless not ``policy``) and fire, claiming the instant;
        returns the run recorded (``None``: the instant was another node's, and nothing was written)."""
        sched, scheduled_for = claim.schedule, claim.scheduled_for
        try:
            prev = sched.last_goal_id
            if policy and prev is not None and sched.concurrency != "allow":
                status = await self._goal_status(prev)
                if status in _LIVE:
                    if sched.concurrency == "forbid":
                        reason = f"the previous goal {prev} is still {status} (concurrency forbid)"
                        return await claim.settle(RunOutcome.SKIPPED_CONCURRENCY, reason)
                    try:
                        await self._cancel_goal(prev)
                        claim.replaced = (
                            f"; cancelled the previous goal {prev}, which was {status} (concurrency replace)"
                        )
                    except Exception:
                        # It may have ended between the two calls; only a goal still live is a problem.
                        now_status = await self._goal_status(prev)
                        if now_status in _LIVE:
                            raise
                        claim.replaced = f"; the previous goal {prev} ended ({now_status}) before it could be replaced"
            goal_id = await self._fire(sched, scheduled_for, claim)
            if claim.run is None:
                raise RuntimeError(f"the fire callback made goal {goal_id} without claiming the instant")
        except FireTaken:
            claim.taken()
            return None
        except Exception as exc:
            if claim.run is not None:  # the goal and its run committed; what failed came after
                logger.opt(exception=exc).error("schedule {}: after firing {}", sched.id, iso(scheduled_for))
                return claim.run
            if isinstance(exc, AgentError | ValueError | LookupError):  # bad template, workdir, model: no trace
                logger.warning("schedule {}: firing {} failed: {}", sched.id, iso(scheduled_for), exc)
            else:
                logger.opt(exception=exc).error("schedule {}: firing {} failed", sched.id, iso(scheduled_for))
            return await claim.settle(RunOutcome.ERROR, f"{type(exc).__name__}: {exc}")
        return claim.run
