"""Schedules: their models, and the pure arithmetic of when they fire.

A schedule is a row in the goald store; :mod:`daemon.scheduler` keeps APScheduler's in-memory
jobs in step with the rows. Everything here is a pure function of its inputs (no clock, no I/O),
so the rules below are pinned by table tests with fixed datetimes.

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
occurs twice (a fall-back change) fires once, at its first occurrence. Interval and date
triggers are instants and ignore the zone. Fire times are returned in UTC.
"""

from __future__ import annotations

import bisect
import enum
import functools
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Annotated, Any, Literal, NamedTuple
from zoneinfo import ZoneInfo

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel, to_snake

from agent import TypedId
from daemon.protocol import InvalidField
from goals import GoalSpec

#: At most this many missed fires are listed one by one at start; older ones share one row.
MAX_MISSED_ROWS = 100
#: How far to look for the next fire of a cron expression (Feb 29 recurs within 8 years).
_SEARCH_DAYS = 8 * 366 + 2
#: Wider than any daylight-saving fold, so a backward search never skips a first occurrence.
_FOLD_SLACK = timedelta(hours=6)

Misfire = Literal["coalesce", "skip"]
Concurrency = Literal["forbid", "replace", "allow"]


class ScheduleId(TypedId):
    """Identity of one schedule."""

    prefix = "sch_"


class RunOutcome(enum.StrEnum):
    """What became of one scheduled instant (one ``schedule_runs`` row each)."""

    #: A goal was created from the template.
    FIRED = "fired"
    #: Not fired: the schedule's previous goal was still active or paused (concurrency ``forbid``).
    SKIPPED_CONCURRENCY = "skipped_concurrency"
    #: Not fired: due while goald was down (misfire ``skip``), or past the starting deadline.
    MISSED = "missed"
    #: Not fired on its own: folded into the run of a later instant (misfire ``coalesce``).
    COALESCED = "coalesced"
    #: Firing failed (the template did not make a goal); the reason says why.
    ERROR = "error"


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


def _cron_next(fields: CronFields, tz: ZoneInfo, after: datetime) -> datetime | None:
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


def _cron_prev(fields: CronFields, tz: ZoneInfo, at: datetime) -> datetime | None:
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


# -- triggers ------------------------------------------------------------------------------


class _Model(BaseModel):
    # Built on first use, not at import: a daemon without schedules never needs them to start.
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True, defer_build=True
    )


class CronTrigger(_Model):
    """Fires at the wall-clock times a 5-field cron expression names, in the schedule's zone."""

    kind: Literal["cron"] = "cron"
    expr: str = Field(max_length=1000)

    @field_validator("expr")
    @classmethod
    def _valid(cls, value: str) -> str:
        parse_cron(value)
        return value.strip()


class IntervalTrigger(_Model):
    """Fires every ``seconds``, from ``start`` (default: one interval after the schedule is added)."""

    kind: Literal["interval"] = "interval"
    seconds: float = Field(ge=1, le=366 * 86_400)
    start: AwareDatetime | None = None


class DateTrigger(_Model):
    """Fires once, at ``at``."""

    kind: Literal["date"] = "date"
    at: AwareDatetime


AnyTrigger = CronTrigger | IntervalTrigger | DateTrigger
Trigger = Annotated[AnyTrigger, Field(discriminator="kind")]


def zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name``. Raises ``ValueError`` saying what is wrong."""
    try:
        return ZoneInfo(name)
    except (ValueError, KeyError, OSError):
        raise ValueError(
            f"unknown time zone {name[:80]!r}: use an IANA name such as 'Europe/Berlin' or 'UTC'"
        ) from None


def next_fire(trigger: AnyTrigger, tz: ZoneInfo | str, after: datetime) -> datetime | None:
    """The first fire time strictly after ``after`` (aware), in UTC; None if there is none.

    An interval trigger must have its ``start`` resolved (the scheduler does that when adding).
    """
    tz = zone(tz) if isinstance(tz, str) else tz
    after = after.astimezone(UTC)
    match trigger:
        case CronTrigger():
            return _cron_next(parse_cron(trigger.expr), tz, after)
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
            return _cron_prev(parse_cron(trigger.expr), tz, at)
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
) -> list[MissedRun]:
    """The fires in ``(last_fire_at, now]``, oldest first, with their outcomes.

    ``coalesce``: the latest fires now and the earlier ones are ``coalesced`` into it; ``skip``:
    all are ``missed``; and if the latest is more than ``starting_deadline`` seconds old, all
    are ``missed``. At most ``limit`` fires are listed one by one; if there were more, one
    extra row, dated at the first of them, stands for all the older ones.
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
        earlier = (RunOutcome.MISSED, "missed while goald was not running (misfire policy skip)")
        last = earlier
    elif starting_deadline is not None and late > starting_deadline:
        earlier = (RunOutcome.MISSED, "missed while goald was not running; the latest fire was past its deadline")
        last = (RunOutcome.MISSED, f"missed: {late:.0f}s late, past the starting deadline of {starting_deadline:g}s")
    else:
        earlier = (RunOutcome.COALESCED, f"missed while goald was not running; coalesced into {newest.isoformat()}")
        last = (RunOutcome.FIRED, "due while goald was not running (misfire policy coalesce)")
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


# -- schedules -----------------------------------------------------------------------------

_TEMPLATE_REFUSED = {
    "idempotency_key": "each fire sets its own idempotency key",
    "session_id": "each fire makes a goal with its own session",
    "key": "goal keys are unique, and a schedule makes many goals (give the schedule a key instead)",
}


def _snake_keys(value: Any, *, names: bool = False) -> Any:
    # ``names``: the keys are names of the user's (a sandbox's secrets: ``GIT_TOKEN``), kept as given.
    if isinstance(value, dict):
        return {
            (to_snake(k) if isinstance(k, str) and not names else k): _snake_keys(v, names=k == "secrets" and not names)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_snake_keys(v) for v in value]
    return value


def validate_template(raw: dict[str, Any]) -> dict[str, Any]:
    """Check a goal template (a goal spec without ``idempotency_key``, ``session_id`` and ``key``).

    camelCase keys (as on the wire) are accepted; the stored template uses snake_case.
    """
    template = _snake_keys(raw)
    for name, why in _TEMPLATE_REFUSED.items():
        if name in template:
            raise ValueError(f"{name} cannot be set in a schedule's goal template: {why}")
    try:
        spec = GoalSpec.model_validate(template)
    except ValidationError as exc:
        raise ValueError(f"invalid goal template: {_first_errors(exc)}") from None
    out: dict[str, Any] = spec.model_dump(mode="json", exclude_unset=True)
    return out


def _first_errors(exc: ValidationError) -> str:
    msgs = []
    for err in exc.errors()[:3]:
        where = ".".join(str(p) for p in err["loc"] if p not in ("cron", "interval", "date"))
        msg = str(err["msg"]).removeprefix("Value error, ")
        msgs.append(f"{where}: {msg}" if where else msg)
    return "; ".join(msgs)


def _first_field(exc: ValidationError) -> str:
    # The wire (camelCase) name of the first refused field, without the trigger's kind tag.
    loc = [p for p in exc.errors()[0]["loc"] if p not in ("cron", "interval", "date")]
    return ".".join(to_camel(str(p)) for p in loc) or "params"


class ScheduleSpec(_Model):
    """What a caller gives to add (or, by ``key``, update) a schedule."""

    key: str | None = Field(default=None, min_length=1, max_length=200)
    trigger: Trigger
    timezone: str = "UTC"
    goal: dict[str, Any]
    misfire: Misfire = "coalesce"
    starting_deadline_seconds: float | None = Field(default=None, gt=0)
    concurrency: Concurrency = "forbid"

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        zone(value)
        return value

    @field_validator("goal")
    @classmethod
    def _template(cls, value: dict[str, Any]) -> dict[str, Any]:
        return validate_template(value)

    @classmethod
    def parse(cls, raw: Any) -> ScheduleSpec:
        """Validate ``raw`` (a mapping, or a spec). Raises ``InvalidInput`` naming each problem."""
        if isinstance(raw, Schedule):
            return raw.spec()
        if isinstance(raw, ScheduleSpec):
            return raw
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            raise InvalidField(f"invalid schedule: {_first_errors(exc)}", field=_first_field(exc)) from None


class Schedule(ScheduleSpec):
    """A schedule row, with what ``schedule list`` shows (next fire time, last outcome)."""

    model_config = ConfigDict(frozen=True, extra="ignore", alias_generator=to_camel, populate_by_name=True)

    id: ScheduleId
    session_id: str
    #: An interval trigger's resolved start (its first fire time).
    anchor_at: datetime | None = None
    #: When the current trigger took effect; fires before it are never due.
    active_since: datetime
    #: The latest scheduled instant handled (any outcome): the cursor for missed fires.
    last_fire_at: datetime | None = None
    last_goal_id: str | None = None
    created_at: datetime
    updated_at: datetime
    next_fire_at: datetime | None = None
    last_outcome: RunOutcome | None = None
    last_reason: str | None = None

    def spec(self) -> ScheduleSpec:
        """What the schedule was added (or last updated) with."""
        return ScheduleSpec.model_validate(self.model_dump(include=set(ScheduleSpec.model_fields)))

    def effective_trigger(self) -> AnyTrigger:
        """The trigger with an interval's start resolved."""
        if isinstance(self.trigger, IntervalTrigger) and self.trigger.start is None:
            return self.trigger.model_copy(update={"start": self.anchor_at})
        return self.trigger

    def public(self) -> dict[str, Any]:
        """The schedule as the control protocol shows it (camelCase, JSON-ready)."""
        return self.model_dump(mode="json", by_alias=True)


class ScheduleRun(_Model):
    """One ``schedule_runs`` row: what became of one scheduled instant."""

    model_config = ConfigDict(frozen=True, alias_generator=to_camel, populate_by_name=True)

    id: int
    schedule_id: str
    scheduled_for: datetime
    outcome: RunOutcome
    reason: str
    goal_id: str | None = None
    recorded_at: datetime

    def public(self) -> dict[str, Any]:
        """The run as the control protocol shows it (camelCase, JSON-ready)."""
        return self.model_dump(mode="json", by_alias=True)
