"""Durable events and their live delivery.

Every fact about a session (a message queued, admitted or cancelled, a turn starting or ending, an
assistant message, a tool result, a status change, and facts other packages add such as goal
changes) is an :class:`Event` with a per-session, gap-free sequence number, written in the same
transaction as the state it describes. Live subscribers receive events only after their commit,
in commit order, and may resume from any sequence number: :meth:`EventHub.subscribe` first
registers a live queue, then reads what is stored after the given sequence, and finally drains
the queue, skipping what it has already yielded, so nothing is missed or seen twice.

An event's ``data`` is the JSON object as stored and sent; :attr:`Event.payload` is its typed
view (:mod:`agent.payloads`), parsed on first access and cached, so writing an event never pays
for a validation of its payload.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import cached_property
from typing import TYPE_CHECKING, Any

from loguru import logger
from pydantic import BaseModel, ConfigDict

from agent.payloads import Payload, parse_payload

if TYPE_CHECKING:
    from agent.store import Store


class EventType(enum.StrEnum):
    """Event kinds the runtime writes. Other packages may add kinds with their own prefix."""

    MESSAGE_QUEUED = "message/queued"
    MESSAGE_ADMITTED = "message/admitted"
    MESSAGE_CANCELLED = "message/cancelled"
    TURN_START = "turn/start"
    TURN_END = "turn/end"
    ASSISTANT_MESSAGE = "assistant/message"
    TOOL_RESULT = "tool/result"
    #: The tool policy refused a call (it was not run); written with its ``tool/result``.
    TOOL_DENIED = "tool/denied"
    MODEL_ERROR = "model/error"
    MODEL_CHARGED = "model/charged"
    STATUS = "status"
    SESSION_CREATED = "session/created"
    #: Older turns were replaced by a summary in the model's view (:mod:`agent.context`).
    CONTEXT_COMPACTED = "context/compacted"
    #: A sandboxed command's connection through the daemon's network proxy, let through or refused.
    SANDBOX_NETWORK = "sandbox/network"


#: Event kinds that make up the conversation history (the model's view of the session).
HISTORY_TYPES: tuple[str, ...] = (
    EventType.MESSAGE_ADMITTED,
    EventType.ASSISTANT_MESSAGE,
    EventType.TOOL_RESULT,
)


class Event(BaseModel):
    """One durable fact in a session's sequence."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    seq: int
    type: str
    data: dict[str, Any]
    at: str

    @cached_property
    def payload(self) -> Payload:
        """The typed view of ``data`` (:mod:`agent.payloads`); parsed once, on first access."""
        return parse_payload(self.type, self.data)


Listener = Callable[[Event], None]


class Subscription:
    """A live queue of events for one session (or all sessions)."""

    def __init__(self, hub: EventHub, session_id: str | None) -> None:
        self._hub = hub
        self.session_id = session_id
        self.queue: asyncio.Queue[Event] = asyncio.Queue()

    def close(self) -> None:
        """Stop receiving events."""
        self._hub._subs.discard(self)


class EventHub:
    """Fans committed events out to listeners and subscriptions, in commit order."""

    def __init__(self) -> None:
        self._listeners: list[Listener] = []
        self._subs: set[Subscription] = set()

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` synchronously for every committed event; returns a remover."""
        self._listeners.append(listener)

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return remove

    def publish(self, events: list[Event]) -> None:
        """Deliver committed events. Called on the event loop, in commit order."""
        for event in events:
            for listener in list(self._listeners):
                try:
                    listener(event)
                except Exception:
                    logger.exception("event listener failed on {} {}", event.type, event.seq)
            for sub in self._subs:
                if sub.session_id is None or sub.session_id == event.session_id:
                    sub.queue.put_nowait(event)

    def watches(self, session_id: str) -> bool:
        """Whether a subscription follows ``session_id`` (or every session)."""
        return any(sub.session_id is None or sub.session_id == session_id for sub in tuple(self._subs))

    def open(self, session_id: str | None) -> Subscription:
        """Register a live queue (events committed from now on)."""
        sub = Subscription(self, session_id)
        self._subs.add(sub)
        return sub

    async def subscribe(
        self,
        store: Store,
        session_id: str,
        after_seq: int = 0,
        *,
        on_caught_up: Callable[[], Awaitable[None]] | None = None,
    ) -> AsyncIterator[Event]:
        """Every event of ``session_id`` with ``seq > after_seq``, stored ones first, then live ones.

        Each event is yielded exactly once, in sequence order.
        """
        sub = self.open(session_id)
        try:
            last = after_seq
            while True:
                page = await store.events_after(session_id, last, limit=1000)
                for event in page:
                    last = event.seq
                    yield event
                if len(page) < 1000:
                    break
            if on_caught_up is not None:
                await on_caught_up()
            while True:
                event = await sub.queue.get()
                if event.seq <= last:
                    continue
                if event.seq != last + 1:
                    # A gap means we were handed events out of order; refill from the store.
                    for missed in await store.events_after(session_id, last, limit=event.seq - last - 1):
                        last = missed.seq
                        yield missed
                last = event.seq
                yield event
        finally:
            sub.close()
