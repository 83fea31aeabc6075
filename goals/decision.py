"""What the goal policy reads and what it returns: the interval's facts, the decision's inputs,
and the decision.

:class:`Interval` is what :mod:`goals.facts` reads from a session's events; :class:`PolicyInput`
adds what the engine observed of the work (:mod:`goals.measure`); :func:`goals.policy.decide` turns
one into a :class:`Decision`, which the engine commits. They are plain immutable values, kept apart
from the rules so that the readers of events and of the work directory need not import the rules.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from goals.model import Goal, VerifyResult


class ContinuationFate(enum.StrEnum):
    """What became of the goal's latest continuation within the interval."""

    #: No event of it in the interval (it was accounted for earlier, or there is none).
    NONE = "none"
    QUEUED = "queued"
    ADMITTED = "admitted"
    CANCELLED = "cancelled"


class Claim(BaseModel):
    """A ``goal_complete`` call."""

    model_config = ConfigDict(frozen=True)

    summary: str
    evidence: str


class AskedQuestion(BaseModel):
    """An ``ask_operator`` call: the question the goal asks its operator (its row is written when
    the engine decides the idle, :mod:`goals.questions`)."""

    model_config = ConfigDict(frozen=True)

    id: str
    text: str
    options: list[str] = []
    default: str | None = None
    #: How long the question may wait (``None``: the goal's ``rules.question_timeout_seconds``).
    timeout_seconds: float | None = None
    #: ``question`` (``ask_operator``) or ``approval`` (a call the tool policy asks about).
    kind: str = "question"
    #: An approval's subject: the call it approves (:attr:`agent.tools.policy.Ask.key`).
    subject: str | None = None


class Interval(BaseModel):
    """Facts of the session's events in ``(evaluated_seq, end_seq]``."""

    model_config = ConfigDict(frozen=True)

    end_seq: int
    continuation_fate: ContinuationFate = ContinuationFate.NONE
    cancel_reason: str | None = None
    tokens: int = 0
    cost: float = 0.0
    claims: list[Claim] = []
    blocked: list[str] = []
    #: ``ask_operator`` calls of the interval (the last one is asked).
    questions: list[AskedQuestion] = []
    notes: list[str] = []
    tool_calls: list[str] = []
    turns: int = 0
    last_end_reason: str | None = None
    last_error_kind: str | None = None
    last_error: str | None = None
    #: A model error of the interval came while the provider's circuit breaker was open (an outage).
    breaker_open: bool = False
    #: Model answers committed in the interval (a partial answer cut by an interruption is not one):
    #: a turn that failed before any tells the infrastructure's trouble from the model's.
    answers: int = 0
    #: Tokens charged in full for calls a crash or a stop left without an outcome (``model/charged``
    #: of the session itself, not a subagent's spend): counted in ``tokens`` too.
    interrupted_tokens: int = 0


class DecisionKind(enum.StrEnum):
    """What the engine does."""

    NOTHING = "nothing"
    BOOKKEEP = "bookkeep"
    CONTINUE = "continue"
    REISSUE = "reissue"
    WAIT = "wait"
    #: The goal asked its operator a question: it waits for the answer (status ``waiting``).
    ASK = "ask"
    COMPLETE = "complete"
    PAUSE = "pause"
    EXHAUST = "exhaust"
    FAIL = "fail"


@dataclass(frozen=True)
class PolicyInput:
    """Everything :func:`decide` may look at."""

    goal: Goal
    interval: Interval
    now: datetime
    fingerprint: str | None = None
    workdir_exists: bool = True
    verification: list[VerifyResult] | None = None
    verification_reused: bool = False
    #: A digest of the goal's ``progress`` command's output at this idle (``None``: it has none, or
    #: it was not run).
    progress: str | None = None
    #: An unrecoverable fault found by the engine (e.g. the goal's model is no longer configured).
    fault: str | None = None
    #: What the work directory holds on disk (bytes, as its walk measured them; ``None``: not
    #: measured), and the goal's disk limit (``None``: none).
    disk_bytes: int | None = None
    disk_limit: int | None = None


@dataclass(frozen=True)
class Decision:
    """The new goal state and, if any, the continuation to enqueue with it."""

    kind: DecisionKind
    goal: Goal
    continuation: str | None = None
    round: int | None = None
    notes: list[str] = field(default_factory=list)
    #: With :attr:`DecisionKind.ASK`: the question, written with the decision.
    question: AskedQuestion | None = None


__all__ = ["AskedQuestion", "Claim", "ContinuationFate", "Decision", "DecisionKind", "Interval", "PolicyInput"]
