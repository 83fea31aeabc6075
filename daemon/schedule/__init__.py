"""Schedules: durable rows that create goals at the times their triggers name.

- :mod:`~daemon.schedule.model`: ids, triggers, specs, rows and run outcomes (pydantic models).
- :mod:`~daemon.schedule.cron`: cron parsing and its wall-clock arithmetic (why it is ours: there).
- :mod:`~daemon.schedule.timing`: next and previous fire times, and fires missed while down (pure).
- :mod:`~daemon.schedule.service`: the :class:`Scheduler` service (owns the ``schedules`` and
  ``schedule_runs`` tables) with its APScheduler adapter.
- :mod:`~daemon.schedule.firing`: what a fire does, a goal from the schedule's template.

The modules import each other, never this package; other packages import the names below.
"""

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
