"""Schedules: their ids, triggers, specs, rows and run outcomes (pydantic models, camelCase on the wire).

A schedule is a row in the goald store; :mod:`daemon.schedule.service` keeps APScheduler's
in-memory jobs in step with the rows, and :mod:`daemon.schedule.timing` says when a trigger fires.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel, to_snake

from agent import TypedId
from daemon.rpc.protocol import InvalidField
from daemon.schedule.cron import parse_cron
from goals import GoalSpec
from goals.model import field_loc

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
    #: Not fired: the schedule was suspended (``goald schedule suspend``) when the instant came due.
    SKIPPED_SUSPENDED = "skipped_suspended"
    #: Not fired: due while goald was down (misfire ``skip``), or past the starting deadline.
    MISSED = "missed"
    #: Not fired on its own: folded into the run of a later instant (misfire ``coalesce``).
    COALESCED = "coalesced"
    #: Firing failed (the template did not make a goal); the reason says why.
    ERROR = "error"


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
        where = field_loc(tuple(p for p in err["loc"] if p not in ("cron", "interval", "date")))
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
    #: When the schedule was suspended (its instants are recorded ``skipped_suspended``); ``None``: not.
    suspended_at: datetime | None = None

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
    #: The node that recorded the run, on a PostgreSQL cluster (``None`` on SQLite: one daemon).
    node_id: str | None = None
    #: Asked for by a person (``goald schedule run``), not at one of the trigger's instants.
    manual: bool = False

    def public(self) -> dict[str, Any]:
        """The run as the control protocol shows it (camelCase, JSON-ready)."""
        return self.model_dump(mode="json", by_alias=True)
