"""The JSON-RPC connection to a daemon: requests matched to responses, notifications queued.

:class:`Connection` is the protocol as it is on the wire (dicts in, dicts out): the CLI and the
tests use it directly, and the SDK's :class:`~daemon.client.sdk.Client` is built on it. Responses
are matched to requests by id; notifications (``session.event``, ``session.status``) go to a
queue that :meth:`Connection.notifications` iterates.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from daemon.errors import DaemonError
from daemon.rpc.protocol import RpcError, encode


class DaemonUnavailable(DaemonError, ConnectionError):
    """No daemon answers on the socket."""


class SocketPermissionDenied(DaemonUnavailable):
    """The socket is there, and this user may not open it (the CLI's exit 77, ``EX_NOPERM``)."""


class Connection:
    """A JSON-RPC connection to a running daemon (its socket, or a child daemon's stdio)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._notes: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._read())
        self._lock = asyncio.Lock()

    @classmethod
    async def connect(cls, path: str | Path) -> Connection:
        """Connect to the daemon's socket."""
        try:
            reader, writer = await asyncio.open_unix_connection(str(path), limit=2**24)
        except PermissionError as exc:
            raise SocketPermissionDenied(
                f"not allowed to use the goald socket {path}: {exc.strerror or exc}; the daemon's user and the"
                " members of its socket_group may (ask to be added to that group)"
            ) from None
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError) as exc:
            raise DaemonUnavailable(
                f"no goald daemon answers on {path}: {exc.strerror or exc}; start one with 'goald serve',"
                " or name its socket with --socket (or GOALD_SOCKET, or the socket of the --config it reads)"
            ) from None
        return cls(reader, writer)

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection."""
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """Call a method; raises :class:`RpcError` with the server's code, message and data."""
        req_id = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[req_id] = fut
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": req_id, "method": method}
        if params:
            msg["params"] = {k: v for k, v in params.items() if v is not None}
        async with self._lock:
            self._writer.write(encode(msg))
            await self._writer.drain()
        return await fut

    async def send_raw(self, data: bytes) -> None:
        """Write raw bytes (for tests of bad frames)."""
        async with self._lock:
            self._writer.write(data)
            await self._writer.drain()

    async def notifications(self) -> AsyncIterator[dict[str, Any]]:
        """Notifications as they arrive (ends when the connection closes)."""
        while True:
            note = await self._notes.get()
            if note is None:
                return
            yield note

    async def next_notification(self) -> dict[str, Any]:
        """The next notification (raises ``ConnectionError`` when the connection closed)."""
        note = await self._notes.get()
        if note is None:
            self._notes.put_nowait(None)
            raise ConnectionError("the daemon closed the connection")
        return note

    async def _read(self) -> None:
        try:
            while True:
                line = await self._reader.readline()
                if not line:
                    break
                msg = json.loads(line)
                if "method" in msg and "id" not in msg:
                    self._notes.put_nowait(msg)
                    continue
                fut = self._pending.pop(msg.get("id"), None) if msg.get("id") is not None else None
                if fut is None:
                    # An error without an id (a frame the server could not parse).
                    self._notes.put_nowait({"method": "error", "params": msg.get("error", {})})
                    continue
                if fut.done():
                    continue
                if "error" in msg:
                    err = msg["error"]
                    fut.set_exception(RpcError(err.get("code", -32603), err.get("message", ""), err.get("data")))
                else:
                    fut.set_result(msg.get("result"))
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("the daemon closed the connection"))
            self._pending.clear()
            self._notes.put_nowait(None)
