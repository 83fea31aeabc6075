"""Owned intervals: one message from its receipt to the next whole-agent idle.

A ``MessageId`` proves receipt, never an outcome (docs/architecture.md#invariants: 1, 7 and 11). A caller
that wants a result — a subagent's delegating call, the SDK's ``run()`` (and through it
``goald run``), an ACP prompt — owns an *interval* instead: it opens at the committed
``message/queued`` event of its own message (the receipt) and closes at the first ``status: idle``
of that session after it. :class:`IntervalWatcher` is the one implementation of that watch. It
sees three facts and exposes nothing else:

* **receipt**: the sequence number of the message's ``message/queued`` event;
* **admission**: the turn that took the message in (``message/admitted``), or that the message
  was cancelled while queued (``message/cancelled``) — its fate, invariant 2;
* **idle**: the sequence number of the first idle after the receipt.

Stale idles are ignored by construction: an idle counts only after the receipt was seen and only
with a higher sequence number, and the driver never commits idle while a waking message is queued
(invariant 4), so the closing idle comes after the message was admitted or cancelled. The watcher
never reads a ``turn/end``. What the interval *showed* is a separate, run-level observation,
:class:`RunFacts` (the last committed assistant text, the last turn's end), which never looks at
a message id; ACP alone adds, as its own small layer, the end of the turn that admitted its
message (invariant 8, :mod:`daemon.acp.prompt`).

Both are fed events of the watched session in commit order, from whatever carries them: a hub
subscription (:func:`watch_interval`), an in-process listener, or the control protocol.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from agent.events import Event, EventType
from agent.payloads import (
    AgentStatus,
    AssistantMessage,
    MessageAdmitted,
    MessageCancelled,
    MessageQueued,
    StatusChanged,
    TurnEnded,
)

if TYPE_CHECKING:
    from agent.store import Store


class IntervalWatcher:
    """The owned interval of ``message_id``: its receipt, its admission and the next idle.

    Feed it every event of the session in sequence order (events of other sessions, and everything
    before the receipt, are ignored). ``session_id`` may be left out: the watcher then binds to the
    session of the receipt.
    """

    def __init__(self, message_id: str, session_id: str | None = None) -> None:
        self.message_id = message_id
        self.session_id = session_id
        #: Sequence number of the message's ``message/queued`` event, once seen.
        self.receipt_seq: int | None = None
        #: The turn that admitted the message, once admitted.
        self.admitted_by: str | None = None
        #: Whether the message was cancelled while queued (then no turn admits it).
        self.cancelled = False
        #: Sequence number of the idle that closed the interval.
        self.idle_seq: int | None = None

    @property
    def received(self) -> bool:
        """Whether the receipt has been seen (the interval is open or closed)."""
        return self.receipt_seq is not None

    @property
    def closed(self) -> bool:
        """Whether the closing idle has been seen."""
        return self.idle_seq is not None

    def observe(self, event: Event) -> bool:
        """Take one event in sequence order; returns whether the interval is closed."""
        if self.idle_seq is not None or (self.session_id is not None and event.session_id != self.session_id):
            return self.idle_seq is not None
        if self.receipt_seq is None:
            if event.type == EventType.MESSAGE_QUEUED:
                queued = event.payload
                if isinstance(queued, MessageQueued) and queued.message_id == self.message_id:
                    self.receipt_seq = event.seq
                    self.session_id = event.session_id
            return False
        if event.seq <= self.receipt_seq:
            return False
        match event.type:
            case EventType.MESSAGE_ADMITTED:
                admitted = event.payload
                if isinstance(admitted, MessageAdmitted) and admitted.message_id == self.message_id:
                    self.admitted_by = admitted.turn_id
            case EventType.MESSAGE_CANCELLED:
                gone = event.payload
                if isinstance(gone, MessageCancelled) and gone.message_id == self.message_id:
                    self.cancelled = True
            case EventType.STATUS:
                if is_idle(event):
                    self.idle_seq = event.seq
            case _:
                pass
        return self.idle_seq is not None


def is_idle(event: Event) -> bool:
    """Whether ``event`` records the whole agent going idle."""
    if event.type != EventType.STATUS:
        return False
    status = event.payload
    return isinstance(status, StatusChanged) and status.status is AgentStatus.IDLE


class RunFacts:
    """What one session's events showed, as a run-level observation (never about one message).

    ``final_response``: the text of the last committed assistant message with non-empty text
    (interrupted partial text excluded). ``last_end``: the last ``turn/end``.
    """

    def __init__(self) -> None:
        self.final_response: str | None = None
        self.last_end: TurnEnded | None = None

    def observe(self, event: Event) -> None:
        """Take one event of the session."""
        if event.type == EventType.ASSISTANT_MESSAGE:
            answer = event.payload
            if isinstance(answer, AssistantMessage) and not answer.interrupted and answer.text.strip():
                self.final_response = answer.text
        elif event.type == EventType.TURN_END:
            ended = event.payload
            if isinstance(ended, TurnEnded):
                self.last_end = ended


@dataclass(frozen=True)
class WatchedRun:
    """A closed interval of one session: its watcher and what it showed."""

    watch: IntervalWatcher
    facts: RunFacts


async def watch_interval(store: Store, session_id: str, message_id: str, queued_seq: int) -> WatchedRun:
    """Follow the session's events from the receipt at ``queued_seq`` to the next idle."""
    watch = IntervalWatcher(message_id, session_id)
    facts = RunFacts()
    # An async generator: closed at once on leaving, so its live queue goes with it.
    stream = cast("AsyncGenerator[Event, None]", store.hub.subscribe(store, session_id, queued_seq - 1))
    async with contextlib.aclosing(stream) as events:
        async for event in events:
            if watch.observe(event):
                break
            if watch.received:
                facts.observe(event)
    return WatchedRun(watch, facts)
