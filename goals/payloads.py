"""Typed payloads of the events goals write in their sessions (``goal/*``).

The runtime's own event kinds are typed in :mod:`agent.payloads`; goals add theirs under the
``goal/`` prefix and register them there, so :attr:`Event.payload <agent.Event.payload>` reads
them like any other kind. As for every kind, the stored object is unchanged (camelCase keys);
these models are its read view.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agent import Payload, register_payloads
from goals.model import GoalStatus, VerifyResult

#: Who asked for a change, as its event records it: ``uid`` and ``pid`` (from the kernel, for a
#: caller on the control socket) or ``web`` (the status page token's name).
Caller = Mapping[str, int | str]


class GoalChanged(Payload):
    """``goal/changed``: the goal's status changed (with its counters at that moment)."""

    type: Literal["goal/changed"] = "goal/changed"
    goal_id: str
    #: The status before (``None`` when the goal was created).
    from_: GoalStatus | None = Field(default=None, alias="from")
    status: GoalStatus
    reason: str | None = None
    rounds: int | None = None
    tokens: int | None = None
    cost: float | None = None
    #: Who asked for the change through the control socket (``SO_PEERCRED``); absent when the
    #: daemon decided it, and in rows written before these were recorded.
    uid: int | None = None
    pid: int | None = None
    #: The status page's token name when the change was asked for there (``daemon.web``).
    web: str | None = None


class GoalFieldChange(BaseModel):
    """One field of a ``goal/edited`` event: its value before and after (as stored, JSON)."""

    model_config = ConfigDict(frozen=True)

    before: Any = None
    after: Any = None


class GoalEdited(Payload):
    """``goal/edited``: a person changed the goal's objective, title, budgets, verification or
    progress command (each changed field before and after), and who asked."""

    type: Literal["goal/edited"] = "goal/edited"
    goal_id: str
    changes: dict[str, GoalFieldChange] = Field(default_factory=dict)
    uid: int | None = None
    pid: int | None = None
    #: The status page's token name when the change was asked for there (``daemon.web``).
    web: str | None = None


class GoalProgressNoted(Payload):
    """``goal/progress``: the agent noted progress (``goal_progress``)."""

    type: Literal["goal/progress"] = "goal/progress"
    goal_id: str
    turn_id: str | None = None
    note: str


class GoalClaimed(Payload):
    """``goal/claim``: the agent claimed the objective is met (``goal_complete``)."""

    type: Literal["goal/claim"] = "goal/claim"
    goal_id: str
    turn_id: str | None = None
    summary: str
    evidence: str


class GoalBlockedReported(Payload):
    """``goal/blocked``: the agent reported it cannot proceed (``goal_blocked``)."""

    type: Literal["goal/blocked"] = "goal/blocked"
    goal_id: str
    turn_id: str | None = None
    reason: str


class GoalQuestionAsked(Payload):
    """``goal/question``: the agent asked its operator a question (``ask_operator``); the engine
    writes its row and makes the goal wait when the turn's idle is decided."""

    type: Literal["goal/question"] = "goal/question"
    goal_id: str
    turn_id: str | None = None
    question_id: str
    text: str
    options: list[str] = Field(default_factory=list)
    default: str | None = None
    timeout_seconds: float | None = None
    #: ``question`` or ``approval``; an approval's subject (the call it is about).
    kind: str = "question"
    subject: str | None = None


class GoalQuestionAnswered(Payload):
    """``goal/answered``: a question of the goal was closed: answered by a person, its default
    used at the deadline, withdrawn, or left unanswered (``how``); ``by`` says who."""

    type: Literal["goal/answered"] = "goal/answered"
    goal_id: str
    question_id: str
    answer: str | None = None
    how: str
    by: str
    #: The message that carries the answer to the goal (``None``: none was sent).
    message_id: str | None = None
    uid: int | None = None
    pid: int | None = None
    web: str | None = None


class GoalVerified(Payload):
    """``goal/verified``: the verification commands ran on a claim."""

    type: Literal["goal/verified"] = "goal/verified"
    goal_id: str
    passed: bool
    #: The results of an earlier run over the same work directory were reused.
    reused: bool = False
    results: list[VerifyResult] = Field(default_factory=list)


class GoalCounted(Payload):
    """``goal/counted``: a paused goal counted the spend of a turn that ran while it was paused (the
    round running at the pause, or a person's message); its status stays."""

    type: Literal["goal/counted"] = "goal/counted"
    goal_id: str
    status: GoalStatus
    rounds: int
    tokens: int
    cost: float


class GoalFingerprinted(Payload):
    """``goal/fingerprint``: the work directory's walk at a decision met a bound (files counted by
    size and time, reading cut short by time or bytes, the entry bound), said in ``text``."""

    type: Literal["goal/fingerprint"] = "goal/fingerprint"
    goal_id: str
    #: The bounds that applied, in plain words ("fingerprint bounded: ...").
    text: str
    #: Files counted by size and times, not content; regular files seen.
    files_by_time: int = 0
    files: int = 0
    #: Bytes read at this decision; allocated bytes counted by content, and of all files.
    bytes_read: int = 0
    content_bytes: int = 0
    file_bytes: int = 0
    #: What the work directory holds on disk (allocated blocks of what was walked).
    disk_bytes: int = 0
    #: Why reading stopped early (``time``, ``bytes``): no progress was judged from the walk.
    cut: str | None = None
    #: The entry bound cut the walk.
    truncated: bool = False
    seconds: float = 0.0


#: Every goal payload; their kinds are ``GOAL_CHANGED`` … ``GOAL_FINGERPRINT`` of :mod:`goals.store`.
GOAL_PAYLOADS: tuple[type[Payload], ...] = (
    GoalChanged,
    GoalCounted,
    GoalProgressNoted,
    GoalClaimed,
    GoalBlockedReported,
    GoalVerified,
    GoalEdited,
    GoalFingerprinted,
    GoalQuestionAsked,
    GoalQuestionAnswered,
)

register_payloads(*GOAL_PAYLOADS)
