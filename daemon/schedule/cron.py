"""Cron expressions: parsing, and the wall-clock arithmetic of when one fires next (or last).

Pure functions of their inputs (no clock, no I/O), pinned by table tests with fixed datetimes.

Why cron is parsed here and not by APScheduler 3: its ``CronTrigger.from_crontab`` numbers the
days of the week from Monday (``0 = mon``), while every crontab operators know (and Kubernetes
CronJobs) counts from Sunday; and it requires both day fields to match, where cron fires when
*either* restricted day field matches. goald follows cron: 5 fields ``minute hour
day-of-month month day-of-week``; ``*``, ``a``, ``a-b``, ``*/n``, ``a-b/n``, ``a/n`` and lists;
names for months (``jan``) and weekdays (``sun``, ``0`` and ``7`` both Sunday); the macros
``@yearly @annually @monthly @weekly @daily @midnight @hourly``. When day-of-month and
day-of-week are both restricted (neither starts with ``*``) a day matches if either does.

Local time: a cron expression names wall-clock times in the schedule's IANA time zone. A wall
time that does not exist (skipped by a spring-forward change) does not fire that day; one that
occurs twice (a fall-back change) fires once, at its first occurrence.

Why not a maintained library (checked against the table tests of ``tests/daemon/test_schedule_math.py``,
cronsim 2.9 and croniter 7.0): both get daylight-saving days wrong for goald's rule. cronsim fires
a skipped wall time at the end of the gap (``30 2 * * *`` in Berlin fires 2025-03-30 03:00 CEST,
expected: not that day, next 2025-03-31 02:30) and an hourly job twice in a repeated hour
(New York 2025-11-02 01:00 EDT, then 01:00 EST again); it also lacks the ``@`` macros. croniter
makes the same two mistakes, fires a daily ``30 1 * * *`` twice on a fall-back night, and reads a
``*``-led ``*/1`` day-of-week as restricted (``0 0 13 * */1`` fires on the 2nd, not the 13th).
Wrapping either would still need this module's fold and gap handling, so the arithmetic stays ours.
"""

from __future__ import annotations

import bisect
import functools
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

#: How far to look for the next fire of a cron expression (Feb 29 recurs within 8 years).
_SEARCH_DAYS = 8 * 366 + 2
#: Wider than any daylight-saving fold, so a backward search never skips a first occurrence.
_FOLD_SLACK = timedelta(hours=6)

# -- cron ----------------------------------------------------------------------------------

_MONTHS = {
    m: i + 1 for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"))
}
_WEEKDAYS = {d: i for i, d in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTH_DAYS = {1: 31, 2: 29, 3: 31, 4: 30, 5: 31, 6: 30, 7: 31, 8: 31, 9: 30, 10: 31, 11: 30, 12: 31}
_NUMBER = re.compile(r"[0-9]{1,4}")


@dataclass(frozen=True)
class CronFields:
    """A parsed cron expression (weekdays count from Sunday = 0)."""

    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    days_restricted: bool
    weekdays_restricted: bool

    @functools.cached_property
    def times(self) -> tuple[time, ...]:
        """The wall-clock times of a matching day, in order."""
        return tuple(time(h, m) for h in sorted(self.hours) for m in sorted(self.minutes))

    def matches(self, day: date) -> bool:
        """Whether ``day`` is one the expression fires on."""
        if day.month not in self.months:
            return False
        by_day = day.day in self.days
        by_weekday = (day.weekday() + 1) % 7 in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return by_day or by_weekday
        return by_day and by_weekday


def _field(text: str, name: str, lo: int, hi: int, names: dict[str, int] | None) -> frozenset[int]:
    def value(token: str) -> int:
        if names is not None and token.lower() in names:
            return names[token.lower()]
        if not _NUMBER.fullmatch(token):
            kind = "a number or a name" if names is not None else "a number"
            raise ValueError(f"{name} field: {token!r} is not {kind}")
        v = int(token)
        if not lo <= v <= hi:
            raise ValueError(f"{name} field: {v} is out of range {lo}-{hi}")
        return v

    out: set[int] = set()
    for item in text.split(","):
        if not item:
            raise ValueError(f"{name} field {text!r}: empty list item")
        body, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not _NUMBER.fullmatch(step_text) or int(step_text) < 1:
                raise ValueError(f"{name} field: step {step_text!r} must be a whole number of at least 1")
            step = int(step_text)
        if body == "*":
            start, end = lo, (6 if name == "day-of-week" else hi)
        elif "-" in body:
            a, _, b = body.partition("-")
            start, end = value(a), value(b)
            if start > end:
                raise ValueError(f"{name} field: range {body} runs backwards")
        else:
            start = value(body)
            end = hi if slash else start
        out.update(range(start, end + 1, step))
    if name == "day-of-week" and 7 in out:
        out = (out - {7}) | {0}
    return frozenset(out)


@functools.lru_cache(maxsize=256)
def parse_cron(expr: str) -> CronFields:
    """Parse a 5-field cron expression (or a macro).

    Raises:
        ValueError: naming the field and the problem, e.g. ``minute field: 61 is out of range 0-59``.
    """
    text = expr.strip()
    if not text:
        raise ValueError("the cron expression is empty")
    if text.startswith("@"):
        if text.lower() not in _MACROS:
            raise ValueError(f"unknown cron macro {text!r} (known: {', '.join(_MACROS)})")
        text = _MACROS[text.lower()]
    parts = text.split()
    if len(parts) != 5:
        raise ValueError(
            f"a cron expression has 5 fields (minute hour day-of-month month day-of-week), got {len(parts)}: {expr!r}"
        )
    fields = CronFields(
        minutes=_field(parts[0], "minute", 0, 59, None),
        hours=_field(parts[1], "hour", 0, 23, None),
        days=_field(parts[2], "day-of-month", 1, 31, None),
        months=_field(parts[3], "month", 1, 12, _MONTHS),
        weekdays=_field(parts[4], "day-of-week", 0, 7, _WEEKDAYS),
        days_restricted=not parts[2].startswith("*"),
        weekdays_restricted=not parts[4].startswith("*"),
    )
    if not fields.weekdays_restricted and min(fields.days) > max(_MONTH_DAYS[m] for m in fields.months):
        raise ValueError(f"{expr!r} never fires: no month it names has a day {min(fields.days)}")
    return fields


def _instant(naive: datetime, tz: ZoneInfo) -> datetime | None:
    """The first instant showing wall time ``naive`` in ``tz``, or None if that wall time is skipped."""
    utc = naive.replace(tzinfo=tz).astimezone(UTC)  # fold=0: the first occurrence of a repeated time
    if utc.astimezone(tz).replace(tzinfo=None) != naive:
        return None
    return utc


def cron_next(fields: CronFields, tz: ZoneInfo, after: datetime) -> datetime | None:
    # With fold=0 the wall-time -> instant map is increasing over existing times, so no wall time
    # before after's own can fire after it (see the module docstring).
    local = after.astimezone(tz).replace(tzinfo=None)
    day = local.date()
    times = fields.times
    first = bisect.bisect_left(times, local.time())
    for _ in range(_SEARCH_DAYS):
        if fields.matches(day):
            for t in times[first:]:
                inst = _instant(datetime.combine(day, t), tz)
                if inst is not None and inst > after:
                    return inst
        day += timedelta(days=1)
        first = 0
    return None


def cron_prev(fields: CronFields, tz: ZoneInfo, at: datetime) -> datetime | None:
    # A wall time shortly after at's may still be an earlier instant (the first pass of a fold).
    top = at.astimezone(tz).replace(tzinfo=None) + _FOLD_SLACK
    day = top.date()
    times = fields.times
    last = bisect.bisect_right(times, top.time())
    for _ in range(_SEARCH_DAYS):
        if fields.matches(day):
            for t in reversed(times[:last]):
                inst = _instant(datetime.combine(day, t), tz)
                if inst is not None and inst <= at:
                    return inst
        day -= timedelta(days=1)
        last = len(times)
    return None
