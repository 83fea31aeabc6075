"""The goal model: status lifecycle, budgets, verification commands, and the goal row.

Every status change goes through :func:`transition`; an illegal one raises. A goal row is a
pydantic model; what the engine remembers between rounds (notes, fingerprints, seen tool calls,
the last verification) lives in :class:`GoalMemory`, stored as one JSON column.
"""

from __future__ import annotations

import enum
import posixpath
import re
from datetime import datetime
from typing import Annotated, Any, assert_never

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from agent import ToolPolicy, TypedId
from agent.sandbox.network import NetworkSetting
from agent.secret import SecretSource
from goals.errors import InvalidGoalTransition


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


#: The goal's shape is also its wire shape: camelCase on the control protocol (``maxRounds``),
#: snake_case accepted as well (a config file, a stored row, a caller in process). ``model_dump()``
#: keeps the field names (the store's JSON columns); ``model_dump(by_alias=True)`` is the wire.
WIRE = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True)


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


#: The smallest per-goal caps accepted (bwrap itself is two processes and a few MiB).
MIN_PROCESSES = 8
MIN_MEMORY_MB = 16
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Variables the sandbox sets itself; a secret may not replace them.
_SANDBOX_VARIABLES = frozenset({"PATH", "HOME", "LANG", "TMPDIR"})


def _env_named(source: SecretSource) -> SecretSource:
    """A goal's secret read from the environment names a valid variable (the config's are not checked)."""
    if source.env is not None and not _ENV_NAME.match(source.env):
        raise ValueError(f"{source.env!r} is not a valid environment variable name")
    return source


#: Where the daemon reads one secret of a goal's sandbox: never the value itself.
GoalSecret = Annotated[SecretSource, AfterValidator(_env_named)]


class SandboxSpec(BaseModel):
    """A goal's own sandbox settings (``sandbox`` in a goal spec), beside the config file's
    ``[goal_sandbox.<key>]``. How the two merge is the daemon's (see the README's goal section):
    the stricter network wins (``"off"`` over an allow list over ``"host"``; two allow lists keep
    the names both allow), the smaller of two caps wins, read-only paths and secrets are the union
    (the config's value of a secret named on both sides)."""

    model_config = WIRE

    #: The network of this goal's commands: ``"off"``, ``{"allow": [names]}`` (through the daemon's
    #: proxy) or ``"host"`` (unsafe); ``true``/``false`` are read as ``"host"``/``"off"``
    #: (``None``: the daemon's default).
    network: NetworkSetting | None = None
    #: Extra paths the goal's commands may read (a toolchain under ``/opt``, say): absolute.
    read_only_paths: list[str] = Field(default=[], max_length=64)
    #: Processes of the goal's commands all together, at once (bwrap's two of each included).
    max_processes: int | None = Field(default=None, ge=MIN_PROCESSES, le=1_000_000)
    #: Memory of the goal's commands all together, in MiB.
    max_memory_mb: int | None = Field(default=None, ge=MIN_MEMORY_MB, le=16 * 1024 * 1024)
    #: What the goal's work directory may hold on disk, in MiB (measured at each idle: over it, the
    #: goal pauses ``disk_limit``).
    max_disk_mb: int | None = Field(default=None, ge=1, le=1024 * 1024 * 1024)
    #: Secret environment variables of this goal's commands, by name: where the daemon reads each.
    secrets: dict[str, GoalSecret] = Field(default={}, max_length=64)

    @field_validator("read_only_paths")
    @classmethod
    def _paths(cls, value: list[str]) -> list[str]:
        out: list[str] = []
        for raw in value:
            if not raw.startswith("/"):
                raise ValueError(f"read-only path {raw!r} must be absolute")
            if "\0" in raw or any(part == ".." for part in raw.split("/")):
                raise ValueError(f"read-only path {raw!r} must not contain '..' or NUL")
            path = posixpath.normpath(raw)
            if path == "/":
                raise ValueError("read-only path '/' would show the whole host: name the directories needed")
            if path not in out:
                out.append(path)
        return out

    @field_validator("secrets")
    @classmethod
    def _names(cls, value: dict[str, SecretSource]) -> dict[str, SecretSource]:
        for name in value:
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not a valid environment variable name")
            if name in _SANDBOX_VARIABLES:
                raise ValueError(f"{name} is set by the sandbox itself")
        return value

    @property
    def empty(self) -> bool:
        """Whether it says nothing (the config entry, if any, and the defaults apply)."""
        return self == SandboxSpec()


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
