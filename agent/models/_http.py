"""What the HTTP providers (:mod:`agent.models.openai`, :mod:`agent.models.anthropic`) share.

Both talk to their server through an official SDK client made on first use, read every answer as
a stream, and classify failures the same way: timeouts, refused connections and HTTP statuses give
the same :class:`ModelError`; a stream item that does not have the expected shape is ``malformed``;
no message ever carries the API key. What differs (the SDK and its types, the request, how the
stream's items build the answer, how the answer ends) stays in each provider's module.

Both send a request body they assembled themselves, through the SDK's generic ``post`` with the
body as ``content``: the SDK's typed ``create`` would transform (walk) every message and every
content part of the whole history on every request, a cost that grows with the conversation. Each
message is instead serialized once, in the SDK's own JSON form (:func:`dump_json`), into the
conversation's :class:`JSONLog` (kept in the request's :class:`~agent.models.base.WireCache`);
a request body is that log's bytes between a head and a tail. The SDK still sends the request
(its headers, authentication, timeouts, retries off), parses the stream and raises its error types.

No SDK is imported here: each provider imports its own, lazily.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from types import TracebackType
from typing import Generic, Protocol, TypeVar

from agent.models.base import DeltaCallback, MessageLog, Model, ModelError, ModelErrorKind, ToolSpec
from agent.models.health import error_kind, parse_retry_after
from agent.redact import redact
from agent.spend import Price, Usage

_ItemT = TypeVar("_ItemT")
_ItemT_co = TypeVar("_ItemT_co", covariant=True)
_ItemT_contra = TypeVar("_ItemT_contra", contravariant=True)


def dump_json(value: object) -> bytes:
    """``value`` as the SDKs serialize a request body: compact, UTF-8, no ASCII escaping, no NaN."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


class JSONLog(MessageLog):
    """A conversation's messages serialized once each, as the comma-separated items of a JSON array.

    ``body`` holds the closed items; a provider that merges consecutive messages into one wire
    message (Anthropic) keeps the last one open (``open_role``/``open_items``) until a message of
    another role closes it. The tool specs and the system prompt are kept serialized too, keyed by
    the objects they came from.
    """

    def __init__(self) -> None:
        super().__init__()
        self.body = bytearray()
        self.open_role: str | None = None
        self.open_items: list[bytes] = []
        self.tools: Sequence[ToolSpec] | None = None
        self.tools_json = b""
        self.system: str | None = None
        self.system_json = b""

    def reset(self) -> None:
        super().reset()
        self.body = bytearray()
        self.open_role, self.open_items = None, []

    def add_item(self, item: bytes) -> None:
        """Append one closed item to the array."""
        if self.body:
            self.body += b","
        self.body += item

    def items_pieces(self) -> list[bytes | bytearray]:
        """The array's items (without brackets) as pieces to join, the open wire message last."""
        if self.open_role is None:
            return [self.body]
        tail = b'{"role":"%s","content":[%s]}' % (self.open_role.encode(), b",".join(self.open_items))
        return [self.body, b",", tail] if self.body else [tail]


class HTTPClient(Protocol):
    """An SDK client: all goald needs of it beyond the provider's own calls is to close it."""

    async def close(self) -> None:
        """Close the client's connections."""


_ClientT = TypeVar("_ClientT", bound=HTTPClient)


class ItemStream(Protocol[_ItemT_co]):
    """An SDK's streamed response: an async iterator of items that closes the response on exit."""

    def __aiter__(self) -> AsyncIterator[_ItemT_co]: ...

    async def __aenter__(self) -> object: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, exc_tb: TracebackType | None
    ) -> None: ...


class Assembly(Protocol[_ItemT_contra]):
    """The answer as a stream's items build it."""

    @property
    def usage(self) -> Usage | None:
        """The usage the stream has reported so far, if any."""

    def feed(self, item: _ItemT_contra, on_delta: DeltaCallback | None) -> None:
        """Take one item; a malformed one raises ``AttributeError``, ``TypeError``, ``ValueError`` or ``KeyError``."""


class StreamingHTTPModel(Model, Generic[_ClientT]):
    """A model behind an HTTP API, reached through an SDK client of type ``_ClientT``.

    A provider makes its client (:meth:`_make_client`), sends its request and feeds the stream to
    :meth:`_read_stream`, and classifies its SDK's exceptions (:meth:`_failure`, with the helpers
    below for the failures every HTTP API has).
    """

    #: The host named in connection errors when ``base_url`` is ``None``.
    _default_host = ""

    def __init__(
        self,
        name: str,
        *,
        provider: str,
        base_url: str | None,
        api_key: str | None,
        timeout: float,
        max_tokens: int,
        context_window: int,
        price: Price | None,
    ) -> None:
        """Keep the settings; the client is made on first use. The providers document the arguments."""
        self.name = name
        self.provider = provider
        self.base_url = base_url
        self.timeout = timeout
        self.max_tokens = max_tokens
        self.context_window = context_window
        self.price = price
        self._api_key = api_key or ""
        self._client: _ClientT | None = None

    @abstractmethod
    def _make_client(self) -> _ClientT:
        """A new SDK client that never retries (the driver does, and records every attempt)."""

    @abstractmethod
    def _failure(self, exc: Exception, usage: Usage | None) -> ModelError:
        """``exc``, one of the exceptions given to :meth:`_read_stream`, as a classified error."""

    def _sdk(self) -> _ClientT:
        # Made on first use, inside the event loop that will use it.
        if self._client is None:
            self._client = self._make_client()
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP client's connections."""
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def _read_stream(
        self,
        opening: Awaitable[ItemStream[_ItemT]],
        got: Assembly[_ItemT],
        on_delta: DeltaCallback | None,
        *,
        unit: str,
        failures: tuple[type[Exception], ...],
    ) -> int:
        """Open the stream, feed every item to ``got`` and return how many items came.

        Args:
            opening: the SDK call that opens the stream.
            got: what builds the answer.
            on_delta: where text deltas go.
            unit: what an item is called in error messages (``chunk``, ``event``).
            failures: the exceptions :meth:`_failure` classifies (the SDK's, the transport's).

        Raises:
            ModelError: a malformed item or body (``malformed``), or a failure as :meth:`_failure`
                classifies it; always with the usage seen so far and never with the API key.
        """
        received = 0
        try:
            stream = await opening
            async with stream:
                async for item in stream:
                    received += 1
                    try:
                        got.feed(item, on_delta)
                    except (AttributeError, TypeError, ValueError, KeyError) as exc:
                        raise ModelError(
                            ModelErrorKind.MALFORMED,
                            f"malformed stream {unit} #{received} from {self.provider}: {type(exc).__name__}: {exc}",
                            usage=got.usage,
                        ) from None
        except ModelError as exc:
            exc.message = self._redact(exc.message)
            raise
        except failures as exc:
            raise self._failure(exc, got.usage) from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ModelError(
                ModelErrorKind.MALFORMED,
                f"malformed stream {unit} #{received + 1} from {self.provider}: not valid JSON ({exc})",
                usage=got.usage,
            ) from None
        return received

    def _redact(self, text: str) -> str:
        return redact(text, self._api_key)

    def _timed_out(self, usage: Usage | None) -> ModelError:
        """The server sent nothing for ``timeout`` seconds."""
        return ModelError(
            ModelErrorKind.TIMEOUT, f"{self.provider} sent nothing for {self.timeout:g}s (timed out)", usage=usage
        )

    def _unreachable(self, exc: Exception, message: str, usage: Usage | None) -> ModelError:
        """The connection failed: ``exc`` as the SDK raised it, ``message`` its words for it."""
        cause = exc.__cause__
        why = f"{type(cause).__name__}: {cause}" if cause is not None else message
        where = self.base_url or self._default_host
        return ModelError(ModelErrorKind.CONNECTION, self._redact(f"connection to {where} failed: {why}"), usage=usage)

    def _http_error(
        self, status: int, detail: str, headers: Mapping[str, str], usage: Usage | None, code: str | None = None
    ) -> ModelError:
        """The server answered with an error status; a retryable one may say when to retry."""
        kind = error_kind(status, detail, code)
        return ModelError(
            kind,
            self._redact(f"HTTP {status} from {self.provider}: {detail}")[:1000],
            retry_after=parse_retry_after(headers) if kind.retryable else None,
            usage=usage,
            status=status,
        )
