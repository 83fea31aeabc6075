"""Messages: content blocks, sources, deliveries and the inbox fate lifecycle.

Persisted and wire data are pydantic models with ``Literal`` discriminators. An input message is
identified by its :class:`~agent.ids.MessageId` before it is enqueued; the inbox records its
identity, delivery, source and exactly one fate, and nothing else is attributed to it.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal, assert_never

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from agent.errors import InvalidInput, InvalidTransition
from agent.ids import MessageId

#: Largest accepted input message, in bytes of its JSON form.
MAX_MESSAGE_BYTES = 1024 * 1024


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TextBlock(_Frozen):
    """Plain text."""

    type: Literal["text"] = "text"
    text: str


class ToolUseBlock(_Frozen):
    """The model asks for a tool call."""

    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(_Frozen):
    """The result of one tool call, matched to its :class:`ToolUseBlock` by ``tool_use_id``."""

    type: Literal["tool_result"] = "tool_result"
    tool_use_id: str
    content: str
    is_error: bool = False


Block = Annotated[TextBlock | ToolUseBlock | ToolResultBlock, Field(discriminator="type")]
Content = list[Block]
_content_adapter: TypeAdapter[list[Block]] = TypeAdapter(list[Block])


class Delivery(enum.StrEnum):
    """How a queued message enters the conversation."""

    #: Wakes the agent; opens the next turn (or waits for the running one to end).
    FOLLOWUP = "followup"
    #: Joins the running turn at its next model step; wakes an idle agent.
    STEER = "steer"
    #: Injected context: admitted with the next model step, never wakes the agent.
    CONTEXT = "context"

    @property
    def wakes(self) -> bool:
        """Whether a queued message of this delivery keeps the agent from being idle."""
        return self is not Delivery.CONTEXT


class SourceKind(enum.StrEnum):
    """Who put a message in the inbox."""

    USER = "user"
    GOAL = "goal"
    SCHEDULE = "schedule"
    SUBAGENT = "subagent"
    SYSTEM = "system"


class Source(_Frozen):
    """Where a message came from, with an optional reference (a goal id and round, ...)."""

    kind: SourceKind = SourceKind.USER
    ref: str | None = None
    #: The user and process that sent it through the daemon's control socket (``SO_PEERCRED``);
    #: recorded in the ``message/queued`` event only (absent from older events and other sources).
    uid: int | None = None
    pid: int | None = None
    #: The name of the status page's token it was sent with (``daemon.web``), where uid/pid are the socket's.
    web: str | None = None


class Fate(enum.StrEnum):
    """The inbox lifecycle of one message. Every message ends exactly once."""

    #: Durable and waiting for a turn.
    QUEUED = "queued"
    #: Taken into the conversation by a turn (recorded with that turn's id).
    ADMITTED = "admitted"
    #: Removed before any turn took it, with a reason.
    CANCELLED = "cancelled"


def transition_fate(current: Fate, target: Fate) -> Fate:
    """Perform one inbox fate transition, or raise :class:`InvalidTransition`.

    Only ``queued`` may move, and only to ``admitted`` or ``cancelled``.
    """
    match current:
        case Fate.QUEUED:
            if target in (Fate.ADMITTED, Fate.CANCELLED):
                return target
            raise InvalidTransition(f"a queued message cannot become {target}")
        case Fate.ADMITTED:
            raise InvalidTransition(f"message was already admitted; it cannot become {target}")
        case Fate.CANCELLED:
            raise InvalidTransition(f"message was already cancelled; it cannot become {target}")
        case _:
            assert_never(current)


class CancelReason(enum.StrEnum):
    """Well-known reasons a queued message is cancelled (others may be given as free text)."""

    SUPERSEDED = "superseded"
    CANCELLED = "cancelled"
    DISCARDED = "discarded"


class InboxMessage(_Frozen):
    """One durable inbox row."""

    id: MessageId
    session_id: str
    delivery: Delivery
    source: Source
    content: Content
    pending_key: str | None = None
    yields_to_followup: bool = False
    fate: Fate = Fate.QUEUED
    turn_id: str | None = None
    cancel_reason: str | None = None
    created_at: str


def parse_content(value: object) -> Content:
    """Validate input content: a non-empty string or a non-empty list of text blocks.

    Raises:
        InvalidInput: saying what is wrong (empty, oversized, wrong block kind, bad shape).
    """
    if isinstance(value, str):
        blocks: Content = [TextBlock(text=value)]
    else:
        try:
            blocks = _content_adapter.validate_python(value)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise InvalidInput(f"invalid content at {where or 'content'}: {first['msg']}") from None
    if not blocks:
        raise InvalidInput("invalid content: a message needs at least one block")
    for block in blocks:
        if not isinstance(block, TextBlock):
            raise InvalidInput(f"invalid content: input messages carry text blocks only, not {block.type}")
    if not any(b.text.strip() for b in blocks if isinstance(b, TextBlock)):
        raise InvalidInput("invalid content: the message text is empty")
    size = len(content_json(blocks).encode())
    if size > MAX_MESSAGE_BYTES:
        raise InvalidInput(f"invalid content: message is {size} bytes, over the limit of {MAX_MESSAGE_BYTES}")
    return blocks


def parse_delivery(value: object) -> Delivery:
    """Validate a delivery mode name."""
    try:
        if not isinstance(value, str):
            raise ValueError
        return Delivery(value)
    except ValueError:
        allowed = ", ".join(d.value for d in Delivery)
        raise InvalidInput(f"unknown delivery {value!r}: expected one of {allowed}") from None


def content_json(content: Content) -> str:
    """Serialize content blocks to compact JSON."""
    return _content_adapter.dump_json(content).decode()


def content_from_json(raw: str | bytes) -> Content:
    """Parse content blocks stored by :func:`content_json`."""
    return _content_adapter.validate_json(raw)


def content_from_python(raw: object) -> Content:
    """Validate content blocks already decoded from JSON."""
    return _content_adapter.validate_python(raw)


def content_text(content: Content) -> str:
    """The concatenated text of the text blocks."""
    return "".join(b.text for b in content if isinstance(b, TextBlock))
