"""When a schedule fires: the next and previous fire times of a trigger, and the fires missed while
goald was not running. Pure functions of their inputs (no clock, no I/O), pinned by table tests.

Interval and date triggers are instants and ignore the zone; cron triggers name wall-clock times
in the schedule's zone (:mod:`daemon.schedule.cron`). Fire times are returned in UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import NamedTuple
from zoneinfo import ZoneInfo

from daemon.schedule.cron import cron_next, cron_prev, parse_cron
from daemon.schedule.model import AnyTrigger, CronTrigger, DateTrigger, IntervalTrigger, Misfire, RunOutcome, zone

#: At most this many missed fires are listed one by one at start; older ones share one row.
MAX_MISSED_ROWS = 100


def next_fire(trigger: AnyTrigger, tz: ZoneInfo | str, after: datetime) -> datetime | None:
    """The first fire time strictly after ``after`` (aware), in UTC; None if there is none.

    An interval trigger must have its ``start`` resolved (the scheduler does that when adding).
    """
    tz = zone(tz) if isinstance(tz, str) else tz
    after = after.astimezone(UTC)
    match trigger:
        case CronTrigger():
            return cron_next(parse_cron(trigger.expr), tz, after)
        case IntervalTrigger():
            start, period = _interval(trigger)
            if after < start:
                return start
            return start + period * ((after - start) // period + 1)
        case DateTrigger():
            at = trigger.at.astimezone(UTC)
            return at if at > after else None


def prev_fire(trigger: AnyTrigger, tz: ZoneInfo | str, at: datetime) -> datetime | None:
    """The last fire time at or before ``at`` (aware), in UTC; None if there is none."""
    tz = zone(tz) if isinstance(tz, str) else tz
    at = at.astimezone(UTC)
    match trigger:
        case CronTrigger():
            return cron_prev(parse_cron(trigger.expr), tz, at)
        case IntervalTrigger():
            start, period = _interval(trigger)
            if at < start:
                return None
            return start + period * ((at - start) // period)
        case DateTrigger():
            when = trigger.at.astimezone(UTC)
            return when if when <= at else None


def _interval(trigger: IntervalTrigger) -> tuple[datetime, timedelta]:
    if trigger.start is None:
        raise ValueError("an interval trigger needs its start resolved before its fire times exist")
    return trigger.start.astimezone(UTC), timedelta(microseconds=round(trigger.seconds * 1_000_000))


class MissedRun(NamedTuple):
    """One instant that came due while goald was not running, and what to do with it.

    ``outcome`` is :attr:`RunOutcome.FIRED` for the one instant to fire now; the scheduler's
    concurrency check may still turn that into ``skipped_concurrency`` (or ``error``).
    """

    scheduled_for: datetime
    outcome: RunOutcome
    reason: str


def missed_runs(
    trigger: AnyTrigger,
    tz: ZoneInfo | str,
    last_fire_at: datetime,
    now: datetime,
    misfire: Misfire,
    starting_deadline: float | None,
    *,
    limit: int = MAX_MISSED_ROWS,
    gap: str = "while goald was not running",
) -> list[MissedRun]:
    """The fires in ``(last_fire_at, now]``, oldest first, with their outcomes.

    ``coalesce``: the latest fires now and the earlier ones are ``coalesced`` into it; ``skip``:
    all are ``missed``; and if the latest is more than ``starting_deadline`` seconds old, all
    are ``missed``. At most ``limit`` fires are listed one by one; if there were more, one
    extra row, dated at the first of them, stands for all the older ones. ``gap`` says in the
    reasons when the fires came due (a node that learns of a schedule late is not "down").
    """
    latest: list[datetime] = []
    cursor = prev_fire(trigger, tz, now)
    while cursor is not None and cursor > last_fire_at and len(latest) < limit:
        latest.append(cursor)
        cursor = prev_fire(trigger, tz, cursor - timedelta(microseconds=1))
    if not latest:
        return []
    latest.reverse()
    newest = latest[-1]
    late = (now - newest).total_seconds()
    if misfire == "skip":
        earlier = (RunOutcome.MISSED, f"missed {gap} (misfire policy skip)")
        last = earlier
    elif starting_deadline is not None and late > starting_deadline:
        earlier = (RunOutcome.MISSED, f"missed {gap}; the latest fire was past its deadline")
        last = (RunOutcome.MISSED, f"missed: {late:.0f}s late, past the starting deadline of {starting_deadline:g}s")
    else:
        earlier = (RunOutcome.COALESCED, f"missed {gap}; coalesced into {newest.isoformat()}")
        last = (RunOutcome.FIRED, f"due {gap} (misfire policy coalesce)")
    runs = [MissedRun(t, *earlier) for t in latest[:-1]]
    runs.append(MissedRun(newest, *last))
    if cursor is not None and cursor > last_fire_at:
        first = next_fire(trigger, tz, last_fire_at)
        assert first is not None
        runs.insert(
            0,
            MissedRun(
                first,
                earlier[0],
                f"{earlier[1]}; stands for every fire from {first.isoformat()} to {cursor.isoformat()}"
                f" (only the latest {limit} are listed one by one)",
            ),
        )
    return runs
