"""Transports for the control protocol: a unix socket (mode 0600) and stdio.

Each connection reads frames in order and answers each request before reading the next, so a
client's requests take effect in the order it sent them; subscriptions stream notifications from
their own tasks. When a connection closes, its subscriptions end with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
from pathlib import Path
from typing import Any

from loguru import logger

from daemon.protocol import Dispatcher, Peer, encode, frame_too_large, read_frames


async def serve_connection(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, dispatcher: Dispatcher, max_bytes: int
) -> None:
    """Serve one client until it disconnects."""
    lock = asyncio.Lock()
    gone = False

    async def send(msg: dict[str, Any]) -> None:
        nonlocal gone
        if gone:
            return
        async with lock:
            try:
                writer.write(encode(msg))
                await writer.drain()
            except (ConnectionError, RuntimeError):
                gone = True

    peer = Peer(send=send)
    try:
        async for frame in read_frames(reader, max_bytes):
            if frame is None:
                await send(frame_too_large(max_bytes))
                continue
            response = await dispatcher.handle_frame(frame, peer)
            if response is not None:
                await send(response)
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        peer.closed.set()
        for task in list(peer.tasks):
            task.cancel()
        for task in list(peer.tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        with contextlib.suppress(Exception):
            writer.close()


class UnixServer:
    """The control socket: created with mode 0600 in the state (or runtime) directory."""

    def __init__(self, path: Path, dispatcher: Dispatcher, max_bytes: int) -> None:
        self.path = path
        self.dispatcher = dispatcher
        self.max_bytes = max_bytes
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Listen. Refuses if another daemon already serves on the path."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() or self.path.is_symlink():
            if _is_live(self.path):
                raise RuntimeError(f"another goald already serves on {self.path}")
            self.path.unlink()
        old = os.umask(0o177)
        try:
            self._server = await asyncio.start_unix_server(self._client, path=str(self.path), limit=2**16)
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        logger.info("control socket listening on {}", self.path)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        try:
            await serve_connection(reader, writer, self.dispatcher, self.max_bytes)
        finally:
            if task is not None:
                self._connections.discard(task)

    async def stop(self) -> None:
        """Stop listening, close every connection and remove the socket file."""
        if self._server is not None:
            self._server.close()
            for task in list(self._connections):
                task.cancel()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


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
