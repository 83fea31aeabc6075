"""The Python SDK's client: a connection to a running daemon's socket, or to a private child daemon.

Low level, the client mirrors the protocol: :meth:`Client.prompt` answers a ``MessageId`` as soon as
the enqueue is durable (never a result), and :meth:`Client.notifications` yields the
``session.event`` / ``session.status`` notifications of the client's subscriptions.

High level, :meth:`Client.run` owns an interval (see :mod:`daemon.client.interval`): it opens a
notification stream and subscribes *before* it prompts, then finds its own message's receipt,
ignores everything before it, and collects until the first idle after it. It subscribes to every
session (live) rather than to the one session, so that subagent sessions created during the
interval are seen in commit order with the root's events; the protocol has no unsubscribe, so a
client keeps that one subscription for its lifetime (one per client, however many runs).

A private daemon (:meth:`Client.spawn`) is ``goald serve --stdio`` as a child process in its own
process group; :meth:`Client.close` stops it with escalation: the ``shutdown`` method, then closing
its stdin, then SIGTERM, then SIGKILL, each step given ``stop_timeout`` seconds
(:mod:`daemon.client.child`). The typed notifications and their streams are in
:mod:`daemon.client.notifications`; their names are re-exported here.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal

from pydantic import BaseModel

from agent import AgentStatus, MessageId, SessionId
from daemon.client.child import StopStep, child_command, stop_child
from daemon.client.connection import Connection, DaemonUnavailable
from daemon.client.interval import Interval, RunResult, SessionEvent, find_receipt
from daemon.client.notifications import Fanout, Notification, Notifications, StatusChange, parse_notification
from daemon.errors import DaemonError
from daemon.ports import HostPort
from daemon.rpc.methods import build_dispatcher
from daemon.rpc.server import serve_connection
from daemon.settings import load_settings


class AgentState(BaseModel):
    """``agent/status``: the session's status, the sequence number that recorded it, and its last event."""

    session_id: str
    status: AgentStatus
    seq: int
    last_seq: int


class RunIncomplete(DaemonError, ConnectionError):
    """The connection ended before the interval's closing idle; ``result`` holds what was seen."""

    def __init__(self, message: str, result: RunResult | None) -> None:
        super().__init__(message)
        self.result = result


class MessageIdReused(DaemonError, ValueError):
    """``run()`` was given a message id that was already used: no new receipt, no interval to own."""


class Client:
    """An async client of a goald daemon. Use :meth:`connect`, :meth:`spawn` or :meth:`in_process`."""

    def __init__(
        self,
        conn: Connection,
        *,
        process: asyncio.subprocess.Process | None = None,
        temp_dir: Path | None = None,
        stop_timeout: float = 10.0,
        on_close: Callable[[], Any] | None = None,
    ) -> None:
        self._conn = conn
        self._process = process
        self._temp_dir = temp_dir
        self._stop_timeout = stop_timeout
        self._on_close = on_close
        self._fanout = Fanout()
        self._all_subscribed = False
        self._subscribe_lock = asyncio.Lock()
        self._stopped: StopStep | None = None
        self._closed = False
        self._pump_task = asyncio.get_running_loop().create_task(self._pump())

    # -- ways to connect -------------------------------------------------------------------

    @classmethod
    async def connect(cls, socket_path: str | Path | None = None) -> Client:
        """Connect to a running daemon (default: the socket the settings and ``GOALD_*`` name).

        Raises:
            DaemonUnavailable: nothing answers on the socket.
        """
        if socket_path is None:
            socket_path = load_settings(None).socket_path
        return cls(await Connection.connect(socket_path))

    @classmethod
    async def spawn(
        cls,
        *,
        config: str | Path | None = None,
        state_dir: str | Path | None = None,
        argv: Sequence[str] | None = None,
        env: dict[str, str] | None = None,
        log_level: str = "WARNING",
        stderr: int | IO[Any] | None = None,
        start_timeout: float = 30.0,
        stop_timeout: float = 10.0,
    ) -> Client:
        """Start a private ``goald serve --stdio`` and connect to it over its stdin/stdout.

        Args:
            config: The daemon's TOML settings.
            state_dir: Its state directory; without one (and without ``config``) a temporary
                directory is used and removed by :meth:`close`.
            argv: How to run goald (default: this interpreter's ``-m daemon``).
            env: The child's environment (default: this one).
            log_level: The child's log level on its stderr.
            stderr: Where the child's stderr goes (default: inherited).
            start_timeout: Seconds to wait for the child to answer ``initialize``.
            stop_timeout: Seconds each shutdown step waits (see :meth:`close`).

        Raises:
            DaemonUnavailable: the child exited or did not answer in time.
        """
        cmd, child_env, temp = child_command(config, state_dir, argv, env, log_level)
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            env=child_env,
            start_new_session=True,
            limit=2**24,
        )
        assert proc.stdout is not None and proc.stdin is not None
        client = cls(Connection(proc.stdout, proc.stdin), process=proc, temp_dir=temp, stop_timeout=stop_timeout)
        try:
            async with asyncio.timeout(start_timeout):
                await client.initialize()
        except (ConnectionError, TimeoutError) as exc:
            await client.close()
            raise DaemonUnavailable(f"the private goald did not start (exit code {proc.returncode}): {exc}") from None
        except BaseException:
            await client.close()
            raise
        return client

    @classmethod
    async def in_process(cls, host: HostPort) -> Client:
        """A connection to a :class:`~daemon.host.Host` running in this process (a socket pair).

        The connection is not the host's socket: it outlives the host's control server, so a run
        sees the events the host's graceful stop commits (a turn ending ``interrupted``).
        """

        ours, theirs = socket.socketpair()
        s_reader, s_writer = await asyncio.open_unix_connection(sock=theirs, limit=2**16)
        server = asyncio.get_running_loop().create_task(
            serve_connection(s_reader, s_writer, build_dispatcher(host), host.settings.max_frame_bytes)
        )
        reader, writer = await asyncio.open_unix_connection(sock=ours, limit=2**24)

        async def stop_server() -> None:
            server.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await server

        return cls(Connection(reader, writer), on_close=stop_server)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @property
    def state_dir(self) -> Path | None:
        """The private daemon's temporary state directory (removed by :meth:`close`), if it has one."""
        return self._temp_dir

    @property
    def process(self) -> asyncio.subprocess.Process | None:
        """The private daemon's process (``None`` for a socket connection)."""
        return self._process

    async def close(self) -> StopStep | None:
        """Close the connection; stop a private daemon with escalation. Returns the step that stopped it."""
        if self._closed:
            return self._stopped
        self._closed = True
        proc = self._process
        if proc is not None:
            self._stopped = (
                StopStep.EXITED
                if proc.returncode is not None
                else await stop_child(proc, self._conn, self._stop_timeout, ended=self._fanout.ended)
            )
        await self._conn.close()
        self._pump_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._pump_task
        if self._on_close is not None:
            await self._on_close()
        if proc is not None:
            await proc.wait()
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
        return self._stopped

    # -- low level -------------------------------------------------------------------------

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """Call any protocol method (raises :class:`daemon.rpc.protocol.RpcError` with the server's code)."""
        return await self._conn.call(method, params)

    async def initialize(self) -> dict[str, Any]:
        """The server's name, version and protocol version."""
        result: dict[str, Any] = await self.call("initialize")
        return result

    async def new_session(self, *, model: str | None = None, workdir: str | Path | None = None) -> SessionId:
        """Create a session (``model`` as ``PROVIDER:MODEL``; ``workdir`` inside the allowed roots)."""
        out = await self.call("session/new", {"model": model, "workdir": str(workdir) if workdir else None})
        return SessionId(out["sessionId"])

    async def prompt(
        self,
        session_id: str,
        text: str,
        *,
        delivery: Literal["followup", "steer", "context"] = "followup",
        message_id: str | None = None,
    ) -> MessageId:
        """Enqueue a message; returns its id once the enqueue is durable (a receipt, never a result)."""
        out = await self.call(
            "session/prompt", {"sessionId": session_id, "text": text, "delivery": delivery, "messageId": message_id}
        )
        return MessageId(out["messageId"])

    async def cancel_message(self, session_id: str, message_id: str) -> None:
        """Cancel a queued message (an error if a turn already admitted it)."""
        await self.call("session/cancelMessage", {"sessionId": session_id, "messageId": message_id})

    async def interrupt(self, session_id: str, *, discard_queued: bool = False) -> None:
        """End the running turn ``cancelled`` (and cancel every queued message with ``discard_queued``)."""
        await self.call("session/interrupt", {"sessionId": session_id, "discardQueued": discard_queued or None})

    async def status(self, session_id: str) -> AgentState:
        """The session's whole-agent status (``agent/status``)."""
        out = await self.call("agent/status", {"sessionId": session_id})
        return AgentState(session_id=out["sessionId"], status=out["status"], seq=out["seq"], last_seq=out["lastSeq"])

    async def health(self) -> dict[str, Any]:
        """The daemon's health (``daemon/health``)."""
        result: dict[str, Any] = await self.call("daemon/health")
        return result

    async def subscribe(self, session_id: str | None = None, *, after_seq: int | None = None) -> None:
        """Subscribe to a session's events after ``after_seq`` (default: from now), or to every session live.

        Each subscription lasts as long as the connection; subscribing to a session twice delivers
        its events twice. The subscription to every session is made once per client.
        """
        if session_id is None:
            async with self._subscribe_lock:
                if not self._all_subscribed:
                    await self.call("session/subscribe", {})
                    self._all_subscribed = True
            return
        await self.call("session/subscribe", {"sessionId": session_id, "afterSeq": after_seq})

    def notifications(self) -> Notifications:
        """A stream of the notifications of this client's subscriptions, from now on."""
        return Notifications(self._fanout)

    async def _pump(self) -> None:
        try:
            async for note in self._conn.notifications():
                item = parse_notification(note)
                if item is not None:
                    self._fanout.publish(item)
        finally:
            self._fanout.end()

    # -- high level ------------------------------------------------------------------------

    async def run(
        self,
        text: str,
        session_id: str | None = None,
        *,
        delivery: Literal["followup", "steer"] = "followup",
        message_id: str | None = None,
        model: str | None = None,
        workdir: str | Path | None = None,
        on_event: Callable[[SessionEvent], None] | None = None,
    ) -> RunResult:
        """Send ``text`` and own the interval from its receipt to the next whole-agent idle.

        Args:
            text: The message.
            session_id: The session (default: a new one, with ``model`` and ``workdir``).
            delivery: ``followup`` (the next turn) or ``steer`` (joins a running turn).
            message_id: The message's id (default: a new one). It must not have been used before.
            model: For a new session.
            workdir: For a new session.
            on_event: Called with each event of the interval as it arrives.

        Returns:
            The interval's :class:`RunResult`; its ``finish_reason`` is a run-level observation.

        Raises:
            RunIncomplete: the connection ended before the interval closed.
            MessageIdReused: ``message_id`` had been used already.
        """
        if delivery not in ("followup", "steer"):
            raise ValueError(f"run() delivers a followup or a steer, not {delivery!r}")
        sid = session_id or await self.new_session(model=model, workdir=workdir)
        with self.notifications() as stream:
            await self.subscribe(None)
            before = (await self.status(sid)).last_seq
            mid = await self.prompt(sid, text, delivery=delivery, message_id=message_id)
            after = (await self.status(sid)).last_seq
            return await self.collect(stream, sid, mid, written=(before, after), on_event=on_event)

    async def collect(
        self,
        stream: Notifications,
        session_id: str,
        message_id: str,
        *,
        written: tuple[int, int] | None = None,
        on_event: Callable[[SessionEvent], None] | None = None,
    ) -> RunResult:
        """Own the interval of a message enqueued after ``stream`` was opened and subscribed.

        The building block of :meth:`run`, for a caller that prompts by itself. ``written`` is
        ``(last_seq before, last_seq after)`` the prompt: the receipt's sequence number lies in that
        range unless the message id had been used before (then :class:`MessageIdReused`).
        """
        reused = MessageIdReused(f"message {message_id} was enqueued before; run() needs a new message")
        if written is not None and written[1] <= written[0]:
            raise reused
        earlier: list[SessionEvent] = []
        while True:
            ev = await self._next_event(stream, None)
            if find_receipt([ev], session_id, message_id) is not None:
                break
            if written is not None and ev.session_id == session_id and ev.seq >= written[1]:
                raise reused
            earlier.append(ev)
        interval = Interval(ev, earlier)
        if on_event is not None:
            on_event(ev)
        while not self._feed(interval, await self._next_event(stream, interval, message_id), on_event):
            pass
        return interval.result(message_id)

    @staticmethod
    def _feed(interval: Interval, ev: SessionEvent, on_event: Callable[[SessionEvent], None] | None) -> bool:
        count = len(interval.events)
        closed = interval.feed(ev)
        if on_event is not None and len(interval.events) > count:
            on_event(ev)
        return closed

    async def _next_event(self, stream: Notifications, interval: Interval | None, receipt: str = "") -> SessionEvent:
        while True:
            try:
                item = await stream.next()
            except ConnectionError:
                partial = interval.result(receipt) if interval is not None else None
                raise RunIncomplete("the connection ended before the run's interval closed", partial) from None
            if isinstance(item, SessionEvent):
                return item


__all__ = [
    "AgentState",
    "Client",
    "MessageIdReused",
    "Notification",
    "Notifications",
    "RunIncomplete",
    "StatusChange",
    "StopStep",
]
