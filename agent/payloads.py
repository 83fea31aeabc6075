"""Typed event payloads: one pydantic model per event kind, discriminated by a ``Literal`` type.

An :class:`~agent.events.Event` stores its payload as the plain JSON object it was written with
(``data``), and that object is what the store and the socket carry: the wire format is the
stored one, keys in camelCase. The models here are a typed *read view* of it. Each one names
its kind in a ``type`` field whose ``Literal`` default is the event type (the stored object
does not repeat it), and maps the stored camelCase keys to snake_case attributes by alias.

Why a view and not the stored form: the driver writes several events per model step and must
not pay a validation for each; :attr:`Event.payload <agent.events.Event.payload>` parses on first
access and caches. Parsing is lenient where history is: unknown keys are ignored (a newer writer
may add some), and an event whose kind is not registered, or whose stored object does not fit its
model (a row written by an older version), reads as :class:`OtherPayload` carrying the raw
object, so old rows always load.

Other packages add kinds under their own prefix (``goal/``, ``schedule/``) with
:func:`register_payloads`; ``agent`` knows nothing of them.

:class:`AgentStatus` and :class:`EndReason` live here because they are the values of the
``status`` and ``turn/end`` payloads; the driver and the turn code import them from here, so
"idle" is spelled once.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal

from loguru import logger
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from agent.messages import Content, Delivery, Source, content_text
from agent.spend import Usage


class AgentStatus(enum.StrEnum):
    """Whole-agent status, the value of a ``status`` event."""

    #: No turn running and no waking message queued.
    IDLE = "idle"
    #: A turn is running, or a waking message is queued for the next one.
    RUNNING = "running"


class EndReason(enum.StrEnum):
    """Why a turn ended."""

    #: The model finished its answer (including a provider refusal, noted as ``modelFinish``).
    END_TURN = "end_turn"
    #: The model hit its output limit.
    MAX_TOKENS = "max_tokens"
    #: The turn used its allowed number of model steps.
    MAX_STEPS = "max_steps"
    #: The spend guard refused the next model call; it was not made.
    BUDGET = "budget"
    #: The model or the runtime failed (after retries).
    ERROR = "error"
    #: ``interrupt()`` ended the turn.
    CANCELLED = "cancelled"
    #: The process died or shut down mid-turn.
    INTERRUPTED = "interrupted"


class Payload(BaseModel):
    """Base of the typed payloads: stored camelCase keys read as snake_case attributes."""

    # Built on first use, not at import (the daemon's start-up imports every kind; payloads are
    # parsed lazily, and a kind no event of this run carries is never built).
    model_config = ConfigDict(
        frozen=True, alias_generator=to_camel, populate_by_name=True, extra="ignore", defer_build=True
    )

    type: str


class OtherPayload(Payload):
    """An event of a kind no package registered, or whose stored object does not fit its model."""

    data: dict[str, Any] = Field(default_factory=dict)


# -- the runtime's kinds -------------------------------------------------------------------------


class MessageQueued(Payload):
    """``message/queued``: a message is durable in the inbox (its receipt)."""

    type: Literal["message/queued"] = "message/queued"
    message_id: str
    delivery: Delivery = Delivery.FOLLOWUP
    source: Source = Source()
    pending_key: str | None = None


class MessageAdmitted(Payload):
    """``message/admitted``: a turn took the message into the conversation."""

    type: Literal["message/admitted"] = "message/admitted"
    message_id: str
    turn_id: str
    delivery: Delivery = Delivery.FOLLOWUP
    source: Source = Source()
    content: Content = Field(default_factory=list)

    @property
    def text(self) -> str:
        """The text of the message's text blocks, joined."""
        return content_text(self.content)


class MessageCancelled(Payload):
    """``message/cancelled``: the message left the inbox without a turn, with a reason."""

    type: Literal["message/cancelled"] = "message/cancelled"
    message_id: str
    reason: str | None = None
    #: The follow-up that superseded it, if that is why.
    by: str | None = None


class TurnStarted(Payload):
    """``turn/start``."""

    type: Literal["turn/start"] = "turn/start"
    turn_id: str
    #: The node that runs the turn, where several share one database (PostgreSQL); else absent.
    node: str | None = None


class TurnEnded(Payload):
    """``turn/end``: how a turn ended."""

    type: Literal["turn/end"] = "turn/end"
    turn_id: str
    reason: EndReason
    steps: int = 0
    error: str | None = None
    error_kind: str | None = None
    model_finish: str | None = None


class AssistantMessage(Payload):
    """``assistant/message``: a committed model answer (or, ``interrupted``, the text streamed so far)."""

    type: Literal["assistant/message"] = "assistant/message"
    turn_id: str | None = None
    content: Content = Field(default_factory=list)
    finish_reason: str | None = None
    model: str | None = None
    #: What the provider reported (absent for interrupted partial text).
    usage: Usage | None = None
    cost: float = 0.0
    interrupted: bool = False

    @property
    def text(self) -> str:
        """The text of the answer's text blocks, joined."""
        return content_text(self.content)


class ToolResult(Payload):
    """``tool/result``."""

    type: Literal["tool/result"] = "tool/result"
    turn_id: str | None = None
    tool_use_id: str
    name: str | None = None
    content: str = ""
    is_error: bool = False


class ToolDenied(Payload):
    """``tool/denied``: the tool policy refused a call (written with its ``tool/result``)."""

    type: Literal["tool/denied"] = "tool/denied"
    turn_id: str | None = None
    tool_use_id: str
    name: str | None = None
    reason: str | None = None


class ModelFailed(Payload):
    """``model/error``: one failed model attempt."""

    type: Literal["model/error"] = "model/error"
    turn_id: str | None = None
    attempt: int = 0
    kind: str | None = None
    message: str = ""
    retrying: bool = False
    breaker_open: bool = False
    discarded_chars: int = 0
    usage: Usage | None = None
    cost: float = 0.0
    #: ``usage`` is the prompt's estimate: the answer had started, but no usage was reported
    #: (:func:`agent.calls.failed_usage`).
    estimated: bool = False


class ModelCharged(Payload):
    """``model/charged``: spend recorded without a per-call breakdown.

    Without ``subagent_session_id``: reservations charged in full because a call's outcome is
    unknown. With it: the whole spend of a settled subagent, charged to its parent.
    """

    type: Literal["model/charged"] = "model/charged"
    turn_id: str | None = None
    call_ids: list[str] = Field(default_factory=list)
    tokens: int = 0
    cost: float = 0.0
    subagent_session_id: str | None = None
    reason: str | None = None


class StatusChanged(Payload):
    """``status``: a whole-agent status transition."""

    type: Literal["status"] = "status"
    status: AgentStatus


class SessionCreated(Payload):
    """``session/created``."""

    type: Literal["session/created"] = "session/created"
    model: str | None = None
    workdir: str | None = None
    depth: int = 0
    parent_session_id: str | None = None


class ContextCompacted(Payload):
    """``context/compacted``: the model's view of the session changed (see :mod:`agent.context`).

    The event log is never rewritten: this event says how the view is built from it. History events
    with ``seq <= through_seq`` are replaced by ``summary`` (when there is one), the older steps of a
    turn that outgrew the window by a note (``steps_*``); results of the tool
    calls in ``elided`` keep only ``elide_keep`` characters of their head and of their tail. The latest
    such event alone defines the view (each carries forward what still applies of the one before).
    """

    type: Literal["context/compacted"] = "context/compacted"
    turn_id: str | None = None
    #: How the view was made smaller: a model's ``summary``, or the fallbacks ``elided`` (large tool
    #: results cut) and ``dropped`` (oldest turns left out, after eliding).
    mode: Literal["summary", "elided", "dropped"] = "summary"
    through_seq: int = 0
    summary: str | None = None
    elided: list[str] = Field(default_factory=list)
    elide_keep: int = 0
    #: Messages the summary (or the drop) replaced in this compaction.
    messages: int = 0
    #: Steps of a turn that outgrew the window, left out: history events with ``steps_from_seq < seq
    #: <= steps_through_seq`` (after the user message at ``steps_from_seq``, which stays verbatim) are
    #: replaced by ONE note counting ``steps_dropped`` messages (0 and 0: none left out).
    steps_from_seq: int = 0
    steps_through_seq: int = 0
    steps_dropped: int = 0
    #: Estimated prompt tokens before and after.
    tokens_before: int = 0
    tokens_after: int = 0
    #: The summary call (absent for the fallbacks): its model, ``model_calls`` id, usage and cost.
    model: str | None = None
    call_id: str | None = None
    usage: Usage | None = None
    cost: float = 0.0


class SandboxNetwork(Payload):
    """``sandbox/network``: a sandboxed command asked the daemon's network proxy for a connection
    (its network is an allow list, :mod:`agent.sandbox.proxy`), and what became of it; or, with
    ``omitted``, how many more attempts of one command were counted but not recorded one by one."""

    type: Literal["sandbox/network"] = "sandbox/network"
    host: str = ""
    port: int = 0
    #: ``CONNECT`` (HTTPS and other tunnels) or the plain HTTP request's method.
    method: str = ""
    #: Whether the proxy connected it.
    allowed: bool = False
    #: Why not: refused (not in the allow list, no public address) or failed (cannot resolve, connect).
    reason: str | None = None
    #: The address connected to, or the one refused.
    address: str | None = None
    omitted: int = 0
    #: The shell call (its ``tool/result``'s ``toolUseId``) and turn that made it, when it came from one.
    tool_use_id: str | None = None
    turn_id: str | None = None
    #: The goal whose verification or progress command made it, when it came from one.
    goal_id: str | None = None


#: The runtime's payloads, discriminated by their ``type``.
RuntimePayload = Annotated[
    MessageQueued
    | MessageAdmitted
    | MessageCancelled
    | TurnStarted
    | TurnEnded
    | AssistantMessage
    | ToolResult
    | ToolDenied
    | ModelFailed
    | ModelCharged
    | StatusChanged
    | SessionCreated
    | ContextCompacted
    | SandboxNetwork,
    Field(discriminator="type"),
]

_REGISTRY: dict[str, type[Payload]] = {}


def kind_of(model: type[Payload]) -> str:
    """The event type a payload model reads (its ``type`` field's ``Literal`` default)."""
    default = model.model_fields["type"].default
    if not isinstance(default, str) or not default:
        raise TypeError(f"{model.__name__} has no Literal event type as the default of its `type` field")
    return default


def register_payloads(*models: type[Payload]) -> None:
    """Make ``models`` the typed view of their event kinds (idempotent; a kind has one model)."""
    for model in models:
        kind = kind_of(model)
        known = _REGISTRY.get(kind)
        if known is not None and known is not model:
            raise ValueError(f"event type {kind!r} already reads as {known.__name__}, not {model.__name__}")
        _REGISTRY[kind] = model


def registered_kinds() -> frozenset[str]:
    """Every event type with a registered payload model."""
    return frozenset(_REGISTRY)


def parse_payload(kind: str, data: dict[str, Any]) -> Payload:
    """The typed view of an event's stored object; :class:`OtherPayload` when it has none."""
    model = _REGISTRY.get(kind)
    if model is None:
        return OtherPayload(type=kind, data=data)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        logger.debug("a stored {} event does not fit {}: {}", kind, model.__name__, exc)
        return OtherPayload(type=kind, data=data)


register_payloads(
    MessageQueued,
    MessageAdmitted,
    MessageCancelled,
    TurnStarted,
    TurnEnded,
    AssistantMessage,
    ToolResult,
    ToolDenied,
    ModelFailed,
    ModelCharged,
    StatusChanged,
    SessionCreated,
    ContextCompacted,
    SandboxNetwork,
)
