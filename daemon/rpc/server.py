"""Transports for the control protocol: a unix socket (mode 0600, or 0660 for a configured group)
and stdio.

Who calls: on the unix socket the kernel tells the daemon each client's uid and pid
(``SO_PEERCRED``, :func:`peer_credentials`); they ride on the connection's
:class:`~daemon.rpc.protocol.Peer`, and every call that changes state records them in the event
it writes. With ``socket_group`` the socket is shared with that group's members (mode 0660); the
directory it lies in must let them through (the system unit's ``RuntimeDirectoryMode=0750``).

Each connection reads frames in order and answers each request before reading the next, so a
client's requests take effect in the order it sent them; subscriptions stream notifications from
their own tasks. When a connection closes, its subscriptions end with it.

Why the socket bounds its clients (:class:`ConnectionLimits`): every connection costs a
descriptor and a buffer, and the daemon must keep answering ``daemon/health`` however many local
clients misbehave. So the socket holds at most ``max_connections`` at once; when a new one
arrives at the cap, the oldest connection that holds no subscription (and is not mid-request) is
closed to make room: a subscriber (``goal logs -f``, a run waiting for its idle) is what a person
is watching, an idle or half-written connection is the cheapest to lose and its client can
reconnect. A frame must arrive whole within ``frame_timeout`` and a connection without a
subscription may stay silent for ``idle_timeout``. The soft descriptor limit is raised to the
hard one at start (:func:`raise_nofile_limit`). Closing connections and accept errors are counted
and logged at most once per second, never one line (or traceback) per connection.

Why :meth:`UnixServer.stop` lets running requests finish: the call that stops a daemon (a
``shutdown``, or the ``session/interrupt`` that ends a one-shot run) must still get its answer.
Stopping first stops reading new frames, then waits (bounded) for each request in flight to write
its answer, and only then closes the connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import resource
import socket
import struct
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loguru import logger

from daemon.rpc.protocol import Dispatcher, FrameTimeout, Peer, encode, frame_too_large, read_frames

if TYPE_CHECKING:
    from daemon.settings import Settings

#: Seconds :meth:`UnixServer.stop` waits for requests in flight to write their answers.
DRAIN_SECONDS = 5.0
#: errnos of an ``accept()`` that failed for want of resources (asyncio retries after a second).
_ACCEPT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


@dataclass(frozen=True)
class ConnectionLimits:
    """Bounds on the control socket's clients (``None``: unbounded)."""

    max_connections: int | None = 256
    frame_timeout: float | None = 10.0
    idle_timeout: float | None = 300.0

    @classmethod
    def of(cls, settings: Settings) -> ConnectionLimits:
        """The limits the settings configure."""
        return cls(settings.max_connections, settings.frame_timeout_seconds, settings.idle_connection_timeout_seconds)


@dataclass(eq=False)
class ConnectionState:
    """What the server knows of one live connection (plain runtime state, never serialized)."""

    writer: asyncio.StreamWriter
    peer: Peer | None = None
    #: Set while no request is being handled (the connection owes no answer).
    answered: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set when the server stops: no further frame is handled.
    closing: bool = False

    def __post_init__(self) -> None:
        self.answered.set()

    @property
    def subscribed(self) -> bool:
        """Whether the connection holds a subscription (a task streaming notifications)."""
        return self.peer is not None and self.peer.tasks.busy()

    def drop(self, *, flush: bool = False) -> None:
        """Close the connection (its serving task then ends on end-of-file): at once, or after
        what is already written has gone out (``flush``)."""
        self.closing = True
        with contextlib.suppress(Exception):
            if flush:
                self.writer.close()
            else:
                self.writer.transport.abort()


class RateLimitedLog:
    """Log a kind of event at most once per ``interval``, with how many were not logged meanwhile."""

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self._last: dict[str, float] = {}
        self._skipped: dict[str, int] = {}

    def warning(self, kind: str, message: str, *args: Any) -> None:
        """Log ``message`` (a loguru format) for ``kind`` unless one was logged within the interval."""
        now = time.monotonic()
        last = self._last.get(kind)
        if last is not None and now - last < self.interval:
            self._skipped[kind] = self._skipped.get(kind, 0) + 1
            return
        self._last[kind] = now
        skipped = self._skipped.pop(kind, 0)
        if skipped:
            message, args = message + " (and {} more like it since the last such line)", (*args, skipped)
        logger.warning(message, *args)

    def flush(self) -> None:
        """Log the counts still held back."""
        for kind, skipped in self._skipped.items():
            logger.warning("control socket: {} more event(s) of kind {} since the last line about them", skipped, kind)
        self._skipped.clear()


class _Sender:
    """Writes one whole message at a time to the client; once a write fails (the client went away)
    the rest are dropped silently."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self._lock = asyncio.Lock()
        self._gone = False

    async def __call__(self, msg: dict[str, Any]) -> None:
        if self._gone:
            return
        async with self._lock:
            try:
                self.writer.write(encode(msg))
                await self.writer.drain()
            except (ConnectionError, RuntimeError):
                self._gone = True


def _idle_timeout(limits: ConnectionLimits, state: ConnectionState | None) -> Callable[[], float | None]:
    """How long the connection may sit idle, asked before each wait for a new frame."""

    def idle_timeout() -> float | None:
        # A subscriber may stay silent: it is waiting for notifications, not idle.
        if limits.idle_timeout is None or (state is not None and state.subscribed):
            return None
        return limits.idle_timeout

    return idle_timeout


async def serve_connection(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    dispatcher: Dispatcher,
    max_bytes: int,
    *,
    limits: ConnectionLimits | None = None,
    state: ConnectionState | None = None,
) -> None:
    """Serve one client until it disconnects (or, with ``limits``, times out).

    Raises:
        FrameTimeout: the client sat on a partial frame, or idle, past ``limits``.
    """
    send = _Sender(writer)
    creds = peer_credentials(writer)
    peer = Peer(send=send, uid=creds.get("uid"), pid=creds.get("pid"))
    if state is not None:
        state.peer = peer
    frames = read_frames(
        reader,
        max_bytes,
        frame_timeout=limits.frame_timeout if limits is not None else None,
        idle_timeout=_idle_timeout(limits, state) if limits is not None else None,
    )
    try:
        async for frame in frames:
            if state is not None:
                if state.closing:
                    break
                state.answered.clear()
            try:
                response = frame_too_large(max_bytes) if frame is None else await dispatcher.handle_frame(frame, peer)
                if response is not None:
                    await send(response)
            finally:
                if state is not None:
                    state.answered.set()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        peer.closed.set()
        await peer.tasks.cancel()
        with contextlib.suppress(Exception):
            writer.close()


def peer_credentials(writer: asyncio.StreamWriter) -> dict[str, int]:
    """The connected process's ``uid`` and ``pid`` (``SO_PEERCRED``), or nothing off a unix socket.

    The kernel fills these in at ``connect()``: a client cannot claim another user's identity.
    """
    sock = writer.get_extra_info("socket")
    if sock is None or getattr(sock, "family", None) != socket.AF_UNIX:
        return {}
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return {}
    pid, uid, _gid = struct.unpack("3i", raw)
    return {"uid": uid, "pid": pid}


class UnixServer:
    """The control socket: created with mode 0600 in the state (or runtime) directory, or 0660 and
    owned by ``group`` when one is given (``socket_group``: its members may use the daemon)."""

    def __init__(
        self,
        path: Path,
        dispatcher: Dispatcher,
        max_bytes: int,
        *,
        limits: ConnectionLimits | None = None,
        group: int | None = None,
    ) -> None:
        self.path = path
        self.dispatcher = dispatcher
        self.max_bytes = max_bytes
        self.limits = limits or ConnectionLimits()
        self.group = group
        self._server: asyncio.Server | None = None
        #: Live connections, oldest first.
        self._live: OrderedDict[ConnectionState, asyncio.Task[Any] | None] = OrderedDict()
        self._log = RateLimitedLog()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handler: Any = None

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self._live)

    async def start(self) -> None:
        """Listen. Refuses if another daemon already serves on the path.

        Raises:
            OSError: the socket's group cannot be set (a group the daemon's user is not in).
        """
        if not self.path.parent.is_dir():
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            # Said out loud: a typo in ``socket`` would otherwise be a new directory nobody looks in.
            logger.warning("created the control socket's directory {}: it did not exist", self.path.parent)
        if self.path.exists() or self.path.is_symlink():
            if _is_live(self.path):
                raise RuntimeError(f"another goald already serves on {self.path}")
            self.path.unlink()
        self._loop = asyncio.get_running_loop()
        self._handler = self._loop.get_exception_handler()
        self._loop.set_exception_handler(self._loop_exception)
        old = os.umask(0o177)
        try:
            self._server = await asyncio.start_unix_server(self._client, path=str(self.path), limit=2**16)
        finally:
            os.umask(old)
        if self.group is None:
            os.chmod(self.path, 0o600)
            logger.info("control socket listening on {}", self.path)
            return
        try:
            os.chown(self.path, -1, self.group)
            os.chmod(self.path, 0o660)
        except OSError:
            await self.stop()
            raise
        logger.info("control socket listening on {} (mode 0660, group {})", self.path, self.group)

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # asyncio reports a failed accept() (EMFILE...) here each time it retries; one line a second is enough.
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in _ACCEPT_ERRNOS:
            self._log.warning("accept", "control socket: cannot accept a connection: {}", exc.strerror or exc)
            # Out of descriptors (a cap above the limit, or descriptors spent elsewhere): free one for
            # asyncio's next try (in a second) as the cap would, so a new client gets in.
            self._make_room("out of descriptors")
            return
        if self._handler is not None:
            self._handler(loop, context)
        else:
            loop.default_exception_handler(context)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state = ConnectionState(writer)
        cap = self.limits.max_connections
        if cap is not None and len(self._live) >= cap and not self._make_room(f"at its cap of {cap} connections"):
            self._log.warning("refused", "control socket: {} connections, all subscribed: a new one was refused", cap)
            state.drop()
            return
        self._live[state] = asyncio.current_task()
        try:
            await serve_connection(reader, writer, self.dispatcher, self.max_bytes, limits=self.limits, state=state)
        except FrameTimeout as exc:
            self._log.warning("timeout", "control socket: closed a connection: {}", exc)
            state.drop()
        finally:
            self._live.pop(state, None)

    def _make_room(self, why: str) -> bool:
        """Close the oldest connection without a subscription, preferring one that owes no answer."""
        candidates = [c for c in self._live if not c.subscribed and not c.closing]
        victim = next((c for c in candidates if c.answered.is_set()), None) or next(iter(candidates), None)
        if victim is None:
            return False
        self._live.pop(victim, None)
        victim.drop()
        self._log.warning(why, "control socket: {}: closed the oldest connection without a subscription", why)
        return True

    async def stop(self) -> None:
        """Stop listening, let requests in flight write their answers, close every connection and
        remove the socket file."""
        if self._server is not None:
            self._server.close()
            live = list(self._live.items())
            for state, _ in live:
                state.closing = True
            owed = [asyncio.ensure_future(s.answered.wait()) for s, _ in live if not s.answered.is_set()]
            if owed:
                _, pending = await asyncio.wait(owed, timeout=DRAIN_SECONDS)
                for waiter in pending:
                    waiter.cancel()
            for state, _ in live:
                state.drop(flush=True)
            # Each connection now reads end-of-file and ends by itself; one that does not (a request
            # past the drain) is cancelled.
            tasks = [t for _, t in live if t is not None and t is not asyncio.current_task()]
            if tasks:
                _, stuck = await asyncio.wait(tasks, timeout=1.0)
                for task in stuck:
                    task.cancel()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
            self._server = None
            self._log.flush()
        if self._loop is not None:
            self._loop.set_exception_handler(self._handler)
            self._loop = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def raise_nofile_limit() -> int:
    """Raise the soft limit on open descriptors to the hard limit; returns the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            logger.warning("cannot raise the open-descriptor limit from {} to {}: {}", soft, hard, exc)
    return soft


def _is_live(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1)
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


async def serve_stdio(dispatcher: Dispatcher, max_bytes: int) -> None:
    """Serve the protocol on stdin/stdout (stdout carries protocol messages only)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**16)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, sys.stdout.buffer)
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    await serve_connection(reader, writer, dispatcher, max_bytes)
