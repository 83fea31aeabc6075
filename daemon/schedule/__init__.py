"""Schedules: durable rows that create goals at the times their triggers name.

- :mod:`~daemon.schedule.model`: ids, triggers, specs, rows and run outcomes (pydantic models).
- :mod:`~daemon.schedule.cron`: cron parsing and its wall-clock arithmetic (why it is ours: there).
- :mod:`~daemon.schedule.timing`: next and previous fire times, and fires missed while down (pure).
- :mod:`~daemon.schedule.store`: the ``schedules`` and ``schedule_runs`` tables (owned by the
  daemon): their schema and every query of them.
- :mod:`~daemon.schedule.adapter`: APScheduler's trigger and executor over goald's arithmetic.
- :mod:`~daemon.schedule.service`: the :class:`Scheduler` service, which times the rows.
- :mod:`~daemon.schedule.firing`: what a fire does, a goal from the schedule's template.
- :mod:`~daemon.schedule.claims`: how one node of several claims each scheduled instant.

The modules import each other, never this package; other packages import the names below.

**What APScheduler (3.11) does here, and what it does not.** goald owns the rows (the truth), the
trigger arithmetic (:mod:`~daemon.schedule.cron`, :mod:`~daemon.schedule.timing`), the claims, the
misfire and concurrency rules and the deadlines (its injected clock). APScheduler's
``AsyncIOScheduler`` with its in-memory job store is the wake-up machinery, configured to decide
nothing itself (``misfire_grace_time=None``, ``coalesce=False``, no instance limit), and it does
exactly three things a single ``asyncio`` timer would not:

1. *One timer for every schedule.* Its job store keeps one job per armed schedule, by id, ordered
   by next run time; the scheduler sleeps (``loop.call_later``) until the earliest and re-arms that
   one timer after every wake and every job added (a removed job's wake finds nothing due). A job
   is replaced or dropped by id when a row changes (``Scheduler._plan``, ``_disarm``), and
   ``get_jobs()`` is what ``Scheduler.planned()`` reports as armed.
2. *Every instant a late wake-up passed.* At a wake it reads the wall clock and walks each due
   job's trigger (goald's ``next_fire``, :mod:`~daemon.schedule.adapter`) from the planned time to
   now (``Job._get_run_times``), handing the whole list to goald's executor. So a loop that was
   blocked, a host that was suspended or a wall clock stepped forward reach ``Scheduler._run_due``
   as several instants at once, each of which is then recorded (``coalesced``/``missed`` for the
   earlier ones, the starting deadline for the last): none is dropped silently.
3. *The next time from the trigger after each hand-over.* It sets the job's next run time from
   the trigger, after the last instant handed over (a ``date`` trigger's job, with none, is
   dropped), so goald re-arms a job only when its row changes, never after a fire.

Not used: its persistent job stores (the rows are the store, and two stores would have to agree),
its misfire grace and coalescing (goald's rules record every instant), its executors' pools and
instance limits (a fire is a coroutine; each schedule's fires are serialized by its lock), and
APScheduler 3's cron (it numbers weekdays from Monday and requires both day fields to match: see
:mod:`~daemon.schedule.cron`). APScheduler's clock only decides when to wake; which instants are
missed at start and which are past a deadline are decided by goald's clock.
"""

from daemon.schedule.claims import FireClaim, FireTaken
from daemon.schedule.cron import CronFields, parse_cron
from daemon.schedule.firing import GoalFiring, cancel_goal, goal_status
from daemon.schedule.model import (
    AnyTrigger,
    CronTrigger,
    DateTrigger,
    IntervalTrigger,
    RunOutcome,
    Schedule,
    ScheduleId,
    ScheduleRun,
    ScheduleSpec,
    zone,
)
from daemon.schedule.service import Scheduler
from daemon.schedule.store import SCHEDULE_CHANGED, SCHEDULE_RUN
from daemon.schedule.timing import MAX_MISSED_ROWS, MissedRun, missed_runs, next_fire, prev_fire

__all__ = [
    "MAX_MISSED_ROWS",
    "SCHEDULE_CHANGED",
    "SCHEDULE_RUN",
    "AnyTrigger",
    "CronFields",
    "CronTrigger",
    "DateTrigger",
    "FireClaim",
    "FireTaken",
    "GoalFiring",
    "IntervalTrigger",
    "MissedRun",
    "RunOutcome",
    "Schedule",
    "ScheduleId",
    "ScheduleRun",
    "ScheduleSpec",
    "Scheduler",
    "cancel_goal",
    "goal_status",
    "missed_runs",
    "next_fire",
    "parse_cron",
    "prev_fire",
    "zone",
]
