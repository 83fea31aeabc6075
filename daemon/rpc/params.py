"""The params of every control-protocol method: pydantic models, camelCase on the wire.

Every method validates its params with one of these before it touches anything, so bad input is
answered with an error naming the field and changes nothing. Unknown fields are refused.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from agent import MessageId, SessionId
from goals import Budgets, GoalSpec, GoalStatus, VerifyCommand


class Params(BaseModel):
    """Base of every params model: camelCase on the wire, unknown fields refused."""

    # Built on first use, not at import: most methods are never called before READY=1.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", defer_build=True)


class NoParams(Params):
    """No params."""


class SessionNew(Params):
    """``session/new``."""

    model: str | None = None
    workdir: str | None = None


class SessionRef(Params):
    """A session id."""

    session_id: SessionId


class Prompt(Params):
    """``session/prompt``."""

    session_id: SessionId
    text: str | None = None
    content: list[dict[str, Any]] | None = None
    delivery: Literal["followup", "steer", "context"] = "followup"
    message_id: MessageId | None = None
    #: To a goal's session whose goal has ended (completed, failed, cancelled, exhausted): resume
    #: the goal with its budgets first; without it such a message is refused.
    reopen: bool = False
    #: To a paused goal's session: resume the goal as well (without it the message runs one turn,
    #: charged to the goal, and the goal stays paused).
    resume: bool = False

    @model_validator(mode="after")
    def _one_of(self) -> Prompt:
        if (self.text is None) == (self.content is None):
            raise ValueError("give exactly one of text or content")
        return self


class CancelMessage(Params):
    """``session/cancelMessage``."""

    session_id: SessionId
    message_id: MessageId


class Interrupt(Params):
    """``session/interrupt``."""

    session_id: SessionId
    discard_queued: bool = False


class Subscribe(Params):
    """``session/subscribe`` (no session: every session, live only)."""

    session_id: SessionId | None = None
    after_seq: int | None = Field(default=None, ge=0)
    #: Also send the session's streamed text as ephemeral ``session.delta`` notifications.
    deltas: bool = False

    @model_validator(mode="after")
    def _deltas_need_a_session(self) -> Subscribe:
        if self.deltas and self.session_id is None:
            raise ValueError("deltas are sent for one session: give sessionId")
        return self


class SessionList(Params):
    """``session/list``."""

    prefix: str | None = None
    limit: int = Field(default=100, ge=1, le=10_000)


class EventsPage(Params):
    """``session/events``."""

    session_id: SessionId
    after_seq: int = Field(default=0, ge=0)
    limit: int = Field(default=200, ge=1, le=10_000)


class GoalCreate(GoalSpec):
    """``goal/create``: a :class:`~goals.GoalSpec` as the wire carries it (its fields, camelCase),
    with the wire's shorthands: ``stallRounds`` and ``infraRetries`` at the top level (into
    ``rules``), a ``null`` ``budgets`` or ``sandbox`` for the defaults, and an unset ``model`` for
    the daemon's default."""

    model_config = ConfigDict(defer_build=True)

    session_id: SessionId | None = None
    #: A directory inside the work-directory roots whose copy the goal starts from (in a new work
    #: directory of its own; not with ``workdir``, ``sessionId`` or ``repo``).
    start_from: str | None = Field(default=None, min_length=2, max_length=4096)
    stall_rounds: int | None = Field(default=None, ge=1)
    #: Rounds re-run in a row for the infrastructure's trouble before the goal tries only once every
    #: ``error_backoff_max_seconds`` (default 20).
    infra_retries: int | None = Field(default=None, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _nulls(cls, data: Any) -> Any:
        if isinstance(data, dict) and (data.get("budgets", 0) is None or data.get("sandbox", 0) is None):
            return {k: v for k, v in data.items() if not (k in ("budgets", "sandbox") and v is None)}
        return data

    def spec(self, default_model: str) -> GoalSpec:
        """The goal spec it asks for (the shorthands folded in, the model defaulted)."""
        fields = {name: getattr(self, name) for name in GoalSpec.model_fields}
        shorthands = {"stall_rounds": self.stall_rounds, "infra_retries": self.infra_retries}
        fields["rules"] = self.rules.model_copy(update={k: v for k, v in shorthands.items() if v is not None})
        fields["model"] = self.model or default_model
        return GoalSpec.model_construct(self.model_fields_set & set(GoalSpec.model_fields) | {"model"}, **fields)


class GoalRef(Params):
    """A goal: its key, its id, or a unique prefix of its id."""

    goal_id: str = Field(min_length=1, max_length=200)


class GoalResume(GoalRef):
    """``goal/resume``."""

    budgets: Budgets | None = None


class GoalUpdate(GoalRef):
    """``goal/update``."""

    objective: str | None = None
    title: str | None = None
    budgets: Budgets | None = None
    verify: list[VerifyCommand] | None = None


class GoalList(Params):
    """``goal/list``: every filter given must hold."""

    status: GoalStatus | None = None
    #: Goals started by this schedule (its id, a unique prefix of one, or its key).
    schedule: str | None = Field(default=None, min_length=1, max_length=200)
    #: Goals created at or after this instant (ISO 8601 with a time zone).
    since: datetime | None = None

    @model_validator(mode="after")
    def _aware(self) -> GoalList:
        if self.since is not None and self.since.tzinfo is None:
            raise ValueError("since needs a time zone (e.g. Z or +01:00)")
        return self


class GoalDescribe(GoalRef):
    """``goal/describe``."""

    #: How many of the goal's latest events to include.
    events: int = Field(default=10, ge=0, le=1000)


class GoalAnswer(GoalRef):
    """``goal/answer``: answer the goal's open question (``questionId``: that one, which must be
    open) in words (``text``) or by one of its options (``option``, from 1); with ``withdraw`` the
    question is withdrawn instead and ``text`` is the reason the goal hears."""

    question_id: str | None = Field(default=None, min_length=1, max_length=100)
    text: str | None = Field(default=None, max_length=8000)
    option: int | None = Field(default=None, ge=1, le=10)
    withdraw: bool = False


class GoalRevoke(GoalRef):
    """``goal/revoke``: remove a standing approval of the goal (``subject``, as ``goal show`` lists
    it), or with ``all`` every one: the same call is asked about again."""

    subject: str | None = Field(default=None, min_length=1, max_length=10_000)
    all: bool = False


class GoalQuestions(Params):
    """``goal/questions``: questions goals asked, newest first (``goalId``: of that goal only;
    ``open``: only those still waiting for an answer)."""

    goal_id: str | None = Field(default=None, min_length=1, max_length=200)
    open: bool = False
    limit: int = Field(default=100, ge=1, le=10_000)


class GoalResumeAll(Params):
    """``goal/resumeAll``: every paused goal, or those paused for ``reason`` (e.g. ``auth_error``)."""

    reason: str | None = Field(default=None, min_length=1, max_length=200)


# -- schedule/* --------------------------------------------------------------------------


class ScheduleAdd(Params):
    """``schedule/add``."""

    key: str | None = None
    trigger: dict[str, Any]
    timezone: str = "UTC"
    goal: dict[str, Any]
    misfire: str = "coalesce"
    concurrency: str = "forbid"
    starting_deadline_seconds: float | None = None


class ScheduleRef(Params):
    """A schedule id, a unique prefix of one, or a schedule key (any length, e.g. ``ev``)."""

    schedule_id: str = Field(min_length=1, max_length=200)


class ScheduleRuns(ScheduleRef):
    """``schedule/runs``."""

    limit: int = Field(default=20, ge=1, le=10_000)
