"""What the HTTP providers (:mod:`agent.models.openai`, :mod:`agent.models.anthropic`) share.

Both talk to their server through an official SDK client made on first use, read every answer as
a stream, and classify failures the same way: timeouts, refused connections and HTTP statuses give
the same :class:`ModelError`; a stream item that does not have the expected shape is ``malformed``;
no message ever carries the API key. What differs (the SDK and its types, the request, how the
stream's items build the answer, how the answer ends) stays in each provider's module.

Both send a request body they assembled themselves, through the SDK's generic ``post`` with the
body as ``content``: the SDK's typed ``create`` would transform (walk) every message and every
content part of the whole history on every request, a cost that grows with the conversation. Each
message is instead serialized once, in the SDK's own JSON form (:func:`~agent.models.body.dump_json`), into
the conversation's :class:`~agent.models.body.JSONLog` (kept in the request's :class:`~agent.models.base.WireCache`);
a request body is that log's bytes between a head and a tail. The SDK still sends the request
(its headers, authentication, timeouts, retries off) and raises its error types for a failed
request or an error status.

The answer's stream is read here, not by the SDK: the SDK is asked for the raw response (``post``
with ``cast_to`` the HTTP client's ``Response``, a documented use) and :class:`~agent.models.sse.SSEParser` splits
its bytes into server-sent events as the SDKs' decoder does; each event's JSON goes to the
provider's assembly as plain dicts and lists. The SDKs' streams build a typed model object per
chunk (their ``construct_type``), which cost more than the rest of a step's client work together;
the shapes are checked where the assembly reads them instead (a wrong one is ``malformed``), and an
error the server reports inside the stream is classified as the SDK would have raised it.

A failure after the response was opened (a successful status: the stream dropped, timed out or was
malformed, or the answer never finished) carries ``response_started``: the provider has likely
billed the prompt, so when no usage came the driver charges the prompt's estimate
(:func:`agent.calls.failed_usage`); a failure before it (a refused connection, an error status)
does not.

A request that met a keep-alive connection the server had closed (it disconnected without a byte
of answer: the request was never processed) is sent again at once on a new connection, inside the
attempt (:meth:`StreamingHTTPModel._open`): it is no failure of the provider's, so it never reaches
the circuit breaker and records no failed attempt.

No SDK is imported here: each provider imports its own, lazily.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from abc import abstractmethod
from collections.abc import Awaitable, Callable, Iterator, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Generic, Protocol, TypeVar

from loguru import logger

from agent.errors import AgentError
from agent.models import windows
from agent.models.base import DeltaCallback, Model, ModelError, ModelErrorKind, known_window
from agent.models.classify import error_kind, parse_retry_after, stated_window
from agent.models.sse import SSEParser
from agent.redact import redact
from agent.spend import Price, Usage

if TYPE_CHECKING:
    import httpx2


class HTTPClient(Protocol):
    """An SDK client: all goald needs of it beyond the provider's own calls is to close it."""

    async def close(self) -> None:
        """Close the client's connections."""


_ClientT = TypeVar("_ClientT", bound=HTTPClient)


class StreamErrorItem(AgentError):
    """An error the server reported in place of a stream item, after a successful status (a signal
    between the stream reader and the provider's classification; it never leaves the provider)."""

    def __init__(self, message: str, body: object) -> None:
        super().__init__(message)
        self.message = message
        #: The error's JSON (or its raw text, if it was not JSON).
        self.body = body


#: What :meth:`StreamingHTTPModel._item` returns for an event that carries no item.
SKIP: Final = object()
#: What :meth:`StreamingHTTPModel._item` returns for the event that ends the stream.
END: Final = object()

#: Seconds each request asking the server for the model's window may take (best effort).
PROBE_SECONDS = 5.0

#: Seconds the rest of a body is read after the event that ended the stream (so the connection
#: can serve the next request), as the SDKs do; an error meanwhile changes nothing.
DRAIN_SECONDS = 0.1


class Assembly(Protocol):
    """The answer as a stream's items build it."""

    @property
    def usage(self) -> Usage | None:
        """The usage the stream has reported so far, if any."""

    def feed(self, item: Any, on_delta: DeltaCallback | None) -> None:
        """Take one item (parsed JSON); a malformed one raises ``AttributeError``, ``TypeError``,
        ``ValueError`` or ``KeyError``."""


def as_object(value: object, what: str) -> dict[str, Any]:
    """``value`` if it is a JSON object, else ``TypeError`` naming ``what``."""
    if not isinstance(value, dict):
        raise TypeError(f"{what} is a {type(value).__name__}, not an object")
    return value


def objects_of(value: object, what: str) -> list[dict[str, Any]]:
    """``value`` if it is a JSON array of objects (``None``: an empty one), else ``TypeError``."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise TypeError(f"{what} is a {type(value).__name__}, not a list")
    for item in value:
        if not isinstance(item, dict):
            raise TypeError(f"an item of {what} is a {type(item).__name__}, not an object")
    return value


class StreamingHTTPModel(Model, Generic[_ClientT]):
    """A model behind an HTTP API, reached through an SDK client of type ``_ClientT``.

    A provider makes its client (:meth:`_make_client`), sends its request and feeds the stream to
    :meth:`_read_stream` (which turns each event into an item with :meth:`_item`), and classifies
    its SDK's exceptions (:meth:`_failure`, with the helpers below for the failures every HTTP
    API has).
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
        context_window: int | None,
        price: Price | None,
        default_window: int,
        window_source: str | None = None,
    ) -> None:
        """Keep the settings; the client is made on first use. The providers document the arguments.

        ``context_window`` ``None``: not configured; the window goald knows for the model's name, else
        ``default_window``, until the server says otherwise (:meth:`discover_window`, a refusal).
        ``window_source``: where a given ``context_window`` came from (``config`` if not said).
        """
        self.name = name
        self.provider = provider
        self.base_url = base_url
        self.timeout = timeout
        self.max_tokens = max_tokens
        if context_window is None:
            known = known_window(name)
            self.context_window = known or default_window
            self.window_source = windows.KNOWN_MODEL if known else windows.DEFAULT
        else:
            self.context_window, self.window_source = context_window, window_source or windows.CONFIG
        self.price = price
        self._api_key = api_key or ""
        self._client: _ClientT | None = None
        self._window_asked = False

    @abstractmethod
    def _make_client(self) -> _ClientT:
        """A new SDK client that never retries (the driver does, and records every attempt)."""

    @abstractmethod
    def _failure(self, exc: Exception, usage: Usage | None) -> ModelError:
        """``exc``, one of the exceptions given to :meth:`_read_stream` or a
        :class:`StreamErrorItem`, as a classified error."""

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

    # -- asking the server for the window --------------------------------------------------------

    async def discover_window(self) -> None:
        """Ask a self-hosted server (a ``base_url``) for the model's window when the configuration did
        not set it: ``llama-server``'s ``GET /props``, vLLM's ``GET /v1/models``, Ollama's
        ``POST /api/show``, the first that states one. Once per model, best effort: a failure (a 404
        from the servers that have no such path) is ignored; an unreachable server ends the asking."""
        if self._window_asked or self.base_url is None:
            return
        if self.window_source == windows.CONFIG or self.window_source in windows.FROM_SERVER:
            return
        self._window_asked = True  # once, whatever comes of it (concurrent first steps ask once)
        root = self.base_url.rstrip("/")
        root = root.removesuffix("/v1")
        probes: list[tuple[str, str, str, Any, Callable[[object], int | None]]] = [
            (windows.SERVER_PROPS, "get", root + "/props", None, windows.window_from_props),
            (
                windows.SERVER_MODELS,
                "get",
                root + "/v1/models",
                None,
                partial(windows.window_from_models, name=self.name),
            ),
            (windows.SERVER_SHOW, "post", root + "/api/show", {"model": self.name}, windows.window_from_show),
        ]
        for source, method, url, body, read in probes:
            try:
                answer = await self._ask(method, url, body)
            except Exception as exc:  # best effort: nothing a probe does may fail a call
                why = self._redact(f"{type(exc).__name__}: {exc}")
                logger.debug("model {}: {} {} gave no window ({})", self.spec, method.upper(), url, why)
                if getattr(exc, "status_code", None) is None:
                    return  # no answer at all: the server is unreachable (the call will say so)
                continue
            window = read(answer)
            if window is not None:
                self.learn_window(window, source)
                return

    async def _ask(self, method: str, url: str, body: object) -> object:
        """One small JSON request to the server, through the SDK client (its headers and key), with a
        short timeout; the answer's JSON."""
        import httpx2

        client: Any = self._sdk()
        options: dict[str, Any] = {"timeout": min(self.timeout, PROBE_SECONDS), **self._probe_options()}
        if method == "get":
            response = await client.get(url, cast_to=httpx2.Response, options=options)
        else:
            response = await client.post(url, cast_to=httpx2.Response, body=body, options=options)
        return json.loads(await response.aread() if not response.is_closed else response.content)

    def _probe_options(self) -> dict[str, Any]:
        """Request options the SDK needs to send its key (a provider's own)."""
        return {}

    @abstractmethod
    def _item(self, event: str | None, data: str) -> object:
        """One server-sent event as a stream item (parsed JSON), :data:`SKIP` or :data:`END`.

        Raises ``json.JSONDecodeError`` for data that is not JSON, :class:`StreamErrorItem` for an
        error reported in place of an item.
        """

    async def _read_stream(
        self,
        opening: Callable[[], Awaitable[httpx2.Response]],
        got: Assembly,
        on_delta: DeltaCallback | None,
        *,
        unit: str,
        failures: tuple[type[Exception], ...],
    ) -> int:
        """Open the stream, feed every item to ``got`` and return how many items came.

        Args:
            opening: makes the SDK call that opens the stream and gives the raw response (made
                again, at once, when the connection it took was one the server had closed).
            got: what builds the answer.
            on_delta: where text deltas go.
            unit: what an item is called in error messages (``chunk``, ``event``).
            failures: the exceptions :meth:`_failure` classifies (the SDK's, the transport's);
                :class:`StreamErrorItem` is always one.

        Raises:
            ModelError: a malformed item or body (``malformed``), or a failure as :meth:`_failure`
                classifies it; always with the usage seen so far, never with the API key, and
                ``response_started`` once the response was opened (a successful status).
        """
        opened = False
        try:
            response = await self._open(opening)
            opened = True
            try:
                return await self._feed(response, got, on_delta, unit)
            finally:
                await response.aclose()
        except ModelError as exc:
            exc.message = self._redact(exc.message)
            exc.response_started = opened
            raise
        except StreamErrorItem as exc:
            raise _started(self._failure(exc, got.usage), opened) from None
        except failures as exc:
            raise _started(self._failure(exc, got.usage), opened) from None

    async def _open(self, opening: Callable[[], Awaitable[httpx2.Response]]) -> httpx2.Response:
        """Open the stream; a request sent on a keep-alive connection the server had closed (it
        disconnected without a byte of answer: the request was never processed) is sent again at
        once, on a new connection, at most :data:`STALE_RETRIES` times. The failure is the
        connection's, not the provider's: nothing is recorded or counted against the breaker."""
        for _ in range(STALE_RETRIES):
            try:
                return await opening()
            except Exception as exc:
                if not _stale_connection(exc):
                    raise
                why = self._redact(f"{type(exc).__name__}: {exc}")
                logger.info("{}: the server had closed the idle connection ({}); sending again", self.spec, why)
        return await opening()

    async def _feed(self, response: httpx2.Response, got: Assembly, on_delta: DeltaCallback | None, unit: str) -> int:
        """Feed the items of an opened response to ``got``; how many came."""
        received = 0
        parser = SSEParser()
        chunks = response.aiter_bytes()
        try:
            async for chunk in chunks:
                for event, data in parser.feed(chunk):
                    item = self._item(event, data)
                    if item is SKIP:
                        continue
                    if item is END:
                        await _drain(chunks)
                        return received
                    received += 1
                    try:
                        got.feed(item, on_delta)
                    except (AttributeError, TypeError, ValueError, KeyError) as exc:
                        raise ModelError(
                            ModelErrorKind.MALFORMED,
                            f"malformed stream {unit} #{received} from {self.provider}: {type(exc).__name__}: {exc}",
                            usage=got.usage,
                        ) from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ModelError(
                ModelErrorKind.MALFORMED,
                f"malformed stream {unit} #{received + 1} from {self.provider}: not valid JSON ({exc})",
                usage=got.usage,
            ) from None
        return received

    def _redact(self, text: str) -> str:
        return redact(text, self._api_key)

    def _empty(self, unit: str) -> ModelError:
        """A successful status whose stream carried no {unit} at all (see :attr:`ModelError.empty`):
        ``malformed`` (the server answers: never counted against the breaker), charged nothing."""
        return ModelError(
            ModelErrorKind.MALFORMED,
            f"{self.provider} answered HTTP 200 with an empty stream (no {unit}): a server that cannot fit"
            " the prompt may answer so",
            empty=True,
        )

    def _timed_out(self, usage: Usage | None) -> ModelError:
        """The server sent nothing for ``timeout`` seconds."""
        return ModelError(
            ModelErrorKind.TIMEOUT, f"{self.provider} sent nothing for {self.timeout:g}s (timed out)", usage=usage
        )

    def _unreachable(
        self, exc: Exception, message: str, usage: Usage | None, cause: BaseException | None = None
    ) -> ModelError:
        """The connection failed: ``exc`` as the SDK raised it, ``message`` its words for it
        (``cause``: the transport's error, if not ``exc``'s cause)."""
        cause = cause or exc.__cause__
        why = f"{type(cause).__name__}: {cause}" if cause is not None else message
        where = self.base_url or self._default_host
        return ModelError(ModelErrorKind.CONNECTION, self._redact(f"connection to {where} failed: {why}"), usage=usage)

    def _http_error(
        self,
        status: int,
        detail: str,
        headers: Mapping[str, str],
        usage: Usage | None,
        code: str | None = None,
        body: object = None,
    ) -> ModelError:
        """The server answered with an error status; a retryable one may say when to retry, a
        ``context_length`` one what it states of the window (``body``: the answer's JSON)."""
        kind = error_kind(status, detail, code, body)
        stated = stated_window(f"{code or ''} {detail}", body) if kind is ModelErrorKind.CONTEXT_LENGTH else None
        return ModelError(
            kind,
            self._redact(f"HTTP {status} from {self.provider}: {detail}")[:1000],
            retry_after=parse_retry_after(headers) if kind.retryable else None,
            usage=usage,
            status=status,
            stated=stated,
        )


#: Times a request is sent again at once when the pooled connection it took had been closed by the
#: server (each retry takes another connection; the pool drops the closed one).
STALE_RETRIES = 2
#: What the HTTP stack says when a server closed a kept-alive connection before answering on it.
_STALE_WORDS = ("without sending a response",)


def _stale_connection(exc: BaseException) -> bool:
    """Whether ``exc`` (as the SDK raised it, or its cause) is a request that met a keep-alive
    connection the server had closed: the server disconnected before any byte of its answer."""
    import httpx2

    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, httpx2.RemoteProtocolError) and any(w in str(cause) for w in _STALE_WORDS):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def _started(error: ModelError, opened: bool) -> ModelError:
    """``error``, marked as failing after its response was opened (if it was)."""
    error.response_started = opened
    return error


@contextlib.contextmanager
def answer_started() -> Iterator[None]:
    """Mark a :class:`ModelError` raised inside as one whose answer had started: for a check made
    once the stream was read (an unfinished answer, a tool call that does not parse)."""
    try:
        yield
    except ModelError as exc:
        exc.response_started = True
        raise


async def _drain(chunks: Any) -> None:
    """Read what is left of a body after its last event, for a bounded time; failures do not count."""
    import httpx2

    try:
        async with asyncio.timeout(DRAIN_SECONDS):
            async for _ in chunks:
                pass
    except (TimeoutError, httpx2.HTTPError, httpx2.StreamError):
        pass
