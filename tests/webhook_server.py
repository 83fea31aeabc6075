"""A local webhook receiver on 127.0.0.1 for the notification tests: records every request whole.

``async with WebhookServer() as hook``; sinks point at ``hook.url + "/any/path"``. ``hook.respond``
decides each answer's status (default 200; :func:`fail_first` fails each notification id's first
attempts); ``hook.before_answer`` runs after a request arrived whole and before it is answered (an
end-to-end test kills the daemon there: the delivery happened, its record cannot). Tests wait on
``hook.wait(predicate)`` (woken by each request), never sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Received:
    """One request as it arrived, and the status it was answered with."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    status: int = 0
    at: float = field(default_factory=time.monotonic)

    @property
    def json(self) -> Any:
        """The body as JSON (``None`` if it is not)."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    @property
    def notification_id(self) -> str:
        """The ``X-Goald-Notification-Id`` header."""
        return self.headers.get("x-goald-notification-id", "")


def fail_first(n: int, status: int = 500) -> Callable[[Received], int]:
    """Answer ``status`` to the first ``n`` attempts of each notification id, then 200."""
    seen: Counter[str] = Counter()

    def respond(r: Received) -> int:
        seen[r.notification_id] += 1
        return status if seen[r.notification_id] <= n else 200

    return respond


class WebhookServer:
    """An HTTP/1.1 server that records requests (see the module docstring)."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.respond: Callable[[Received], int] = lambda r: 200
        self.before_answer: Callable[[Received], None] | None = None
        self._changed = asyncio.Condition()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> WebhookServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        # Closing the connections ends their handlers (a cancelled handler is logged by asyncio).
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._server.wait_closed()

    def accepted(self, path: str | None = None) -> list[Received]:
        """Requests answered 2xx (at ``path``, if given)."""
        return [r for r in self.received if 200 <= r.status < 300 and (path is None or r.path == path)]

    def accepted_ids(self, path: str | None = None) -> Counter[str]:
        """How many times each notification id was accepted."""
        return Counter(r.notification_id for r in self.accepted(path))

    async def wait(self, predicate: Callable[[], bool], limit: float = 30.0, what: str = "") -> None:
        """Wait until ``predicate()`` holds (checked after every request), at most ``limit`` seconds."""
        try:
            async with asyncio.timeout(limit):
                async with self._changed:
                    await self._changed.wait_for(predicate)
        except TimeoutError:
            kinds = Counter((r.json or {}).get("kind") for r in self.received)
            raise TimeoutError(f"webhook: {what or 'condition'} not met in {limit}s; received {kinds}") from None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                r = Received(method, path, headers, body)
                if self.before_answer is not None:
                    self.before_answer(r)
                r.status = self.respond(r)
                self.received.append(r)
                writer.write(
                    f"HTTP/1.1 {r.status} X\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok".encode()
                )
                await writer.drain()
                async with self._changed:
                    self._changed.notify_all()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._tasks.discard(task)
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
