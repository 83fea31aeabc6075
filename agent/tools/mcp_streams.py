"""The streams of an MCP server's process: one that notices the server's end, and its stderr.

The SDK reads the server's stdout through a memory stream; :class:`WatchedStream` wraps it so that
its end (the server exited or closed its output) sets the connection's ``lost`` event, which is how
:mod:`agent.tools.mcp` notices a crash without polling. :class:`StderrTail` is the pipe the server
writes its stderr to: read by the event loop (never blocking it), each line logged at debug level,
the last lines kept to explain a failed start.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from typing import Any, TextIO

import anyio
from loguru import logger


class WatchedStream:
    """A read stream that sets ``lost`` when it ends: the server exited or closed its output."""

    def __init__(self, inner: Any, lost: asyncio.Event) -> None:
        self._inner = inner
        self._lost = lost

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._lost.set()
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> WatchedStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> WatchedStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class StderrTail:
    """A pipe for a server's stderr: each line is logged, and the last ones are kept."""

    def __init__(self, server: str, keep: int = 20) -> None:
        self._server = server
        self._lines: deque[str] = deque(maxlen=keep)
        self._partial = b""
        self._fd: int | None = None

    def open(self) -> TextIO:
        """The write end, for the server; the read end is watched by the event loop."""
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        self._fd = read_fd
        asyncio.get_running_loop().add_reader(read_fd, self._drain)
        return os.fdopen(write_fd, "w")

    def _drain(self) -> None:
        # Bounded: a server that never stops writing cannot hold the loop here.
        for _ in range(64):
            if self._fd is None:
                return
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._take(self._partial)
                self._partial = b""
                self._forget()
                return
            *lines, self._partial = (self._partial + data).split(b"\n")
            for line in lines:
                self._take(line)
            if len(self._partial) > 8192:
                self._take(self._partial)
                self._partial = b""

    def _take(self, raw: bytes) -> None:
        line = raw.decode(errors="replace").rstrip()
        if line:
            self._lines.append(line)
            logger.debug("MCP server {} stderr: {}", self._server, line)

    def _forget(self) -> None:
        if self._fd is not None:
            asyncio.get_running_loop().remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        """Read what is left without waiting, then close the read end."""
        self._drain()
        self._take(self._partial)
        self._partial = b""
        self._forget()

    def tail(self) -> str:
        """The last lines the server wrote."""
        return "\n".join(self._lines)
