"""The goal model: status lifecycle, budgets, verification commands, and the goal row.

Every status change goes through :func:`transition`; an illegal one raises. A goal row is a
pydantic model; what the engine remembers between rounds (notes, fingerprints, seen tool calls,
the last verification) lives in :class:`GoalMemory`, stored as one JSON column.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any, assert_never

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from agent import ToolPolicy, TypedId
from goals.errors import InvalidGoalTransition
from goals.sandbox_spec import WIRE, SandboxSpec


class GoalId(TypedId):
    """Identity of one goal."""

    prefix = "goal_"


class QuestionId(TypedId):
    """Identity of one question a goal asked (``ask_operator``, or an approval)."""

    prefix = "q_"


class GoalStatus(enum.StrEnum):
    """Where a goal stands."""

    #: The engine advances it at each whole-agent idle of its session.
    ACTIVE = "active"
    #: Held: by a person, or by a stop rule (stalled, blocked, unverified, model_error, ...).
    PAUSED = "paused"
    #: Done: its verification commands passed (reason ``verified``), or it has none (reason
    #: ``no_verification``).
    COMPLETED = "completed"
    #: An unrecoverable fault (an unknown model, a vanished work directory).
    FAILED = "failed"
    #: Ended by a person.
    CANCELLED = "cancelled"
    #: A budget, the round limit or the deadline ran out; resumable with a raised budget.
    EXHAUSTED = "exhausted"
    #: The goal asked its operator a question (``ask_operator``) and waits for the answer, or for
    #: the question's deadline: nothing runs and nothing is charged meanwhile (:mod:`goals.questions`).
    WAITING = "waiting"

    @property
    def live(self) -> bool:
        """Whether the goal still holds its session (active, paused or waiting)."""
        return self in LIVE_STATUSES


#: The statuses of a goal that holds its session and work directory.
LIVE_STATUSES = (GoalStatus.ACTIVE, GoalStatus.PAUSED, GoalStatus.WAITING)
#: The same, as an SQL list (``status IN {LIVE_SQL}``): the one place the queries take it from.
LIVE_SQL = "(" + ", ".join(f"'{s.value}'" for s in LIVE_STATUSES) + ")"


def transition(current: GoalStatus, target: GoalStatus, *, reopen: bool = False) -> GoalStatus:
    """Perform one goal status transition, or raise :class:`~goals.errors.InvalidGoalTransition`.

    ``reopen``: a person's explicit reopening (a message sent to an ended goal with ``reopen``): an
    ended goal (completed, failed, cancelled) may become active again. Nothing else reopens one.
    """
    allowed: tuple[GoalStatus, ...]
    if reopen and current in (GoalStatus.COMPLETED, GoalStatus.FAILED, GoalStatus.CANCELLED):
        allowed = (GoalStatus.ACTIVE,)
        if target not in allowed:
            raise InvalidGoalTransition(f"a goal that is {current.value} can only be reopened as active")
        return target
    match current:
        case GoalStatus.ACTIVE:
            allowed = (
                GoalStatus.PAUSED,
                GoalStatus.WAITING,
                GoalStatus.COMPLETED,
                GoalStatus.FAILED,
                GoalStatus.CANCELLED,
                GoalStatus.EXHAUSTED,
            )
        case GoalStatus.PAUSED:
            allowed = (GoalStatus.ACTIVE, GoalStatus.CANCELLED, GoalStatus.FAILED)
        case GoalStatus.EXHAUSTED:
            allowed = (GoalStatus.ACTIVE, GoalStatus.CANCELLED)
        case GoalStatus.WAITING:
            # Answered (or the default at the deadline, or withdrawn); unanswered by the deadline
            # without a default: paused; or ended by a person (or a fault).
            allowed = (GoalStatus.ACTIVE, GoalStatus.PAUSED, GoalStatus.CANCELLED, GoalStatus.FAILED)
        case GoalStatus.COMPLETED | GoalStatus.FAILED | GoalStatus.CANCELLED:
            allowed = ()
        case _:
            assert_never(current)
    if target not in allowed:
        raise InvalidGoalTransition(
            f"a goal that is {current.value} cannot become {target.value}; {_what_it_can(current, allowed)}"
        )
    return target


def _what_it_can(current: GoalStatus, allowed: tuple[GoalStatus, ...]) -> str:
    if not allowed:
        return "it has ended: create a new goal to go on"
    return f"from {current.value} it can become {', '.join(s.value for s in allowed)}"


class StopReason(enum.StrEnum):
    """Well-known status reasons set by the engine's stop rules."""

    STALLED = "stalled"
    BLOCKED = "blocked"
    UNVERIFIED = "unverified"
    MODEL_ERROR = "model_error"
    AUTH_ERROR = "auth_error"
    BY_REQUEST = "by_request"
    ROUND_LIMIT = "round_limit"
    TOKEN_BUDGET = "token_budget"
    COST_BUDGET = "cost_budget"
    DEADLINE = "deadline"
    WALL_TIME = "wall_time"
    #: Completed: the goal's verification commands ran and all passed.
    VERIFIED = "verified"
    #: Completed on the model's word alone: the goal has no verification command. The CLI shows it
    #: as ``completed (unverified: no verification)``; never labelled verified.
    NO_VERIFICATION = "no_verification"
    WORKDIR_MISSING = "workdir_missing"
    #: Paused: the work directory holds more than the goal's disk limit (the reason carries the figures).
    DISK_LIMIT = "disk_limit"
    #: Waiting: the goal asked its operator a question (the reason carries it).
    QUESTION = "question"
    #: Paused: the question's deadline passed without an answer, and it had no default.
    QUESTION_UNANSWERED = "question_unanswered"


def field_loc(loc: tuple[int | str, ...]) -> str:
    """An error's location by field names (``budgets.max_rounds``, as a config file or a schedule's
    stored template writes it), from the wire names pydantic reports (``budgets.maxRounds``)."""
    return ".".join(_FIELD_NAMES.get(p, p) if isinstance(p, str) else str(p) for p in loc)


class Budgets(BaseModel):
    """What a goal may spend. ``None`` means no limit of that kind."""

    model_config = WIRE

    max_rounds: int | None = Field(default=None, ge=1)
    max_tokens_total: int | None = Field(default=None, ge=1)
    max_cost: float | None = Field(default=None, gt=0)
    max_wall_seconds: float | None = Field(default=None, gt=0)
    deadline: datetime | None = None

    @field_validator("deadline")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("deadline must carry a time zone (UTC recommended)")
        return value


class VerifyCommand(BaseModel):
    """One verification command, run in the goal's work directory; exit 0 passes."""

    model_config = WIRE

    cmd: str = Field(min_length=1)
    timeout: float = Field(default=300.0, gt=0, le=86_400)


class StopRules(BaseModel):
    """Thresholds of the engine's stop rules for one goal."""

    model_config = WIRE

    stall_rounds: int = Field(default=3, ge=1)
    max_refused_claims: int = Field(default=3, ge=1)
    blocked_rounds: int = Field(default=3, ge=1)
    max_model_errors: int = Field(default=5, ge=1)
    error_backoff_seconds: float = Field(default=30.0, ge=0)
    error_backoff_max_seconds: float = Field(default=3600.0, ge=0)
    #: Rounds re-run in a row for the infrastructure's trouble (a turn interrupted by the daemon's
    #: death, a lease move or a store outage; a provider that could not be reached): never counted
    #: as rounds; past this many in a row the goal tries once every ``error_backoff_max_seconds``.
    infra_retries: int = Field(default=20, ge=1)
    #: How long a question the goal asks (``ask_operator``) waits for an answer when it names no
    #: timeout of its own; then its default answer is used, or the goal pauses ``question_unanswered``.
    question_timeout_seconds: float = Field(default=86_400.0, gt=0, le=30 * 86_400)


class GoalSpec(BaseModel):
    """What a caller gives to create a goal (validated before anything is written): the one
    declaration of a goal's settings. It is the wire model of ``goal/create`` too (camelCase, see
    :data:`WIRE`), and :class:`Goal` derives from it, so a field added here reaches the protocol,
    the ``goals`` row and ``goald goal show`` with a migration (:mod:`goals.schema`) and nothing else."""

    model_config = WIRE

    objective: str
    title: str | None = None
    key: str | None = Field(default=None, min_length=1, max_length=200)
    budgets: Budgets = Budgets()
    verify: list[VerifyCommand] = []
    model: str | None = None
    workdir: str | None = None
    tools: list[str] | None = None
    session_id: str | None = None
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=200)
    rules: StopRules = StopRules()
    #: A command whose output is the goal's observable progress (a remote branch's head, a ticket's
    #: state), run in the goal's sandbox at each idle that ends a round: a changed output is progress.
    progress: VerifyCommand | None = None
    sandbox: SandboxSpec = SandboxSpec()
    #: Keep the work directory goald made for this goal after it ends (retention removes such
    #: directories after ``[retention] workdir_seconds`` otherwise; a directory its creator named is
    #: never removed).
    keep_workdir: bool = False
    #: In a cluster: only a node with this label (``[cluster] labels``) runs the goal — the host
    #: that has its work directory or toolchain. ``None``: any node.
    node_label: str | None = Field(default=None, min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.:-]+$")
    #: A git repository of the operator's (absolute path): the goal works in a worktree of it made
    #: for the goal, on a new branch (``branch``, default ``goald/<key or id>``) from ``base``
    #: (default ``HEAD``). goald records each round's tree and diffs it (``goald goal diff``).
    repo: str | None = Field(default=None, min_length=2, max_length=4096)
    base: str | None = Field(default=None, min_length=1, max_length=250, pattern=r"^[A-Za-z0-9._/@^~{}-]+$")
    branch: str | None = Field(default=None, min_length=1, max_length=250, pattern=r"^[A-Za-z0-9._/-]+$")
    #: With ``repo``: commit the last round's tree onto the branch when the goal completes (as
    #: ``goald goal commit`` does).
    commit_on_complete: bool = False
    #: The goal this one replays (``goald goal replay``): the same objective from the same start.
    replay_of: str | None = Field(default=None, min_length=1, max_length=100)

    @field_validator("repo")
    @classmethod
    def _repo(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("/") or "\0" in value):
            raise ValueError(f"repo {value!r} must be an absolute path")
        return value

    @field_validator("base", "branch")
    @classmethod
    def _ref(cls, value: str | None) -> str | None:
        if value is not None and (
            value.startswith(("-", "/", ".")) or ".." in value or value.endswith((".", "/", ".lock"))
        ):
            raise ValueError(f"{value!r} is not a usable git ref name")
        return value

    @field_validator("tools")
    @classmethod
    def _tools(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            ToolPolicy.from_entries(value)  # raises ValueError saying which entry is malformed
        return value

    @field_validator("objective")
    @classmethod
    def _objective(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("objective must not be empty")
        if len(value.encode()) > 64 * 1024:
            raise ValueError("objective is over 64 KiB")
        return value

    @model_validator(mode="after")
    def _title(self) -> GoalSpec:
        if self.title is not None and not self.title.strip():
            raise ValueError("title must not be blank")
        return self


#: Wire name -> field name of every field of the goal's shape (see :func:`field_loc`).
_FIELD_NAMES = {
    to_camel(name): name
    for model in (Budgets, VerifyCommand, SandboxSpec, StopRules, GoalSpec)
    for name in model.model_fields
    if to_camel(name) != name
}


class VerifyResult(BaseModel):
    """What one verification command did."""

    model_config = ConfigDict(frozen=True)

    cmd: str
    exit_code: int | None
    output_tail: str
    timed_out: bool = False
    seconds: float = 0.0
    #: The goal's deadline or wall time ran out: the command was cut short there (``timed_out``)
    #: or not run at all. It says nothing of the work, so a claim it refuses is not counted.
    out_of_time: bool = False

    @property
    def passed(self) -> bool:
        """Exit code 0 within the timeout."""
        return self.exit_code == 0 and not self.timed_out


class PendingClaim(BaseModel):
    """A completion claim made while the goal was paused: kept, and decided when it is resumed."""

    model_config = ConfigDict(frozen=True)

    summary: str
    evidence: str


class OpenQuestion(BaseModel):
    """The question a waiting goal waits on, as the goal row keeps it: its id (the row in
    ``goal_questions`` holds the rest), its deadline (the engine's timer) and whether it has a default."""

    model_config = ConfigDict(frozen=True)

    id: str
    deadline: datetime
    has_default: bool = False
    #: When it was asked, and how many reminders of it were sent (the engine's ``question_reminders``).
    asked_at: datetime | None = None
    reminders: int = 0


class GoalMemory(BaseModel):
    """What the engine carries between rounds (one JSON column)."""

    model_config = ConfigDict(frozen=True)

    notes: list[str] = []
    fingerprint: str | None = None
    seen_calls: list[str] = []
    verify_fingerprint: str | None = None
    verify_results: list[VerifyResult] = []
    verify_output: str | None = None
    last_error: str | None = None
    warned_stall: bool = False
    #: A digest of the ``progress`` command's last output (exit code included).
    progress: str | None = None
    #: A claim of an interval the goal spent paused, to be verified at the first idle after resume.
    pending_claim: PendingClaim | None = None
    #: The question the goal waits on (status ``waiting``): its row is in ``goal_questions``.
    question: OpenQuestion | None = None
    #: Calls the operator approved for this goal (``approve for this goal``), each as what it was
    #: approved for (:attr:`agent.tools.policy.Ask.key`): they run without asking again until revoked.
    approvals: list[str] = []
    #: Calls approved once (``approve once``): the next such call runs, and the approval is used up.
    approved_once: list[str] = []
    #: The words of the event behind the goal's current status or wait (an authentication error's
    #: text, the spend guard's refusal, the error a backoff waits out), written with that status or
    #: wait and cleared when the goal moves on: what :func:`goals.why.why` explains it with.
    cause: str | None = None


class Goal(GoalSpec):
    """A goal row: every field of its :class:`GoalSpec` (derived, never repeated) and what the
    engine keeps of it. The ``goals`` columns are these fields (:mod:`goals.rows`), the protocol's
    goal view is their wire form (:func:`daemon.rpc.views.goal_view`)."""

    id: GoalId
    #: The spec's title, or the objective's first line.
    title: str
    status: GoalStatus
    status_reason: str | None = None
    #: The spec's session, or the one made for the goal.
    session_id: str
    guard_id: str
    rounds: int = 0
    tokens: int = 0
    cost: float = 0.0
    refused_claims: int = 0
    stall_streak: int = 0
    error_streak: int = 0
    blocked_streak: int = 0
    #: Intervals in a row that ended on the infrastructure's trouble (:attr:`StopRules.infra_retries`
    #: bounds them); a counted round ends the streak.
    infra_streak: int = 0
    #: Rounds re-run for the infrastructure's trouble, never counted in :attr:`rounds`.
    infra_rounds: int = 0
    #: Tokens charged in full for calls a crash or a stop left without an outcome (they may have
    #: been billed): part of :attr:`tokens`, shown apart.
    interrupted_tokens: int = 0
    wall_used: float = 0.0
    active_since: datetime | None = None
    continuation_id: str | None = None
    continuation_round: int | None = None
    evaluated_seq: int = 0
    not_before: datetime | None = None
    memory: GoalMemory = GoalMemory()
    result_summary: str | None = None
    evidence: str | None = None
    #: With ``repo``: the commit the goal's branch started from (what ``goald goal diff`` and a
    #: replay start from).
    base_commit: str | None = None
    created_at: datetime
    updated_at: datetime
    revision: int = 1

    # A stored goal was checked when it was created or edited: reading it back checks nothing again
    # (these replace the spec's input checks of the same names).
    @field_validator("tools")
    @classmethod
    def _tools(cls, value: list[str] | None) -> list[str] | None:
        return value

    @field_validator("objective")
    @classmethod
    def _objective(cls, value: str) -> str:
        return value

    @model_validator(mode="after")
    def _title(self) -> Goal:
        return self

    def public(self) -> dict[str, Any]:
        """The goal as the control protocol shows it (camelCase-free, JSON-ready)."""
        return self.model_dump(mode="json")
