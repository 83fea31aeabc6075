"""The SDK's notifications: typed ``session.event`` / ``session.status`` notifications, and the
streams a client hands them out through.

A client reads its connection's notifications in one task and fans each one out to every open
:class:`Notifications` stream (a queue each, so unread ones are buffered per stream); when the
connection ends every stream ends too, and a stream opened after that ends at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel

from agent import AgentStatus
from daemon.client.interval import SessionEvent


class StatusChange(BaseModel):
    """A whole-agent status transition (``session.status``); ``seq`` is its status event's number."""

    session_id: str
    seq: int
    status: AgentStatus


Notification = SessionEvent | StatusChange


class Fanout:
    """The open notification streams of one client; ``None`` in a stream's queue marks the end."""

    def __init__(self) -> None:
        self.listeners: set[asyncio.Queue[Notification | None]] = set()
        self.ended = False

    def publish(self, item: Notification) -> None:
        """Hand ``item`` to every open stream."""
        for queue in list(self.listeners):
            queue.put_nowait(item)

    def end(self) -> None:
        """The connection ended: every stream ends (after what it has buffered)."""
        self.ended = True
        for queue in list(self.listeners):
            queue.put_nowait(None)


class Notifications:
    """The client's notifications from the moment this stream was opened (an async iterator).

    Unread notifications are buffered; close the stream (or use it as a context manager) when done.
    """

    def __init__(self, fanout: Fanout) -> None:
        self._fanout = fanout
        self._queue: asyncio.Queue[Notification | None] = asyncio.Queue()
        fanout.listeners.add(self._queue)
        if fanout.ended:
            self._queue.put_nowait(None)

    def __enter__(self) -> Notifications:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __aiter__(self) -> Notifications:
        return self

    async def __anext__(self) -> Notification:
        item = await self._queue.get()
        if item is None:
            self._queue.put_nowait(None)
            raise StopAsyncIteration
        return item

    async def next(self) -> Notification:
        """The next notification; raises ``ConnectionError`` once the connection has ended."""
        try:
            return await self.__anext__()
        except StopAsyncIteration:
            raise ConnectionError("the daemon closed the connection") from None

    def close(self) -> None:
        """Stop receiving."""
        self._fanout.listeners.discard(self._queue)


def parse_notification(note: dict[str, Any]) -> Notification | None:
    """The typed notification of a wire notification (``None``: not one the SDK hands out)."""
    params = note.get("params") or {}
    match note.get("method"):
        case "session.event":
            ev = params.get("event") or {}
            return SessionEvent(
                session_id=params["sessionId"],
                seq=params["seq"],
                type=ev["type"],
                data=ev.get("data") or {},
                at=ev.get("at", ""),
            )
        case "session.status":
            return StatusChange(session_id=params["sessionId"], seq=params["seq"], status=params["status"])
        case _:
            return None


__all__ = ["Fanout", "Notification", "Notifications", "StatusChange", "parse_notification"]
