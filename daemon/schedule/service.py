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
"""

from __future__ import annotations

import asyncio
import builtins
import json
import sqlite3
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from apscheduler.executors.base import BaseExecutor  # type: ignore[import-untyped]
from apscheduler.schedulers.asyncio import AsyncIOScheduler  # type: ignore[import-untyped]
from apscheduler.triggers.base import BaseTrigger  # type: ignore[import-untyped]
from loguru import logger

from agent import AgentError, InvalidInput, Migration, NotFound, Store, TaskSet, Tx, create_session
from daemon.schedule.model import (
    AnyTrigger,
    DateTrigger,
    IntervalTrigger,
    RunOutcome,
    Schedule,
    ScheduleId,
    ScheduleRun,
    ScheduleSpec,
    zone,
)
from daemon.schedule.timing import missed_runs, next_fire

SCHEDULE_RUN = "schedule/run"
SCHEDULE_CHANGED = "schedule/changed"
#: Goal statuses during which the previous goal still counts as running (concurrency policy).
_LIVE = ("active", "paused")
#: How long :meth:`Scheduler.stop` lets fires in flight finish before cancelling them.
STOP_GRACE_SECONDS = 10.0

MIGRATIONS = [
    Migration(
        version=1,
        summary="schedules with their cursor, and one schedule_runs row per scheduled instant",
        sql="""
CREATE TABLE schedules (
    id TEXT PRIMARY KEY,
    key TEXT UNIQUE,
    trigger TEXT NOT NULL,
    timezone TEXT NOT NULL,
    goal TEXT NOT NULL,
    misfire TEXT NOT NULL CHECK (misfire IN ('coalesce', 'skip')),
    starting_deadline_seconds REAL,
    concurrency TEXT NOT NULL CHECK (concurrency IN ('forbid', 'replace', 'allow')),
    session_id TEXT NOT NULL,
    anchor_at TEXT,
    active_since TEXT NOT NULL,
    last_fire_at TEXT,
    last_goal_id TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE schedule_runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    schedule_id TEXT NOT NULL,
    scheduled_for TEXT NOT NULL,
    outcome TEXT NOT NULL
        CHECK (outcome IN ('fired', 'skipped_concurrency', 'missed', 'coalesced', 'error')),
    reason TEXT NOT NULL,
    goal_id TEXT,
    recorded_at TEXT NOT NULL
);
CREATE INDEX schedule_runs_schedule ON schedule_runs(schedule_id, id);
""",
    ),
]

Clock = Callable[[], datetime]
FireFn = Callable[[Schedule, datetime], Awaitable[str]]
RunRow = tuple[datetime, RunOutcome, str, str | None]


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _iso(dt: datetime) -> str:
    return dt.astimezone(UTC).isoformat(timespec="microseconds")


def _load(conn: sqlite3.Connection, schedule_id: str) -> Schedule:
    row = conn.execute("SELECT * FROM schedules WHERE id=?", (schedule_id,)).fetchone()
    if row is None:
        raise NotFound(f"no schedule {schedule_id}")
    return _from_row(conn, row)


def _from_row(conn: sqlite3.Connection, row: sqlite3.Row) -> Schedule:
    d = dict(row)
    d["trigger"] = json.loads(d["trigger"])
    d["goal"] = json.loads(d["goal"])
    last = conn.execute(
        "SELECT outcome, reason FROM schedule_runs WHERE schedule_id=? ORDER BY id DESC LIMIT 1", (d["id"],)
    ).fetchone()
    if last is not None:
        d["last_outcome"], d["last_reason"] = last["outcome"], last["reason"]
    return Schedule.model_validate(d)


def _resolve(conn: sqlite3.Connection, ref: str) -> str:
    """A schedule id from a full id, a unique id prefix, or a schedule key."""
    if not ref.startswith(ScheduleId.prefix):
        row = conn.execute("SELECT id FROM schedules WHERE key=?", (ref,)).fetchone()
        if row is None:
            raise NotFound(f"no schedule with id or key {ref[:80]!r}")
        return str(row["id"])
    rows = conn.execute("SELECT id FROM schedules WHERE id >= ? AND id < ? LIMIT 2", (ref, ref + "\uffff")).fetchall()
    if not rows:
        raise NotFound(f"no schedule {ref[:80]}")
    if len(rows) > 1 and rows[0]["id"] != ref:
        raise InvalidInput(f"schedule id prefix {ref!r} is ambiguous")
    return str(rows[0]["id"])


def _record(tx: Tx, sched: Schedule, rows: list[RunRow]) -> list[ScheduleRun]:
    """Insert runs, emit their events, and move the schedule's cursor, in the caller's transaction."""
    out = []
    for scheduled_for, outcome, reason, goal_id in rows:
        cur = tx.execute(
            "INSERT INTO schedule_runs(schedule_id, scheduled_for, outcome, reason, goal_id, recorded_at)"
            " VALUES (?,?,?,?,?,?)",
            (sched.id, _iso(scheduled_for), outcome.value, reason, goal_id, tx.now),
        )
        assert cur.lastrowid is not None
        data: dict[str, Any] = {
            "scheduleId": sched.id,
            "scheduledFor": _iso(scheduled_for),
            "outcome": outcome.value,
            "reason": reason,
        }
        if goal_id is not None:
            data["goalId"] = goal_id
        tx.emit(sched.session_id, SCHEDULE_RUN, data)
        out.append(
            ScheduleRun(
                id=cur.lastrowid,
                schedule_id=sched.id,
                scheduled_for=scheduled_for,
                outcome=outcome,
                reason=reason,
                goal_id=goal_id,
                recorded_at=datetime.fromisoformat(tx.now),
            )
        )
    row = tx.one("SELECT last_fire_at FROM schedules WHERE id=?", (sched.id,))
    if row is not None:
        cursor = max(r[0] for r in rows)
        if row["last_fire_at"] is not None:
            cursor = max(cursor, datetime.fromisoformat(row["last_fire_at"]))
        goal_ids = [r[3] for r in rows if r[3] is not None]
        tx.execute(
            "UPDATE schedules SET last_fire_at=?, last_goal_id=COALESCE(?, last_goal_id), updated_at=? WHERE id=?",
            (_iso(cursor), goal_ids[-1] if goal_ids else None, tx.now, sched.id),
        )
    return out


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
        self._aps: Any = None
        self._locks: dict[str, asyncio.Lock] = {}
        self._tasks = TaskSet()
        self._stopping = False

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Migrate, settle the fires missed while goald was down, and start timing."""
        await self.store.migrate("schedules", MIGRATIONS)
        self._stopping = False
        self._aps = AsyncIOScheduler(
            timezone=UTC,
            executors={"default": _DueExecutor(self._spawn)},
            job_defaults={"misfire_grace_time": None, "coalesce": False},
        )
        schedules = await self.list()
        for sched in schedules:
            await self._catch_up(sched)
            self._plan(await self.get(sched.id))
        self._aps.start()
        logger.info("scheduler started: {} schedule(s), {} armed", len(schedules), len(self.planned()))

    async def stop(self) -> None:
        """Stop timing; fires in flight get a grace period to finish, then are cancelled."""
        self._stopping = True
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

        def run(tx: Tx) -> str:
            row = tx.one("SELECT * FROM schedules WHERE key=?", (spec.key,)) if spec.key is not None else None
            old = _from_row(tx.conn, row) if row is not None else None
            timing_changed = old is None or (old.trigger, old.timezone) != (spec.trigger, spec.timezone)
            if timing_changed and isinstance(spec.trigger, DateTrigger) and spec.trigger.at <= now:
                raise InvalidInput(f"the one-shot time {spec.trigger.at.isoformat()} is already past")
            anchor = old.anchor_at if old is not None else None
            if timing_changed and isinstance(spec.trigger, IntervalTrigger):
                anchor = spec.trigger.start or now + timedelta(seconds=spec.trigger.seconds)
            values = {
                "trigger": spec.trigger.model_dump_json(),
                "timezone": spec.timezone,
                "goal": json.dumps(spec.goal, sort_keys=True),
                "misfire": spec.misfire,
                "starting_deadline_seconds": spec.starting_deadline_seconds,
                "concurrency": spec.concurrency,
                "anchor_at": _iso(anchor) if anchor is not None else None,
            }
            if old is None:
                sid = ScheduleId.new()
                session = create_session(tx, config={"schedule": sid})
                values |= {"id": sid, "key": spec.key, "session_id": session, "active_since": _iso(now)}
                values |= {"created_at": tx.now, "updated_at": tx.now}
                cols = ", ".join(values)
                tx.execute(
                    f"INSERT INTO schedules({cols}) VALUES ({', '.join('?' * len(values))})", list(values.values())
                )
                tx.emit(session, SCHEDULE_CHANGED, {"scheduleId": sid, "change": "added"})
                return sid
            if old.spec() == spec:
                return old.id
            if timing_changed:
                values["active_since"] = _iso(now)
            values["updated_at"] = tx.now
            sets = ", ".join(f"{k}=?" for k in values)
            tx.execute(f"UPDATE schedules SET {sets} WHERE id=?", [*values.values(), old.id])
            tx.emit(old.session_id, SCHEDULE_CHANGED, {"scheduleId": old.id, "change": "updated"})
            return old.id

        schedule_id = await self.store.transact(run)
        sched = await self.get(schedule_id)
        self._plan(sched)
        return sched

    async def get(self, ref: str) -> Schedule:
        """A schedule by id, unique id prefix or key, with its next fire time and last outcome."""
        sched = await self.store.read(lambda conn: _load(conn, _resolve(conn, ref)))
        return self._with_next(sched)

    async def list(self) -> list[Schedule]:
        """Every schedule, oldest first, with its next fire time and last outcome."""

        def run(conn: sqlite3.Connection) -> list[Schedule]:
            return [_from_row(conn, r) for r in conn.execute("SELECT * FROM schedules ORDER BY id").fetchall()]

        return [self._with_next(s) for s in await self.store.read(run)]

    async def remove(self, ref: str) -> Schedule:
        """Remove a schedule (by id, unique id prefix or key); its runs and session stay as history."""

        def run(tx: Tx) -> Schedule:
            sched = _load(tx.conn, _resolve(tx.conn, ref))
            tx.execute("DELETE FROM schedules WHERE id=?", (sched.id,))
            tx.emit(sched.session_id, SCHEDULE_CHANGED, {"scheduleId": sched.id, "change": "removed"})
            return sched

        sched = await self.store.transact(run)
        if self._aps is not None and self._aps.get_job(sched.id) is not None:
            self._aps.remove_job(sched.id)
        self._locks.pop(sched.id, None)
        return sched

    async def runs(self, ref: str, limit: int = 20) -> builtins.list[ScheduleRun]:
        """A schedule's runs, newest first."""
        if limit < 1:
            raise InvalidInput("limit must be at least 1")

        def run(conn: sqlite3.Connection) -> list[ScheduleRun]:
            sid = _resolve(conn, ref)
            rows = conn.execute(
                "SELECT * FROM schedule_runs WHERE schedule_id=? ORDER BY id DESC LIMIT ?", (sid, limit)
            ).fetchall()
            return [ScheduleRun.model_validate(dict(r)) for r in rows]

        return await self.store.read(run)

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
        if self._aps is None:
            return
        if self._aps.get_job(sched.id) is not None:
            self._aps.remove_job(sched.id)
        if sched.next_fire_at is None:
            return
        self._aps.add_job(
            self._run_due,
            trigger=_AtFireTimes(sched.effective_trigger(), sched.timezone),
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
                await self.store.transact(lambda tx: _record(tx, sched, settled))
                logger.info("schedule {}: {} fire(s) missed while goald was down", sched.id, len(settled))
            for r in plan:
                if r.outcome == RunOutcome.FIRED:
                    await self._fire_locked(sched.id, r.scheduled_for, r.reason)

    async def _run_due(self, schedule_id: str, run_times: Sequence[datetime] = ()) -> None:
        """What a job runs: settle the instants APScheduler found due (normally exactly one).

        ``run_times`` is passed by :class:`_DueExecutor` (APScheduler checks the job's signature
        against its ``args``, hence the default).
        """
        try:
            async with self._lock(schedule_id):
                try:
                    sched = await self.store.read(lambda conn: _load(conn, schedule_id))
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
                        (t, kind, f"the scheduler woke late; {kind.value} (a later fire, {_iso(last)}, runs)", None)
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
                    await self.store.transact(lambda tx: _record(tx, sched, settled))
                if fire:
                    await self._fire_locked(schedule_id, last, None)
        except Exception:
            logger.exception("schedule {}: settling due fires failed", schedule_id)

    async def _fire_locked(self, schedule_id: str, scheduled_for: datetime, note: str | None) -> ScheduleRun | None:
        sched = await self.store.read(lambda conn: _load(conn, schedule_id))
        if sched.last_fire_at is not None and scheduled_for <= sched.last_fire_at:
            logger.debug("schedule {}: {} was already handled", schedule_id, scheduled_for)
            return None
        outcome, goal_id, reason = await self._attempt(sched, scheduled_for)
        if note:
            reason = f"{reason}; {note}"
        runs = await self.store.transact(lambda tx: _record(tx, sched, [(scheduled_for, outcome, reason, goal_id)]))
        logger.info("schedule {} at {}: {} ({})", schedule_id, _iso(scheduled_for), outcome.value, reason)
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
                logger.warning("schedule {}: firing {} failed: {}", sched.id, _iso(scheduled_for), exc)
            else:
                logger.opt(exception=exc).error("schedule {}: firing {} failed", sched.id, _iso(scheduled_for))
            return RunOutcome.ERROR, None, f"{type(exc).__name__}: {exc}"
        return RunOutcome.FIRED, goal_id, f"created goal {goal_id}{replaced}"
