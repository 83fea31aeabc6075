"""The control protocol: JSON-RPC 2.0, one JSON object per line, UTF-8.

This module is transport-free: it parses frames, validates requests, dispatches them to handlers
and turns every failure into a JSON-RPC error. A bad frame is answered with an error and never
closes the connection, let alone other clients' connections. Frames over the configured limit
(1 MiB by default) are refused and skipped up to the next newline. A transport may bound how long
a frame takes to arrive and how long a connection may stay silent (:func:`read_frames`): a client
that never finishes its frame would otherwise hold its buffer and descriptor for ever.

Error codes: the JSON-RPC ones (-32700 parse error, -32600 invalid request, -32601 unknown method,
-32602 invalid params with the offending field in ``data.field``, -32603 internal error) and
goald's application codes, listed in :class:`ErrorCode`.
"""

from __future__ import annotations

import asyncio
import enum
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from loguru import logger
from pydantic import BaseModel, ValidationError

from agent import Conflict, InvalidInput, InvalidTransition, NotFound, StorageUnavailable, TaskSet
from agent.errors import NotSupported
from daemon.errors import DaemonError

PROTOCOL_VERSION = 1


class ErrorCode(enum.IntEnum):
    """JSON-RPC and goald application error codes."""

    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603
    #: A goal, session, schedule or message that does not exist.
    NOT_FOUND = -32001
    #: A lifecycle transition that is not allowed (e.g. resuming a completed goal).
    INVALID_TRANSITION = -32002
    #: A write that conflicts with durable state (a second live goal on a session, a reused key).
    CONFLICT = -32003
    #: The daemon is shutting down and takes no new work.
    SHUTTING_DOWN = -32004
    #: Resuming a subscription below the oldest kept event.
    EVENTS_PRUNED = -32005
    #: The store cannot write (disk full, I/O error): the request changed nothing; retry later.
    STORAGE_UNAVAILABLE = -32006
    #: Not done by this kind of store (a file backup of PostgreSQL): the message says what does it.
    NOT_SUPPORTED = -32007


class RpcError(DaemonError):
    """An error to send back as a JSON-RPC error object."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_json(self) -> dict[str, Any]:
        """The error object."""
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            err["data"] = self.data
        return err


class InvalidField(InvalidInput, DaemonError):
    """Invalid input found by a check that knows the offending field (answered with it in ``data.field``)."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


def invalid_params(exc: ValidationError) -> RpcError:
    """An invalid-params error naming the first offending field."""
    errors = exc.errors()
    first = errors[0]
    where = ".".join(str(p) for p in first["loc"]) or "params"
    msg = "unknown field" if first["type"] == "extra_forbidden" else first["msg"]
    details = [{"field": ".".join(str(p) for p in e["loc"]), "message": e["msg"]} for e in errors[:10]]
    return RpcError(ErrorCode.INVALID_PARAMS, f"invalid params: {where}: {msg}", {"field": where, "errors": details})


def map_exception(exc: BaseException) -> RpcError:
    """Translate a goald exception into the error the client sees."""
    match exc:
        case RpcError():
            return exc
        case ValidationError():
            return invalid_params(exc)
        case NotFound():
            return RpcError(ErrorCode.NOT_FOUND, str(exc))
        case NotSupported():
            return RpcError(ErrorCode.NOT_SUPPORTED, str(exc))
        case InvalidTransition():
            return RpcError(ErrorCode.INVALID_TRANSITION, str(exc))
        case Conflict():
            return RpcError(ErrorCode.CONFLICT, str(exc))
        case InvalidInput():
            return RpcError(ErrorCode.INVALID_PARAMS, str(exc), {"field": getattr(exc, "field", None)})
        case StorageUnavailable():
            return RpcError(
                ErrorCode.STORAGE_UNAVAILABLE,
                f"storage unavailable: {exc.message}; nothing was accepted, try again later ({exc.hint})",
                {"error": exc.message, "hint": exc.hint},
            )
        case _:
            logger.opt(exception=exc).error("internal error while handling a request")
            return RpcError(ErrorCode.INTERNAL_ERROR, f"internal error: {type(exc).__name__}")


P = TypeVar("P", bound=BaseModel)
R = TypeVar("R")

Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass
class Peer:
    """One connected client: how to send it messages, and what it subscribed to."""

    send: Send
    #: The connection's subscriptions (streaming tasks), cancelled when it closes.
    tasks: TaskSet = field(default_factory=TaskSet)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    #: The connected process's user and process ids, from the kernel (``SO_PEERCRED`` on the unix
    #: socket); ``None`` where the transport has none (stdio, in-process).
    uid: int | None = None
    pid: int | None = None

    @property
    def caller(self) -> dict[str, int | str]:
        """``{"uid": ..., "pid": ...}`` for the events a call writes (empty when unknown)."""
        return {k: v for k, v in (("uid", self.uid), ("pid", self.pid)) if v is not None}

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        """Send a notification."""
        await self.send({"jsonrpc": "2.0", "method": method, "params": params})


Handler = Callable[[dict[str, Any], Peer], Awaitable[Any]]
#: A handler of a method with params: ``fn(params, peer)``.
WithParams = Callable[[P, Peer], Awaitable[R]]
#: A handler of a method without params: ``fn(peer)``.
WithoutParams = Callable[[Peer], Awaitable[R]]


class Dispatcher:
    """Method name → handler, with params validated by a pydantic model per method."""

    def __init__(self) -> None:
        self._handlers: dict[str, tuple[type[BaseModel] | None, Callable[..., Awaitable[Any]]]] = {}

    @overload
    def method(
        self, name: str, params: type[P]
    ) -> Callable[[Callable[[P, Peer], Awaitable[R]]], Callable[[P, Peer], Awaitable[R]]]: ...

    @overload
    def method(
        self, name: str, params: None = None
    ) -> Callable[[Callable[[Peer], Awaitable[R]]], Callable[[Peer], Awaitable[R]]]: ...

    def method(
        self, name: str, params: type[BaseModel] | None = None
    ) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
        """Register a handler ``fn(params_model, peer)`` (or ``fn(peer)`` without a params model).

        The overloads tie a handler's first argument to its params model, so every handler is
        type-checked against the params it is given.
        """

        def register(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
            self._handlers[name] = (params, fn)
            return fn

        return register

    @property
    def methods(self) -> list[str]:
        """Registered method names."""
        return sorted(self._handlers)

    async def handle_frame(self, raw: bytes, peer: Peer) -> dict[str, Any] | None:
        """Handle one frame; returns the response to send (``None`` for a notification)."""
        try:
            msg = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            # ValueError covers JSONDecodeError, UnicodeDecodeError and an integer literal past Python's
            # digit limit; RecursionError is nesting past the parser's depth. Uncaught, either one ended
            # the connection without an answer.
            return _error(None, RpcError(ErrorCode.PARSE_ERROR, f"parse error: {exc}"))
        if not isinstance(msg, dict):
            return _error(None, RpcError(ErrorCode.INVALID_REQUEST, "invalid request: a frame must be a JSON object"))
        req_id = msg.get("id")
        if "id" in msg and not (req_id is None or (isinstance(req_id, (str, int)) and not isinstance(req_id, bool))):
            return _error(None, RpcError(ErrorCode.INVALID_REQUEST, "invalid request: id must be a string or integer"))
        if msg.get("jsonrpc") != "2.0":
            return _error(req_id, RpcError(ErrorCode.INVALID_REQUEST, 'invalid request: "jsonrpc" must be "2.0"'))
        method = msg.get("method")
        if not isinstance(method, str) or not method:
            return _error(req_id, RpcError(ErrorCode.INVALID_REQUEST, 'invalid request: "method" must be a string'))
        params = msg.get("params", {})
        if params is None:
            params = {}
        if not isinstance(params, dict):
            return _error(
                req_id,
                RpcError(ErrorCode.INVALID_PARAMS, "invalid params: params must be an object", {"field": "params"}),
            )
        is_notification = "id" not in msg
        try:
            result = await self.call(method, params, peer)
        except Exception as exc:
            if is_notification:
                return None
            return _error(req_id, map_exception(exc))
        if is_notification:
            return None
        return {"jsonrpc": "2.0", "id": req_id, "result": result if result is not None else {}}

    async def call(self, method: str, params: dict[str, Any], peer: Peer) -> Any:
        """Validate and run one method."""
        entry = self._handlers.get(method)
        if entry is None:
            raise RpcError(ErrorCode.METHOD_NOT_FOUND, f"unknown method {method!r}", {"method": method})
        model, fn = entry
        if model is None:
            if params:
                raise RpcError(
                    ErrorCode.INVALID_PARAMS, f"invalid params: {method} takes no params", {"field": next(iter(params))}
                )
            return await fn(peer)
        try:
            parsed = model.model_validate(params)
        except ValidationError as exc:
            raise invalid_params(exc) from None
        return await fn(parsed, peer)


def _error(req_id: Any, err: RpcError) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": req_id, "error": err.to_json()}


class FrameTimeout(DaemonError, TimeoutError):
    """A connection sat too long on a partial frame, or idle (see :func:`read_frames`)."""


async def read_frames(
    reader: asyncio.StreamReader,
    max_bytes: int,
    *,
    frame_timeout: float | None = None,
    idle_timeout: Callable[[], float | None] | None = None,
) -> AsyncIterator[bytes | None]:
    """Newline-delimited frames from ``reader``; ``None`` stands for a frame over ``max_bytes`` (skipped).

    Args:
        frame_timeout: seconds a begun frame may take to arrive whole (counted while waiting for
            bytes only, not while the consumer handles earlier frames); then :class:`FrameTimeout`.
        idle_timeout: asked before each wait with no partial frame: the seconds the connection may
            stay silent (``None``: for ever); then :class:`FrameTimeout`.
    """
    timed = frame_timeout is not None or idle_timeout is not None
    buf = bytearray()
    discarding = False
    waited = 0.0  # seconds spent waiting for the rest of the partial frame
    while True:
        partial = bool(buf) or discarding
        if timed:
            chunk, waited = await _timed_read(reader, partial, waited, frame_timeout, idle_timeout)
        else:
            chunk = await reader.read(65536)
        if not chunk:
            if buf.strip() and not discarding:
                yield bytes(buf)
            return
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            if nl < 0:
                if not discarding:
                    buf.extend(chunk[start:])
                    if len(buf) > max_bytes:
                        buf.clear()
                        discarding = True
                break
            waited = 0.0  # a frame ended: whatever follows is a new frame with its own time
            if discarding:
                discarding = False
                yield None
            else:
                buf.extend(chunk[start:nl])
                if len(buf) > max_bytes:
                    yield None
                elif buf.strip():
                    yield bytes(buf)
                buf.clear()
            start = nl + 1


async def _timed_read(
    reader: asyncio.StreamReader,
    partial: bool,
    waited: float,
    frame_timeout: float | None,
    idle_timeout: Callable[[], float | None] | None,
) -> tuple[bytes, float]:
    """One read under the time left to the partial frame (``partial``), or under the idle timeout;
    the chunk, and the seconds now spent waiting for the rest of the partial frame.

    Raises:
        FrameTimeout: the time ran out.
    """
    loop = asyncio.get_running_loop()
    if partial:
        limit = None if frame_timeout is None else frame_timeout - waited
    else:
        limit = idle_timeout() if idle_timeout is not None else None
    began = loop.time()
    try:
        async with asyncio.timeout(limit):
            chunk = await reader.read(65536)
    except TimeoutError:
        if partial:
            raise FrameTimeout(f"a frame still unfinished after {waited + loop.time() - began:.0f}s") from None
        raise FrameTimeout(f"silent for {loop.time() - began:.0f}s with no subscription") from None
    return chunk, (waited + loop.time() - began if partial else 0.0)


def frame_too_large(max_bytes: int) -> dict[str, Any]:
    """The error answer to an oversized frame."""
    return _error(
        None,
        RpcError(
            ErrorCode.INVALID_REQUEST, f"invalid request: frame over {max_bytes} bytes refused", {"maxBytes": max_bytes}
        ),
    )


def encode(msg: dict[str, Any]) -> bytes:
    """One frame: compact JSON and a newline."""
    return json.dumps(msg, separators=(",", ":"), ensure_ascii=False, default=str).encode() + b"\n"
