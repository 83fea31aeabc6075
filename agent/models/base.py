"""The model provider interface.

A provider turns a conversation into one committed assistant message, a finish reason and the
token usage. Failures are :class:`ModelError` with a :class:`ModelErrorKind` that tells the driver
whether to retry (rate limits, server errors, timeouts, dropped connections) and tells the goal
engine whether to pause at once (authentication). Streaming text arrives through ``on_delta`` as
ephemeral notifications; only the returned message is durable.
"""

from __future__ import annotations

import enum
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from loguru import logger
from pydantic import BaseModel, ConfigDict

from agent.errors import AgentError
from agent.messages import Block, Content, TextBlock, ToolResultBlock, ToolUseBlock
from agent.models.windows import StatedWindow
from agent.spend import Price, Usage


class FinishReason(enum.StrEnum):
    """Why the model stopped producing output."""

    END_TURN = "end_turn"
    TOOL_USE = "tool_use"
    MAX_TOKENS = "max_tokens"
    REFUSAL = "refusal"


class ModelErrorKind(enum.StrEnum):
    """Classes of model failure."""

    RATE_LIMIT = "rate_limit"
    SERVER = "server"
    TIMEOUT = "timeout"
    CONNECTION = "connection"
    AUTH = "auth"
    BAD_REQUEST = "bad_request"
    MALFORMED = "malformed"
    UNEXPECTED_CALL = "unexpected_call"
    #: The prompt does not fit the model's context window (a 400 ``context_length_exceeded``,
    #: "prompt is too long"). Not retried as it stands: the driver compacts the view and retries once.
    CONTEXT_LENGTH = "context_length"

    @property
    def retryable(self) -> bool:
        """Whether another attempt may succeed."""
        return self in (
            ModelErrorKind.RATE_LIMIT,
            ModelErrorKind.SERVER,
            ModelErrorKind.TIMEOUT,
            ModelErrorKind.CONNECTION,
        )


class ModelError(AgentError):
    """A failed model attempt."""

    def __init__(
        self,
        kind: ModelErrorKind,
        message: str,
        *,
        retry_after: float | None = None,
        usage: Usage | None = None,
        status: int | None = None,
        response_started: bool = False,
        stated: StatedWindow | None = None,
        empty: bool = False,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.retry_after = retry_after
        #: What the attempt reported of its usage before it failed (``None``: nothing).
        self.usage = usage
        self.status = status
        #: Whether the provider had started its answer (a successful status, a stream begun)
        #: before the attempt failed: the prompt is then likely billed even when no usage came
        #: (the driver charges its estimate). ``False`` for a refused connection or an error status.
        self.response_started = response_started
        #: What a ``context_length`` answer stated: the server's window and the size it counted.
        self.stated = stated
        #: A successful status whose stream carried nothing (no item at all): the server answered, so
        #: it is no dropped connection, and began no answer, so nothing is charged. A server that
        #: cannot fit a streamed prompt may answer so (llama-cpp-python's): the driver takes it for a
        #: probable overflow after a prompt near the window.
        self.empty = empty

    @property
    def retryable(self) -> bool:
        """Whether another attempt may succeed (the kinds that count against a provider's breaker)."""
        return self.kind.retryable

    @property
    def retried_in_turn(self) -> bool:
        """Whether the driver tries again within the turn: every retryable kind, and a malformed
        answer (a proxy's glitch mid-stream is as transient as a dropped stream, but it proves the
        provider answers, so it never counts against the breaker; one malformed the same way on
        every attempt still ends the turn ``error``)."""
        return self.kind.retryable or self.kind is ModelErrorKind.MALFORMED

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.message}"


class ConvMessage(BaseModel):
    """One message of the conversation as a model sees it."""

    model_config = ConfigDict(frozen=True)

    role: Literal["user", "assistant", "tool"]
    content: Content


class ToolSpec(BaseModel):
    """A tool as offered to the model."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str
    input_schema: dict[str, Any]


class MessageLog:
    """The messages of one conversation already taken into some form, in order.

    A conversation only grows at its end (the driver appends; a reload or a compaction starts a new
    one), so what a request adds is what lies past the log: :meth:`new_messages` finds it in
    constant time (the first and the last message taken must be the very objects the request
    carries there) and gives ``None`` when the request is not an extension, for a start over.
    Subclasses keep the form (a running size, serialized JSON fragments).
    """

    def __init__(self) -> None:
        self.messages: list[ConvMessage] = []

    def reset(self) -> None:
        """Forget everything taken (the conversation was replaced)."""
        self.messages = []

    def new_messages(self, messages: Sequence[ConvMessage]) -> Sequence[ConvMessage] | None:
        """The messages past the log, or ``None`` if ``messages`` does not extend it."""
        taken = self.messages
        k = len(taken)
        if k > len(messages) or (k and (messages[k - 1] is not taken[k - 1] or messages[0] is not taken[0])):
            return None
        return messages[k:]


_LogT = TypeVar("_LogT", bound=MessageLog)


class WireCache:
    """What a caller keeps for one conversation so a provider converts each message only once.

    The driver holds one per session and passes it with every request; a provider keeps its
    :class:`MessageLog` in it under its own key (one per wire format). Without one (a direct call)
    a request is converted in full. The counters are the work done, so a test can pin that a step
    converts only what it added, whatever the length of the history.
    """

    __slots__ = ("_logs", "converted", "serialized_bytes")

    def __init__(self) -> None:
        self._logs: dict[str, MessageLog] = {}
        #: Messages converted to some form, and bytes of JSON serialized for them, so far.
        self.converted = 0
        self.serialized_bytes = 0

    def log(self, key: str, kind: type[_LogT]) -> _LogT:
        """The log kept under ``key``, made on first use."""
        log = self._logs.get(key)
        if not isinstance(log, kind):
            log = self._logs[key] = kind()
        return log


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One model call (a runtime object: never serialized, never validated per call)."""

    system: str | None
    messages: Sequence[ConvMessage]
    tools: Sequence[ToolSpec]
    max_tokens: int
    #: Size of the prompt in bytes, as the model measured it (:meth:`Model.measure`).
    prompt_bytes: int = 0
    #: The conversation's cache of converted messages (``None``: convert the request in full).
    cache: WireCache | None = field(default=None, compare=False)
    #: What the call is for: a step of the conversation, or the summary of its older part
    #: (:mod:`agent.context`), which a scripted model may answer differently.
    purpose: Literal["turn", "summary"] = "turn"


#: Context windows of common models, in tokens, by name prefix (the longest matching prefix wins);
#: a provider's configuration overrides them. Unknown names get the provider's default.
KNOWN_WINDOWS: dict[str, int] = {
    "gpt-4.1": 1_047_576,
    "gpt-4o": 128_000,
    "gpt-4-turbo": 128_000,
    "gpt-5": 400_000,
    "o1": 200_000,
    "o3": 200_000,
    "o4-mini": 200_000,
    "claude-": 200_000,
    "deepseek-chat": 128_000,
    "deepseek-reasoner": 128_000,
    "llama3.1": 128_000,
    "llama3.2": 128_000,
    "qwen2.5": 32_768,
    "mistral": 32_768,
}


def known_window(name: str) -> int | None:
    """The context window of a common model by its name, if goald knows it."""
    best = max((p for p in KNOWN_WINDOWS if name.startswith(p)), key=len, default=None)
    return KNOWN_WINDOWS[best] if best is not None else None


def message_bytes(msg: ConvMessage) -> int:
    """A model-neutral size of one message: its text, tool inputs and results, and a little framing."""
    total = 16
    for b in msg.content:
        if isinstance(b, TextBlock):
            total += len(b.text)
        elif isinstance(b, ToolResultBlock):
            total += len(b.content)
        else:
            total += len(json.dumps(b.input)) + len(b.name) + len(b.id)
    return total


class _SizeLog(MessageLog):
    """The running neutral size of a conversation (the default :meth:`Model.measure`)."""

    def __init__(self) -> None:
        super().__init__()
        self.size = 0
        self.tools: Sequence[ToolSpec] | None = None
        self.tools_size = 0

    def reset(self) -> None:
        super().reset()
        self.size = 0


def specs_size(tools: Sequence[ToolSpec]) -> int:
    """Size of tool specs in a model-neutral JSON form."""
    return len(json.dumps([s.model_dump() for s in tools])) if tools else 2


#: How an answer cut off by the output limit records a tool call it was making: the call is
#: incomplete (its arguments may not even parse), so it is never run, and the note says so (the model
#: reads it in the next request). The head of its arguments is kept, bounded.
CUT_CALL_NOTE = (
    "[tool call {name} was cut off by the output limit (max_tokens) after {chars} characters of arguments"
    " and was not run: {head}]"
)
#: Characters of a cut call's arguments kept in its note.
CUT_CALL_HEAD = 160


def cut_call_note(name: str, arguments: str) -> str:
    """The note that records one tool call cut off by the output limit (see :data:`CUT_CALL_NOTE`)."""
    head = arguments[:CUT_CALL_HEAD] + ("..." if len(arguments) > CUT_CALL_HEAD else "")
    return CUT_CALL_NOTE.format(name=name or "(unnamed)", chars=len(arguments), head=head)


def with_cut_notes(blocks: Sequence[Block], notes: Sequence[str]) -> list[Block]:
    """``blocks`` without their tool calls, plus one text block of ``notes`` (the calls, recorded)."""
    kept: list[Block] = [b for b in blocks if not isinstance(b, ToolUseBlock)]
    if not notes:
        return kept
    lead = "\n" if any(isinstance(b, TextBlock) and b.text for b in kept) else ""
    return [*kept, TextBlock(text=lead + "\n".join(notes))]


def drop_cut_calls(blocks: Sequence[Block]) -> list[Block]:
    """An answer cut off by the output limit: its tool calls (incomplete, never run) become notes."""
    notes = [
        cut_call_note(b.name, json.dumps(b.input, ensure_ascii=False)) for b in blocks if isinstance(b, ToolUseBlock)
    ]
    return with_cut_notes(blocks, notes)


class ModelResponse(BaseModel):
    """The committed outcome of one successful model call."""

    model_config = ConfigDict(frozen=True)

    content: Content
    finish_reason: FinishReason
    usage: Usage
    #: ``usage`` is goald's estimate (the server reported none): charged, never calibrated with.
    estimated: bool = False


DeltaCallback = Callable[[str], None]


class Model(ABC):
    """A model provider bound to one model name."""

    provider: str = ""
    name: str = ""
    price: Price | None = None
    max_tokens: int = 4096
    context_window: int = 200_000
    #: Where :attr:`context_window` came from (:mod:`agent.models.windows`: ``config``, ``known model``,
    #: ``default``, ``server refusal``, ``server /props``...), for ``goald status`` and ``goal show``.
    window_source: str = "default"

    @property
    def spec(self) -> str:
        """``PROVIDER:MODEL``."""
        return f"{self.provider}:{self.name}"

    def learn_window(self, tokens: int, source: str) -> bool:
        """Take the window a server stated (its refusal, its own description): used by compaction from
        the next request on, and recorded with its source. Whether the figure changed."""
        if tokens <= 0 or (tokens == self.context_window and source == self.window_source):
            return False
        if tokens != self.context_window:
            logger.info(
                "model {}: context window {} tokens ({}), was {} ({})",
                self.spec,
                tokens,
                source,
                self.context_window,
                self.window_source,
            )
        self.context_window, self.window_source = tokens, source
        return True

    async def discover_window(self) -> None:
        """Ask the server for the model's window, where it says and the configuration did not set it
        (best effort, once; a failure is ignored). The driver calls it before each step; this default
        asks nothing."""

    def window_info(self) -> dict[str, Any]:
        """The window and where it came from, as ``goald status`` and ``goal show`` name them."""
        return {"contextWindow": self.context_window, "windowSource": self.window_source}

    @abstractmethod
    async def complete(self, request: ModelRequest, on_delta: DeltaCallback | None = None) -> ModelResponse:
        """Make one attempt. Raises :class:`ModelError` on failure."""

    def measure(self, request: ModelRequest) -> int:
        """Bytes of the prompt ``request`` makes, for the spend guard's bound, in constant work per
        new message (``request.cache`` remembers the rest). This default counts a model-neutral
        size; a provider that sends JSON counts its wire form, converting each message once, the
        conversion its :meth:`complete` then reuses."""
        cache = request.cache
        log = cache.log("size", _SizeLog) if cache is not None else _SizeLog()
        new = log.new_messages(request.messages)
        if new is None:
            log.reset()
            new = request.messages
        for msg in new:
            log.size += message_bytes(msg)
            log.messages.append(msg)
            if cache is not None:
                cache.converted += 1
        if log.tools is not request.tools:
            log.tools, log.tools_size = request.tools, specs_size(request.tools)
        return log.size + len(request.system or "") + log.tools_size
