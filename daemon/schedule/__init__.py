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
from daemon.schedule.service import SCHEDULE_CHANGED, SCHEDULE_RUN, Scheduler
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
