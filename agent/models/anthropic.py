"""The Anthropic provider: the Messages API through the official ``anthropic`` SDK.

The same decisions as :mod:`agent.models.openai` (the shared part is :mod:`agent.models._http`):
the SDK never retries (the driver does, and records every attempt), every call streams, failures
are classified precisely and never carry the API key, and the SDK is imported when a provider is
built, never at ``import agent``.

Wire specifics:

* The system prompt is a separate parameter. Tool calls are ``tool_use`` blocks of the assistant
  message; tool results are ``tool_result`` blocks of a user message, so consecutive tool results
  (and a user message right after them) are merged into one user message. Empty text blocks,
  which the API refuses, are left out.
* The stream is a sequence of events: ``message_start`` (input and cache usage),
  ``content_block_start`` / ``content_block_delta`` (``text_delta``, ``input_json_delta``) /
  ``content_block_stop``, ``message_delta`` (the stop reason and cumulative usage) and
  ``message_stop``. A stream that ends before ``message_stop`` is a dropped connection (a failed
  attempt that still reports the usage seen so far), never a short answer.
* An ``error`` event inside a 200 stream (``overloaded_error``, ...) is classified by its type.
* The stream is read as raw server-sent events (see :mod:`agent.models._http`), with the SDK's
  rules: events without a name and ``ping`` are skipped; each event's JSON is checked where it is
  read.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, cast

from loguru import logger

from agent.messages import TextBlock, ToolUseBlock
from agent.models._http import (
    SKIP,
    StreamErrorItem,
    StreamingHTTPModel,
    answer_started,
)
from agent.models.anthropic_stream import Assembly
from agent.models.base import (
    ConvMessage,
    DeltaCallback,
    FinishReason,
    ModelError,
    ModelErrorKind,
    ModelRequest,
    ModelResponse,
    ToolSpec,
)
from agent.models.body import JSONLog, dump_json
from agent.spend import Price, Usage

if TYPE_CHECKING:
    import httpx2
    from anthropic import AsyncAnthropic
    from anthropic.types import (
        MessageParam,
        TextBlockParam,
        ToolParam,
        ToolResultBlockParam,
        ToolUseBlockParam,
    )

    ContentParam = TextBlockParam | ToolUseBlockParam | ToolResultBlockParam

#: ``stop_reason`` -> goald's finish reason.
STOP_REASONS: dict[str, FinishReason] = {
    "end_turn": FinishReason.END_TURN,
    "stop_sequence": FinishReason.END_TURN,
    "pause_turn": FinishReason.END_TURN,
    "tool_use": FinishReason.TOOL_USE,
    "max_tokens": FinishReason.MAX_TOKENS,
    "model_context_window_exceeded": FinishReason.MAX_TOKENS,
    "refusal": FinishReason.REFUSAL,
}

#: ``error.type`` of an error event inside a stream -> error kind.
STREAM_ERROR_KINDS: dict[str, ModelErrorKind] = {
    "overloaded_error": ModelErrorKind.SERVER,
    "api_error": ModelErrorKind.SERVER,
    "timeout_error": ModelErrorKind.TIMEOUT,
    "rate_limit_error": ModelErrorKind.RATE_LIMIT,
    "authentication_error": ModelErrorKind.AUTH,
    "permission_error": ModelErrorKind.AUTH,
    "invalid_request_error": ModelErrorKind.BAD_REQUEST,
    "request_too_large": ModelErrorKind.BAD_REQUEST,
    "not_found_error": ModelErrorKind.BAD_REQUEST,
}


def to_messages(messages: list[ConvMessage] | tuple[ConvMessage, ...]) -> list[MessageParam]:
    """goald's conversation as Messages API messages (the system prompt goes separately).

    Tool results become ``tool_result`` blocks of a user message; consecutive messages of the same
    role are merged, so tool results and the user text after them form one user message.
    """
    out: list[MessageParam] = []
    role_of_last: str | None = None
    blocks_of_last: list[ContentParam] = []
    for msg in messages:
        role, blocks = blocks_of(msg)
        if not blocks:
            continue  # an empty message (an assistant answer of no text) adds nothing the API accepts
        if role == role_of_last:
            blocks_of_last.extend(blocks)
            continue
        blocks_of_last = blocks
        role_of_last = role
        if role == "assistant":
            out.append({"role": "assistant", "content": blocks})
        else:
            out.append({"role": "user", "content": blocks})
    return out


def blocks_of(msg: ConvMessage) -> tuple[str, list[ContentParam]]:
    """The wire role of one of goald's messages and its content blocks (empty text left out)."""
    role = "assistant" if msg.role == "assistant" else "user"
    blocks: list[ContentParam] = []
    for b in msg.content:
        if isinstance(b, TextBlock):
            if b.text:
                blocks.append({"type": "text", "text": b.text})
        elif isinstance(b, ToolUseBlock):
            if role == "assistant":
                blocks.append({"type": "tool_use", "id": b.id, "name": b.name, "input": dict(b.input)})
        else:
            result: ToolResultBlockParam = {
                "type": "tool_result",
                "tool_use_id": b.tool_use_id,
                "content": b.content,
            }
            if b.is_error:
                result["is_error"] = True
            blocks.append(result)
    return role, blocks


#: Where a conversation's Messages API form is kept in its :class:`~agent.models.base.WireCache`.
WIRE_KEY = "anthropic.messages"


def _take(request: ModelRequest) -> JSONLog:
    """The request's conversation serialized: what the cache holds, plus each new message, once.

    The last wire message stays open (see :class:`JSONLog`): the next message may be merged into it.
    """
    cache = request.cache
    log = cache.log(WIRE_KEY, JSONLog) if cache is not None else JSONLog()
    new = log.new_messages(request.messages)
    if new is None:
        log.reset()
        new = request.messages
    for msg in new:
        role, blocks = blocks_of(msg)
        log.messages.append(msg)
        if cache is not None:
            cache.converted += 1
        if not blocks:
            continue
        items = [dump_json(b) for b in blocks]
        if cache is not None:
            cache.serialized_bytes += sum(len(i) for i in items)
        if role == log.open_role:
            log.open_items.extend(items)
            continue
        if log.open_role is not None:
            log.add_item(b'{"role":"%s","content":[%s]}' % (log.open_role.encode(), b",".join(log.open_items)))
        log.open_role, log.open_items = role, items
    if log.tools is not request.tools:
        log.tools = request.tools
        log.tools_json = dump_json(to_tools(tuple(request.tools))) if request.tools else b""
    if log.system is not request.system:
        log.system = request.system
        log.system_json = dump_json(request.system) if request.system else b""
    return log


def to_tools(tools: list[ToolSpec] | tuple[ToolSpec, ...]) -> list[ToolParam]:
    """goald's tool specs as Messages API tools."""
    return [{"name": t.name, "description": t.description, "input_schema": dict(t.input_schema)} for t in tools]


class AnthropicModel(StreamingHTTPModel["AsyncAnthropic"]):
    """A model behind the Anthropic Messages API. See the module docstring."""

    provider = "anthropic"
    _default_host = "api.anthropic.com"

    def __init__(
        self,
        name: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 120.0,
        max_tokens: int = 4096,
        context_window: int | None = None,
        price: Price | None = None,
        provider: str = "anthropic",
        window_source: str | None = None,
    ) -> None:
        """Build a provider; no connection is made before the first call.

        Args:
            name: the model name (``claude-sonnet-4-5``, ...).
            base_url: the API's URL; ``None`` is Anthropic itself.
            api_key: the key (the daemon reads it from the environment or a credential).
            timeout: seconds the HTTP client waits for the connection and for each read.
            max_tokens: default output limit of a call (a session may set its own).
            context_window: the model's context size, in tokens; ``None`` (not configured): the size
                goald knows for the model's name, else 200,000, until the server states its
                own (asked at first use where it says, or read from a refusal).
            window_source: where a given ``context_window`` came from (default ``config``).
            price: prices per million tokens, for cost accounting.
            provider: the provider's name in model specs (``PROVIDER:MODEL``).
        """
        import anthropic  # noqa: F401  (lazily, and here so a missing SDK fails when the model is built)

        super().__init__(
            name,
            provider=provider,
            base_url=base_url,
            api_key=api_key,
            timeout=timeout,
            max_tokens=max_tokens,
            context_window=context_window,
            price=price,
            default_window=200_000,
            window_source=window_source,
        )

    def _make_client(self) -> AsyncAnthropic:
        # An explicit key (even an empty one) keeps the SDK from looking for credentials in the
        # environment or on disk.
        import anthropic

        return anthropic.AsyncAnthropic(
            api_key=self._api_key or "no-key", base_url=self.base_url, max_retries=0, timeout=self.timeout
        )

    def measure(self, request: ModelRequest) -> int:
        """Bytes of the request body; converts each message the conversation added, once."""
        return sum(len(p) for p in self._body_pieces(request, _take(request)))

    def _body_pieces(self, request: ModelRequest, log: JSONLog) -> list[bytes | bytearray]:
        # The keys in the order the SDK's ``create`` sends them.
        pieces: list[bytes | bytearray] = [b'{"max_tokens":%d,"messages":[' % request.max_tokens, *log.items_pieces()]
        pieces.append(b'],"model":%s,"stream":true' % dump_json(self.name))
        if log.system_json:
            pieces.append(b',"system":')
            pieces.append(log.system_json)
        if log.tools_json:
            pieces.append(b',"tools":')
            pieces.append(log.tools_json)
        pieces.append(b"}")
        return pieces

    async def complete(self, request: ModelRequest, on_delta: DeltaCallback | None = None) -> ModelResponse:
        """Stream one message. Raises :class:`ModelError` classified as the module docstring says."""
        import anthropic
        import httpx2

        client = self._sdk()
        body = b"".join(self._body_pieces(request, _take(request)))
        got = Assembly()
        # The body is sent as prepared and the stream read raw (see agent.models._http); no
        # tracing span is opened for it.
        opening = partial(
            client.post,
            "/v1/messages",
            cast_to=httpx2.Response,
            content=body,
            options={"headers": {"Content-Type": "application/json"}},
            stream=True,
            stream_cls=None,
        )
        failures = (anthropic.APIError, httpx2.RequestError)
        events = await self._read_stream(
            cast("Callable[[], Awaitable[httpx2.Response]]", opening), got, on_delta, unit="event", failures=failures
        )
        if events == 0:
            raise self._empty("event")  # nothing began: charged nothing, no dropped connection
        with answer_started():
            return self._answer(got, events)

    def _answer(self, got: Assembly, events: int) -> ModelResponse:
        """The answer a finished stream built, or why it is not one."""
        if not got.stopped:
            raise ModelError(
                ModelErrorKind.CONNECTION,
                f"the stream from {self.provider} ended after {events} event(s) without message_stop"
                " (connection dropped?)",
                usage=got.usage,
            )
        if got.stop_reason is None:
            raise ModelError(
                ModelErrorKind.MALFORMED, f"{self.provider} ended the message without a stop_reason", usage=got.usage
            )
        finish = STOP_REASONS.get(got.stop_reason)
        if finish is None:
            logger.warning("unknown stop_reason {!r}; treating it as the end of the answer", got.stop_reason)
            finish = FinishReason.END_TURN
        content = got.content(cut=finish is FinishReason.MAX_TOKENS)
        usage = got.usage
        if usage is None:
            raise ModelError(ModelErrorKind.MALFORMED, f"{self.provider} reported no usage for the message")
        return ModelResponse(content=content, finish_reason=finish, usage=usage)

    def _item(self, event: str | None, data: str) -> object:
        # As the SDK's stream: unnamed events and pings carry nothing; an error event is an error.
        if event is None or event == "ping":
            return SKIP
        if event == "error":
            body: object
            try:
                body = json.loads(data)
                message = f"{body}"
            except ValueError:
                body, message = data, data or "Error code: 200"
            raise StreamErrorItem(message, body)
        if not data:
            return SKIP
        return json.loads(data)

    def _failure(self, exc: Exception, usage: Usage | None) -> ModelError:
        import anthropic
        import httpx2

        if isinstance(exc, StreamErrorItem):
            # An error event inside a stream that started fine.
            error = exc.body.get("error") if isinstance(exc.body, dict) else None
            kind_name = error.get("type") if isinstance(error, dict) else None
            api_message = error.get("message") if isinstance(error, dict) else None
            detail = (api_message if isinstance(api_message, str) else None) or _detail(exc.body) or exc.message
            kind = STREAM_ERROR_KINDS.get(str(kind_name or ""), ModelErrorKind.SERVER)
            why = f"{self.provider} reported {kind_name or 'an error'} mid-stream: {detail}"
            return ModelError(kind, self._redact(why)[:1000], usage=usage)
        if isinstance(exc, anthropic.APITimeoutError | httpx2.TimeoutException):
            return self._timed_out(usage)
        if isinstance(exc, anthropic.APIConnectionError):
            return self._unreachable(exc, exc.message, usage)
        if isinstance(exc, anthropic.APIStatusError):
            detail = exc.api_message or _detail(exc.body) or exc.message
            return self._http_error(exc.status_code, detail, exc.response.headers, usage, body=exc.body)
        if isinstance(exc, anthropic.APIResponseValidationError):
            return ModelError(
                ModelErrorKind.MALFORMED,
                f"{self.provider} sent a response that does not fit the Messages API schema: {exc.message}",
                usage=usage,
            )
        if isinstance(exc, httpx2.RequestError):
            why = f"the stream from {self.provider} broke: {type(exc).__name__}: {exc}"
            return ModelError(ModelErrorKind.CONNECTION, self._redact(why), usage=usage)
        return ModelError(ModelErrorKind.SERVER, self._redact(f"{self.provider} failed: {exc}")[:1000], usage=usage)


def _detail(body: object) -> str | None:
    """The human part of an error body (``{"error": {"message": ...}}``)."""
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])
        return json.dumps(body)[:500]
    if isinstance(body, str) and body.strip():
        return body.strip()[:500]
    return None
