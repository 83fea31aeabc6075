"""Schedule arithmetic as tables of fixed datetimes: cron (with DST days), intervals, one-shot
dates, the missed-fire policies, and the validation of schedule specs.

Everything here is pure (no clock, no store): ``next_fire``, ``prev_fire`` and ``missed_runs``
are functions of their arguments.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from pydantic import ValidationError

from agent import InvalidInput
from daemon.schedule import (
    CronTrigger,
    DateTrigger,
    IntervalTrigger,
    MissedRun,
    RunOutcome,
    ScheduleSpec,
    missed_runs,
    next_fire,
    parse_cron,
    prev_fire,
)

BERLIN = "Europe/Berlin"
NEW_YORK = "America/New_York"


def at(text: str) -> datetime:
    """An aware datetime from ISO 8601 with an offset."""
    value = datetime.fromisoformat(text)
    assert value.tzinfo is not None
    return value


def local(value: datetime | None, tz: str) -> str | None:
    """A fire time shown as wall time with its offset in ``tz``."""
    return None if value is None else value.astimezone(ZoneInfo(tz)).isoformat()


# -- cron: next fire -----------------------------------------------------------------------------

CRON_NEXT = [
    # (expr, zone, after, expected next fire as local wall time with offset)
    ("0 3 * * *", "UTC", "2025-01-01T00:00:00+00:00", "2025-01-01T03:00:00+00:00"),
    # strictly after: a fire time is not its own successor
    ("0 3 * * *", "UTC", "2025-01-01T03:00:00+00:00", "2025-01-02T03:00:00+00:00"),
    ("0 3 * * *", "UTC", "2025-01-01T02:59:59.999999+00:00", "2025-01-01T03:00:00+00:00"),
    ("*/15 * * * *", "UTC", "2025-01-01T10:07:00+00:00", "2025-01-01T10:15:00+00:00"),
    ("5/20 * * * *", "UTC", "2025-01-01T10:46:00+00:00", "2025-01-01T11:05:00+00:00"),
    ("0 0 */10 * *", "UTC", "2025-01-21T00:00:00+00:00", "2025-01-31T00:00:00+00:00"),
    ("0 0 1 jan,jul *", "UTC", "2025-01-01T00:00:00+00:00", "2025-07-01T00:00:00+00:00"),
    # weekdays count from Sunday = 0, as in crontab (APScheduler 3 would read 1-5 as Tue-Sat)
    ("0 9 * * 1-5", "UTC", "2025-01-03T10:00:00+00:00", "2025-01-06T09:00:00+00:00"),  # Fri -> Mon
    ("0 0 * * 0", "UTC", "2025-01-01T00:00:00+00:00", "2025-01-05T00:00:00+00:00"),  # a Sunday
    ("0 0 * * 7", "UTC", "2025-01-01T00:00:00+00:00", "2025-01-05T00:00:00+00:00"),
    ("0 0 * * SUN", "UTC", "2025-01-01T00:00:00+00:00", "2025-01-05T00:00:00+00:00"),
    ("@weekly", "UTC", "2025-01-01T00:00:00+00:00", "2025-01-05T00:00:00+00:00"),
    ("@daily", "UTC", "2025-01-01T00:00:00+00:00", "2025-01-02T00:00:00+00:00"),
    ("@hourly", "UTC", "2025-01-01T00:00:00+00:00", "2025-01-01T01:00:00+00:00"),
    # both day fields restricted: either matches (cron), so the 1st or any Monday
    ("0 12 1 * mon", "UTC", "2025-01-02T00:00:00+00:00", "2025-01-06T12:00:00+00:00"),
    ("0 12 1 * mon", "UTC", "2025-01-27T13:00:00+00:00", "2025-02-01T12:00:00+00:00"),
    # a restricted day-of-month with a '*'-led day-of-week: both must match (*/2 counts as '*')
    ("0 0 13 * */1", "UTC", "2025-01-01T00:00:00+00:00", "2025-01-13T00:00:00+00:00"),
    ("0 0 29 2 *", "UTC", "2025-03-01T00:00:00+00:00", "2028-02-29T00:00:00+00:00"),
    ("0 9 * * *", "Asia/Tokyo", "2024-12-31T23:00:00+00:00", "2025-01-01T09:00:00+09:00"),
    # spring forward, Berlin 2025-03-30 02:00 -> 03:00: 02:30 does not exist that day; skipped
    ("30 2 * * *", BERLIN, "2025-03-29T12:00:00+01:00", "2025-03-31T02:30:00+02:00"),
    ("30 2 * * *", BERLIN, "2025-03-29T02:30:00+01:00", "2025-03-31T02:30:00+02:00"),
    # ... while 03:30 exists and 01:30 too
    ("30 3 * * *", BERLIN, "2025-03-29T12:00:00+01:00", "2025-03-30T03:30:00+02:00"),
    ("30 1 * * *", BERLIN, "2025-03-29T12:00:00+01:00", "2025-03-30T01:30:00+01:00"),
    # spring forward, New York 2025-03-09 02:00 -> 03:00
    ("30 2 * * *", NEW_YORK, "2025-03-08T12:00:00-05:00", "2025-03-10T02:30:00-04:00"),
    ("*/30 * * * *", NEW_YORK, "2025-03-09T01:30:00-05:00", "2025-03-09T03:00:00-04:00"),
    # fall back, New York 2025-11-02 02:00 EDT -> 01:00 EST: 01:30 happens twice, fires once
    ("30 1 * * *", NEW_YORK, "2025-11-01T12:00:00-04:00", "2025-11-02T01:30:00-04:00"),
    ("30 1 * * *", NEW_YORK, "2025-11-02T01:30:00-04:00", "2025-11-03T01:30:00-05:00"),
    ("30 1 * * *", NEW_YORK, "2025-11-02T01:10:00-05:00", "2025-11-03T01:30:00-05:00"),
    # an hourly job in the repeated hour: 01:00 once (first pass), then 02:00
    ("0 * * * *", NEW_YORK, "2025-11-02T00:30:00-04:00", "2025-11-02T01:00:00-04:00"),
    ("0 * * * *", NEW_YORK, "2025-11-02T01:00:00-04:00", "2025-11-02T02:00:00-05:00"),
    # fall back, Berlin 2025-10-26 03:00 CEST -> 02:00 CET: 02:30 fires once
    ("30 2 * * *", BERLIN, "2025-10-25T12:00:00+02:00", "2025-10-26T02:30:00+02:00"),
    ("30 2 * * *", BERLIN, "2025-10-26T02:30:00+02:00", "2025-10-27T02:30:00+01:00"),
]


@pytest.mark.parametrize(("expr", "tz", "after", "expected"), CRON_NEXT)
def test_cron_next_fire(expr: str, tz: str, after: str, expected: str) -> None:
    got = next_fire(CronTrigger(expr=expr), tz, at(after))
    assert got is not None and got.tzinfo is UTC
    assert local(got, tz) == expected


def fires(expr: str, tz: str, start: str, end: str) -> list[str]:
    """Every fire in ``(start, end]`` as local wall times."""
    out: list[str] = []
    t: datetime | None = at(start)
    while True:
        t = next_fire(CronTrigger(expr=expr), tz, t) if t is not None else None
        if t is None or t > at(end):
            return out
        out.append(local(t, tz) or "")


def test_nonexistent_local_time_is_skipped_that_day_only() -> None:
    days = fires("30 2 * * *", BERLIN, "2025-03-28T00:00:00+01:00", "2025-04-01T00:00:00+02:00")
    assert days == ["2025-03-28T02:30:00+01:00", "2025-03-29T02:30:00+01:00", "2025-03-31T02:30:00+02:00"]


def test_ambiguous_local_time_fires_exactly_once() -> None:
    days = fires("30 1 * * *", NEW_YORK, "2025-11-01T00:00:00-04:00", "2025-11-04T00:00:00-05:00")
    assert days == ["2025-11-01T01:30:00-04:00", "2025-11-02T01:30:00-04:00", "2025-11-03T01:30:00-05:00"]
    # every quarter hour across the fall-back night: each wall time once, no instant twice
    night = fires("*/15 * * * *", NEW_YORK, "2025-11-02T00:40:00-04:00", "2025-11-02T02:20:00-05:00")
    assert night == [
        "2025-11-02T00:45:00-04:00",
        "2025-11-02T01:00:00-04:00",
        "2025-11-02T01:15:00-04:00",
        "2025-11-02T01:30:00-04:00",
        "2025-11-02T01:45:00-04:00",
        "2025-11-02T02:00:00-05:00",
        "2025-11-02T02:15:00-05:00",
    ]


# -- cron: previous fire, and agreement of the two directions ---------------------------------

CRON_PREV = [
    ("0 3 * * *", "UTC", "2025-01-02T03:00:00+00:00", "2025-01-02T03:00:00+00:00"),  # at or before
    ("0 3 * * *", "UTC", "2025-01-02T02:59:00+00:00", "2025-01-01T03:00:00+00:00"),
    ("30 2 * * *", BERLIN, "2025-03-31T00:00:00+02:00", "2025-03-29T02:30:00+01:00"),
    # during the second pass of the repeated hour the last fire is the first pass
    ("30 1 * * *", NEW_YORK, "2025-11-02T01:45:00-05:00", "2025-11-02T01:30:00-04:00"),
    ("0 0 29 2 *", "UTC", "2027-12-31T00:00:00+00:00", "2024-02-29T00:00:00+00:00"),
]


@pytest.mark.parametrize(("expr", "tz", "before", "expected"), CRON_PREV)
def test_cron_prev_fire(expr: str, tz: str, before: str, expected: str) -> None:
    assert local(prev_fire(CronTrigger(expr=expr), tz, at(before)), tz) == expected


def test_prev_and_next_agree_on_random_instants() -> None:
    """For seeded random instants x: prev(x) <= x < next(x), and they are neighbours."""
    rng = random.Random(20250330)
    exprs = ["*/7 * * * *", "30 2 * * *", "0 1,2,3 * * 0", "15 */5 1-7 * mon", "0 0 31 * *"]
    base = datetime(2024, 1, 1, tzinfo=UTC)
    for expr in exprs:
        trig = CronTrigger(expr=expr)
        for tz in ("UTC", BERLIN, NEW_YORK, "Australia/Lord_Howe"):
            for _ in range(20):
                x = base + timedelta(seconds=rng.randrange(0, 2 * 365 * 86400))
                p, n = prev_fire(trig, tz, x), next_fire(trig, tz, x)
                assert p is not None and n is not None
                assert p <= x < n
                assert next_fire(trig, tz, p) == n
                assert next_fire(trig, tz, p - timedelta(microseconds=1)) == p


# -- intervals and dates -------------------------------------------------------------------------

START = "2025-01-01T00:00:00+00:00"
INTERVAL_NEXT = [
    (3600, "2024-12-31T12:00:00+00:00", "2025-01-01T00:00:00+00:00"),  # before the start: the start
    (3600, START, "2025-01-01T01:00:00+00:00"),
    (3600, "2025-01-01T00:30:00+00:00", "2025-01-01T01:00:00+00:00"),
    (3600, "2025-01-01T01:00:00+00:00", "2025-01-01T02:00:00+00:00"),
    (1.5, "2025-01-01T00:00:01+00:00", "2025-01-01T00:00:01.500000+00:00"),
    (86400, "2025-03-30T12:00:00+02:00", "2025-03-31T00:00:00+00:00"),  # instants: DST irrelevant
]


@pytest.mark.parametrize(("seconds", "after", "expected"), INTERVAL_NEXT)
def test_interval_next_fire(seconds: float, after: str, expected: str) -> None:
    trig = IntervalTrigger(seconds=seconds, start=at(START))
    assert next_fire(trig, BERLIN, at(after)) == at(expected)


def test_interval_prev_fire_and_unresolved_start() -> None:
    trig = IntervalTrigger(seconds=600, start=at(START))
    assert prev_fire(trig, "UTC", at("2025-01-01T00:25:00+00:00")) == at("2025-01-01T00:20:00+00:00")
    assert prev_fire(trig, "UTC", at("2024-12-31T23:59:00+00:00")) is None
    with pytest.raises(ValueError, match="start resolved"):
        next_fire(IntervalTrigger(seconds=600), "UTC", at(START))


def test_date_trigger_fires_once() -> None:
    trig = DateTrigger(at=at("2025-06-01T09:00:00+02:00"))
    assert next_fire(trig, "UTC", at("2025-06-01T06:59:59+00:00")) == at("2025-06-01T07:00:00+00:00")
    assert next_fire(trig, "UTC", at("2025-06-01T07:00:00+00:00")) is None
    assert prev_fire(trig, "UTC", at("2025-06-01T07:00:00+00:00")) == at("2025-06-01T07:00:00+00:00")
    assert prev_fire(trig, "UTC", at("2025-06-01T06:00:00+00:00")) is None


# -- missed runs ---------------------------------------------------------------------------------

HOURLY = CronTrigger(expr="0 * * * *")
T0 = "2025-01-01T00:00:00+00:00"
C, M, F = RunOutcome.COALESCED, RunOutcome.MISSED, RunOutcome.FIRED

MISSED = [
    # (trigger, last_fire_at, now, misfire, deadline, [(hh:mm UTC, outcome)])
    (HOURLY, T0, "2025-01-01T00:30:00+00:00", "coalesce", None, []),
    (HOURLY, T0, "2025-01-01T03:30:00+00:00", "coalesce", None, [("01:00", C), ("02:00", C), ("03:00", F)]),
    (HOURLY, T0, "2025-01-01T03:30:00+00:00", "skip", None, [("01:00", M), ("02:00", M), ("03:00", M)]),
    (HOURLY, T0, "2025-01-01T01:00:00+00:00", "coalesce", None, [("01:00", F)]),  # due exactly now
    (HOURLY, "2025-01-01T02:00:00+00:00", "2025-01-01T03:30:00+00:00", "coalesce", None, [("03:00", F)]),
    # the latest is 30 min old: within a 1 h deadline it fires; past a 10 min one all are missed
    (HOURLY, T0, "2025-01-01T03:30:00+00:00", "coalesce", 3600, [("01:00", C), ("02:00", C), ("03:00", F)]),
    (HOURLY, T0, "2025-01-01T03:30:00+00:00", "coalesce", 600, [("01:00", M), ("02:00", M), ("03:00", M)]),
    (IntervalTrigger(seconds=600, start=at(T0)), T0, "2025-01-01T00:35:00+00:00", "coalesce", None,
     [("00:10", C), ("00:20", C), ("00:30", F)]),
    (DateTrigger(at=at("2025-01-01T02:00:00+00:00")), T0, "2025-01-01T05:00:00+00:00", "coalesce", None,
     [("02:00", F)]),
    (DateTrigger(at=at("2025-01-01T02:00:00+00:00")), T0, "2025-01-01T05:00:00+00:00", "skip", None,
     [("02:00", M)]),
]  # fmt: skip


@pytest.mark.parametrize(("trigger", "last", "now", "misfire", "deadline", "expected"), MISSED)
def test_missed_runs(trigger: Any, last: str, now: str, misfire: Any, deadline: float | None, expected: Any) -> None:
    runs = missed_runs(trigger, "UTC", at(last), at(now), misfire, deadline)
    assert [(r.scheduled_for.strftime("%H:%M"), r.outcome) for r in runs] == expected
    assert all(isinstance(r, MissedRun) and r.reason for r in runs)


def test_missed_runs_reasons_name_the_policy() -> None:
    runs = missed_runs(HOURLY, "UTC", at(T0), at("2025-01-01T03:30:00+00:00"), "coalesce", 600)
    assert "past the starting deadline of 600s" in runs[-1].reason
    runs = missed_runs(HOURLY, "UTC", at(T0), at("2025-01-01T02:30:00+00:00"), "coalesce", None)
    assert runs[0].reason.endswith("coalesced into 2025-01-01T02:00:00+00:00")
    runs = missed_runs(HOURLY, "UTC", at(T0), at("2025-01-01T02:30:00+00:00"), "skip", None)
    assert "misfire policy skip" in runs[0].reason


def test_missed_runs_on_a_dst_day_skip_the_nonexistent_time() -> None:
    runs = missed_runs(
        CronTrigger(expr="30 2 * * *"), BERLIN, at("2025-03-29T03:00:00+01:00"), at("2025-04-01T00:00:00+02:00"),
        "coalesce", None,
    )  # fmt: skip
    assert [(local(r.scheduled_for, BERLIN), r.outcome) for r in runs] == [("2025-03-31T02:30:00+02:00", F)]


def test_missed_runs_beyond_the_limit_share_one_row() -> None:
    """A day of every-minute fires with a limit of 5: the latest 5, plus one row for the rest."""
    every_minute = CronTrigger(expr="* * * * *")
    runs = missed_runs(every_minute, "UTC", at(T0), at("2025-01-02T00:00:30+00:00"), "coalesce", None, limit=5)
    assert len(runs) == 6
    assert runs[0].scheduled_for == at("2025-01-01T00:01:00+00:00") and runs[0].outcome is C
    assert "stands for every fire from 2025-01-01T00:01:00+00:00 to 2025-01-01T23:55:00+00:00" in runs[0].reason
    assert [r.scheduled_for.strftime("%H:%M") for r in runs[1:]] == ["23:56", "23:57", "23:58", "23:59", "00:00"]
    assert [r.outcome for r in runs[1:]] == [C, C, C, C, F]


# -- validation ----------------------------------------------------------------------------------

BAD_CRON = [
    ("61 * * * *", "minute field: 61 is out of range 0-59"),
    ("* * *", "a cron expression has 5 fields (minute hour day-of-month month day-of-week), got 3"),
    ("a b c d e", "minute field: 'a' is not a number"),
    ("0 24 * * *", "hour field: 24 is out of range 0-23"),
    ("0 0 32 * *", "day-of-month field: 32 is out of range 1-31"),
    ("0 0 * 13 *", "month field: 13 is out of range 1-12"),
    ("0 0 * * 8", "day-of-week field: 8 is out of range 0-7"),
    ("0 0 * * funday", "day-of-week field: 'funday' is not a number or a name"),
    ("*/0 * * * *", "minute field: step '0' must be a whole number of at least 1"),
    ("30-10 * * * *", "minute field: range 30-10 runs backwards"),
    ("1,,2 * * * *", "empty list item"),
    ("0 0 30 2 *", "never fires: no month it names has a day 30"),
    ("", "the cron expression is empty"),
    ("@fortnightly", "unknown cron macro '@fortnightly'"),
    ("* * * * * *", "got 6"),
    ("-1 * * * *", "minute field: '' is not a number"),
]


@pytest.mark.parametrize(("expr", "message"), BAD_CRON)
def test_bad_cron_is_refused_naming_the_problem(expr: str, message: str) -> None:
    with pytest.raises(ValueError) as exc:
        parse_cron(expr)
    assert message in str(exc.value)
    with pytest.raises(InvalidInput) as exc2:
        ScheduleSpec.parse({"trigger": {"kind": "cron", "expr": expr}, "goal": {"objective": "x"}})
    assert message in str(exc2.value) and "trigger.expr" in str(exc2.value)


BAD_SPECS = [
    ({"trigger": {"kind": "interval", "seconds": 0}}, "trigger.seconds: Input should be greater than or equal to 1"),
    ({"trigger": {"kind": "interval", "seconds": -5}}, "trigger.seconds"),
    ({"trigger": {"kind": "date", "at": "2025-01-01T00:00:00"}}, "trigger.at: Input should have timezone info"),
    ({"trigger": {"kind": "weekly"}}, "trigger: Input tag 'weekly' found using 'kind' does not match"),
    ({"timezone": "Mars/Olympus_Mons"}, "timezone: unknown time zone 'Mars/Olympus_Mons'"),
    ({"timezone": "../../etc/passwd"}, "timezone: unknown time zone"),
    ({"timezone": "Europe"}, "timezone: unknown time zone 'Europe'"),
    ({"misfire": "later"}, "misfire: Input should be 'coalesce' or 'skip'"),
    ({"concurrency": "queue"}, "concurrency: Input should be 'forbid', 'replace' or 'allow'"),
    ({"starting_deadline_seconds": 0}, "starting_deadline_seconds: Input should be greater than 0"),
    ({"goal": {"objective": "  "}}, "goal: invalid goal template: objective: objective must not be empty"),
    ({"goal": {"objective": "x", "key": "k"}}, "goal: key cannot be set in a schedule's goal template"),
    ({"goal": {"objective": "x", "session_id": "ses_x"}}, "goal: session_id cannot be set"),
    ({"goal": {"objective": "x", "idempotencyKey": "i"}}, "goal: idempotency_key cannot be set"),
    ({"goal": {"objective": "x", "budgets": {"max_rounds": 0}}}, "goal: invalid goal template: budgets.max_rounds"),
    ({"goal": {"objective": "x", "colour": "red"}}, "goal: invalid goal template: colour: Extra inputs"),
    ({"surprise": 1}, "surprise: Extra inputs are not permitted"),
]


@pytest.mark.parametrize(("change", "message"), BAD_SPECS)
def test_bad_schedule_specs_are_refused(change: dict[str, Any], message: str) -> None:
    raw = {"trigger": {"kind": "cron", "expr": "0 3 * * *"}, "goal": {"objective": "report"}} | change
    with pytest.raises(InvalidInput) as exc:
        ScheduleSpec.parse(raw)
    assert message in str(exc.value)
    with pytest.raises(ValidationError):
        ScheduleSpec.model_validate(raw)


def test_spec_defaults_and_template_normalisation() -> None:
    spec = ScheduleSpec.parse(
        {
            "trigger": {"kind": "interval", "seconds": 90},
            "goal": {"objective": "tidy", "budgets": {"maxRounds": 3}, "rules": {"stallRounds": 2}},
            "startingDeadlineSeconds": 30,
        }
    )
    assert (spec.timezone, spec.misfire, spec.concurrency, spec.key) == ("UTC", "coalesce", "forbid", None)
    assert spec.starting_deadline_seconds == 30
    # camelCase from the wire is stored as the goal spec's own (snake_case) fields, unset ones omitted
    assert spec.goal == {"objective": "tidy", "budgets": {"max_rounds": 3}, "rules": {"stall_rounds": 2}}
