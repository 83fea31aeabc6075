"""The scripted model: deterministic replies for tests, demos and benchmarks.

A :class:`ScriptedModel` answers from a list of :class:`Reply` objects, in order, or from a
function of the request. It records every call, fails the call (and remembers it) when a call
comes that the script did not expect, and :meth:`ScriptedModel.assert_done` fails when a reply was
left unconsumed. It can simulate usage, ``max_tokens`` finishes, refusals, errors, latency and
streamed text.

It counts a prompt's tokens as its measured bytes / 4 (:meth:`Model.measure`, the model-neutral
size), reports that as the input usage, and enforces its ``context_window`` as a provider does: a
prompt over it is refused with a ``context_length`` error (before any reply is consumed).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import math
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.messages import Block, TextBlock, ToolUseBlock
from agent.models.base import (
    DeltaCallback,
    FinishReason,
    Model,
    ModelError,
    ModelErrorKind,
    ModelRequest,
    ModelResponse,
)
from agent.spend import Price, Usage


@dataclass
class ToolCall:
    """A tool call the scripted model asks for."""

    name: str
    args: dict[str, Any] = field(default_factory=dict)
    id: str | None = None


@dataclass
class Reply:
    """One scripted answer (or failure)."""

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish: FinishReason | None = None
    usage: Usage | None = None
    error: ModelError | None = None
    delay: float = 0.0
    chunks: int = 1
    chunk_delay: float = 0.0

    @classmethod
    def say(cls, text: str, **kw: Any) -> Reply:
        """A plain text answer."""
        return cls(text=text, **kw)

    @classmethod
    def call(cls, name: str, text: str = "", **args: Any) -> Reply:
        """An answer that asks for one tool call."""
        return cls(text=text, tool_calls=[ToolCall(name, args)])

    @classmethod
    def fail(cls, kind: ModelErrorKind, message: str = "scripted failure", **kw: Any) -> Reply:
        """A failed attempt."""
        return cls(error=ModelError(kind, message, **kw))


Rule = Callable[[ModelRequest], "Reply | Awaitable[Reply]"]


@dataclass
class ScriptedCall:
    """What the scripted model saw in one call."""

    request: ModelRequest

    @property
    def last_text(self) -> str:
        """Text of the last message of the prompt."""
        if not self.request.messages:
            return ""
        return "".join(b.text for b in self.request.messages[-1].content if isinstance(b, TextBlock))


class ScriptedModel(Model):
    """A deterministic model. See the module docstring."""

    provider = "scripted"

    def __init__(
        self,
        replies: Sequence[Reply] | Rule,
        *,
        name: str = "test",
        price: Price | None = None,
        max_tokens: int = 1024,
        record: bool = True,
        context_window: int = 200_000,
    ) -> None:
        self.name = name
        self.price = price
        self.max_tokens = max_tokens
        self.context_window = context_window
        self._rule: Rule | None = None
        self._replies: list[Reply] = []
        if callable(replies):
            self._rule = replies
        else:
            self._replies = list(replies)
        self._next = 0
        self._record = record
        self.calls: list[ScriptedCall] = []
        self.call_count = 0
        self.unexpected: list[ModelRequest] = []

    @property
    def remaining(self) -> int:
        """Replies not yet consumed."""
        return len(self._replies) - self._next

    def assert_done(self) -> None:
        """Fail if a call was unexpected or a reply was left unconsumed."""
        if self.unexpected:
            raise AssertionError(f"{len(self.unexpected)} unexpected call(s) to the scripted model")
        if self._rule is None and self.remaining:
            raise AssertionError(f"{self.remaining} scripted repl(y/ies) were never consumed")

    def add(self, *replies: Reply) -> None:
        """Append replies to the script."""
        self._replies.extend(replies)

    async def _reply_for(self, request: ModelRequest) -> Reply:
        if self._rule is not None:
            produced = self._rule(request)
            if inspect.isawaitable(produced):
                produced = await produced
            assert isinstance(produced, Reply)
            return produced
        if self._next >= len(self._replies):
            self.unexpected.append(request)
            raise ModelError(ModelErrorKind.UNEXPECTED_CALL, "the scripted model has no reply left for this call")
        reply = self._replies[self._next]
        self._next += 1
        return reply

    async def complete(self, request: ModelRequest, on_delta: DeltaCallback | None = None) -> ModelResponse:
        """Answer from the script."""
        self.call_count += 1
        if self._record:
            self.calls.append(ScriptedCall(request))
        prompt_tokens = self.prompt_tokens(request)
        if prompt_tokens > self.context_window:
            raise ModelError(
                ModelErrorKind.CONTEXT_LENGTH,
                f"prompt is too long: {prompt_tokens} tokens > {self.context_window} maximum",
                status=400,
            )
        reply = await self._reply_for(request)
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.error is not None:
            raise reply.error
        if reply.text and on_delta is not None:
            n = max(1, reply.chunks)
            step = math.ceil(len(reply.text) / n)
            for i in range(0, len(reply.text), step):
                on_delta(reply.text[i : i + step])
                if reply.chunk_delay:
                    await asyncio.sleep(reply.chunk_delay)
        content: list[Block] = []
        if reply.text:
            content.append(TextBlock(text=reply.text))
        for call in reply.tool_calls:
            content.append(
                ToolUseBlock(id=call.id or f"call_{uuid.uuid4().hex[:16]}", name=call.name, input=dict(call.args))
            )
        finish = reply.finish or (FinishReason.TOOL_USE if reply.tool_calls else FinishReason.END_TURN)
        usage = reply.usage
        if usage is None:
            out_bytes = len(reply.text) + sum(len(json.dumps(c.args)) + len(c.name) for c in reply.tool_calls)
            usage = Usage(input_tokens=max(1, prompt_tokens), output_tokens=max(1, out_bytes // 4))
        return ModelResponse(content=content, finish_reason=finish, usage=usage)

    def prompt_tokens(self, request: ModelRequest) -> int:
        """The prompt's tokens by this model's rule: measured bytes / 4 (as the driver measured them)."""
        return (request.prompt_bytes or self.measure(dataclasses.replace(request, cache=None))) // 4
