"""The model provider interface.

A provider turns a conversation into one committed assistant message, a finish reason and the
token usage. Failures are :class:`ModelError` with a :class:`ModelErrorKind` that tells the driver
whether to retry (rate limits, server errors, timeouts, dropped connections) and tells the goal
engine whether to pause at once (authentication). Streaming text arrives through ``on_delta`` as
ephemeral notifications; only the returned message is durable.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from agent.errors import AgentError
from agent.messages import Content
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
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.retry_after = retry_after
        self.usage = usage
        self.status = status

    @property
    def retryable(self) -> bool:
        """Whether another attempt may succeed."""
        return self.kind.retryable

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


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One model call (a runtime object: never serialized, never validated per call)."""

    system: str | None
    messages: Sequence[ConvMessage]
    tools: Sequence[ToolSpec]
    max_tokens: int
    #: Size of the prompt in bytes, as the driver counted it (for estimates; no re-serializing).
    prompt_bytes: int = 0


class ModelResponse(BaseModel):
    """The committed outcome of one successful model call."""

    model_config = ConfigDict(frozen=True)

    content: Content
    finish_reason: FinishReason
    usage: Usage


DeltaCallback = Callable[[str], None]


class Model(ABC):
    """A model provider bound to one model name."""

    provider: str = ""
    name: str = ""
    price: Price | None = None
    max_tokens: int = 4096
    context_window: int = 200_000

    @property
    def spec(self) -> str:
        """``PROVIDER:MODEL``."""
        return f"{self.provider}:{self.name}"

    @abstractmethod
    async def complete(self, request: ModelRequest, on_delta: DeltaCallback | None = None) -> ModelResponse:
        """Make one attempt. Raises :class:`ModelError` on failure."""
