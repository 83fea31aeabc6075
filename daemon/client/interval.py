"""Owned intervals as the SDK reports them: what ``Client.run()`` and ``goald run`` return.

A ``MessageId`` proves receipt, never an outcome (docs/architecture.md#invariants: 1, 7 and 11). A caller that
wants a result therefore owns an *interval* explicitly: it starts at the committed
``message/queued`` event of the caller's own message and ends at the first ``status: idle``
event of the same session with a higher sequence number. Everything before the receipt (an idle
of earlier work, the tail of a turn that was already running) is ignored; everything in the
interval counts, whoever caused it: steering, injected context, a turn that was already running
when the message arrived, later follow-ups. So :class:`RunResult` is deliberately broader than
the submitted message:

* ``final_response`` is the text of the last committed assistant message of the root session in
  the interval with non-empty text (partial text of an interrupted step excluded), not "the
  answer to the prompt";
* ``finish_reason`` is the end reason of the *last* root ``turn/end`` in the interval, a run-level
  observation; it is never looked up through the message (its id is used only to find the
  receipt, and the interval logic below never sees it);
* ``usage`` sums the model calls recorded in the interval by the root session and by its
  subagent sessions (sessions whose ``session/created`` names a parent in the tree): every call,
  the summary calls of the context's compaction (``context/compacted``) included, so the tokens it
  reports are the tokens charged, as the goal engine counts them (``goals.facts.charged``).

Usage has one source of truth per session. A subagent's model calls are its own session's
``assistant/message``, ``model/error`` and ``context/compacted`` (a summary call) events, and when
its delegating call ends (``agent.subagents.settle_child``) the parent session records the child's
whole spend once more, as a ``model/charged`` event naming the child in ``subagentSessionId`` (its
grandchildren's included, for the goal engine, which counts one session's events). Counting both
would count a child twice and a grandchild three times, so such a charge counts only when its child
is *not* in the interval's tree: then the interval never saw the child's calls, and the charge
(recorded in the interval) is all there is to count, as ``charged_tokens``. A ``model/charged``
event without ``subagentSessionId`` (a reservation charged in full by crash repair or an
interrupted call) records spend of its own session that no other event records, and always counts.

:func:`find_receipt` locates the receipt; :class:`Interval` consumes events after it in commit
order. Both work on :class:`SessionEvent` values, whatever carried them (the control protocol, or
an in-process hub listener). The watch itself (receipt, admission, the closing idle) and the
run-level facts are the runtime's one implementation, :mod:`agent.interval`; this module adds
what only a remote observer needs: the session tree, the events and the usage.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel

from agent import (
    AssistantMessage,
    ContextCompacted,
    EndReason,
    Event,
    EventType,
    IntervalWatcher,
    MessageAdmitted,
    MessageQueued,
    ModelCharged,
    ModelFailed,
    RunFacts,
    SessionCreated,
)

#: The events that record spend (a call's usage, a charge), as the goal engine counts them.
_SPEND_TYPES = (
    EventType.ASSISTANT_MESSAGE,
    EventType.MODEL_ERROR,
    EventType.MODEL_CHARGED,
    EventType.CONTEXT_COMPACTED,
)


class SessionEvent(Event):
    """One durable event of a session, as the ``session.event`` notification carries it."""

    @classmethod
    def from_event(cls, event: Event) -> SessionEvent:
        """The same fact, from the runtime's in-process event."""
        return cls(session_id=event.session_id, seq=event.seq, type=event.type, data=event.data, at=event.at)

    @property
    def text(self) -> str:
        """The text of an assistant or admitted message (empty for other events)."""
        payload = self.payload
        return payload.text if isinstance(payload, AssistantMessage | MessageAdmitted) else ""


class RunUsage(BaseModel):
    """Model usage recorded in an interval, subagent sessions included."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    #: Tokens charged without a per-call breakdown (``model/charged``): reservations charged in full
    #: because a call's outcome is unknown, and the spend of a subagent whose own events the interval
    #: did not see.
    charged_tokens: int = 0
    #: Cost in the price unit of the configured providers (0 where no price is known).
    cost: float = 0.0
    #: Model attempts that reported (successful or failed).
    model_calls: int = 0

    @property
    def total_tokens(self) -> int:
        """Every token counted, charged reservations included."""
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_read_tokens
            + self.cache_write_tokens
            + self.charged_tokens
        )


class RunResult(BaseModel):
    """What an owned interval showed: from the message's receipt to the next whole-agent idle.

    Attributes:
        session_id: The root session.
        message_id: The submitted message (its receipt opened the interval; nothing else is
            attributed to it).
        final_response: Text of the last committed root assistant message of the interval with
            non-empty text (interrupted partial text excluded); ``None`` if there is none. Other
            input admitted in the interval (steering, context, later follow-ups) may have shaped it.
        finish_reason: End reason of the last root turn that ended in the interval, or ``None``
            when no turn ended in it (e.g. the message was cancelled before any turn). A run-level
            observation, not the prompt's outcome: the turn may have admitted other messages, or
            may have been running before the message arrived.
        events: The interval's events in commit order, from the ``message/queued`` receipt to the
            closing ``status: idle``, including those of subagent sessions.
        usage: Usage of every model call recorded in the interval, subagents included.
        first_seq: Sequence number of the receipt in the root session.
        idle_seq: Sequence number of the idle that closed the interval (``None`` if it did not close).
    """

    session_id: str
    message_id: str
    final_response: str | None
    finish_reason: EndReason | None
    events: list[SessionEvent]
    usage: RunUsage
    first_seq: int
    idle_seq: int | None


def find_receipt(events: Iterable[SessionEvent], session_id: str, message_id: str) -> int | None:
    """Index in ``events`` of the ``message/queued`` event that records ``message_id`` in ``session_id``."""
    for i, ev in enumerate(events):
        if ev.session_id != session_id or ev.type != EventType.MESSAGE_QUEUED:
            continue
        queued = ev.payload
        if isinstance(queued, MessageQueued) and queued.message_id == message_id:
            return i
    return None


class Interval:
    """The interval opened by ``receipt``: feed it every later event, in commit order, until it closes.

    It keys on the receipt and the first idle of the root session after it
    (:class:`agent.IntervalWatcher`); what it reports is run-level (:class:`agent.RunFacts`). Events
    fed twice (two subscriptions on one connection) are counted once.
    """

    def __init__(self, receipt: SessionEvent, earlier: Iterable[SessionEvent] = ()) -> None:
        """``earlier``: events seen before the receipt, used only to learn subagent sessions."""
        queued = receipt.payload
        if not isinstance(queued, MessageQueued):
            raise ValueError(f"an interval opens at a message/queued event, not {receipt.type}")
        self.session_id = receipt.session_id
        self.first_seq = receipt.seq
        self.events: list[SessionEvent] = [receipt]
        self.usage = RunUsage()
        self._watch = IntervalWatcher(queued.message_id, receipt.session_id)
        self._watch.observe(receipt)
        self._facts = RunFacts()
        self._tree = {receipt.session_id}
        self._seen: dict[str, int] = {receipt.session_id: receipt.seq}
        for ev in earlier:
            self._note_session(ev)

    @property
    def idle_seq(self) -> int | None:
        """Sequence number of the idle that closed the interval (``None`` while it is open)."""
        return self._watch.idle_seq

    @property
    def closed(self) -> bool:
        """Whether the closing idle has been seen."""
        return self._watch.closed

    def feed(self, ev: SessionEvent) -> bool:
        """Take one event (of any session); returns whether the interval is now closed."""
        if self._watch.closed:
            return True
        self._note_session(ev)
        if ev.session_id not in self._tree or ev.seq <= self._seen.get(ev.session_id, 0):
            return False
        self._seen[ev.session_id] = ev.seq
        self.events.append(ev)
        self._count(ev)
        if ev.session_id != self.session_id:
            return False
        self._facts.observe(ev)
        return self._watch.observe(ev)

    def result(self, message_id: str) -> RunResult:
        """The result so far (complete once :attr:`closed`)."""
        last = self._facts.last_end
        return RunResult(
            session_id=self.session_id,
            message_id=message_id,
            final_response=self._facts.final_response,
            finish_reason=last.reason if last is not None else None,
            events=list(self.events),
            usage=self.usage.model_copy(),
            first_seq=self.first_seq,
            idle_seq=self.idle_seq,
        )

    def _note_session(self, ev: SessionEvent) -> None:
        if ev.type == EventType.SESSION_CREATED:
            created = ev.payload
            if isinstance(created, SessionCreated) and created.parent_session_id in self._tree:
                self._tree.add(ev.session_id)

    def _count(self, ev: SessionEvent) -> None:
        if ev.type not in _SPEND_TYPES:
            return
        u = self.usage
        match ev.payload:
            case AssistantMessage() | ModelFailed() as call:
                if call.usage is not None:
                    u.model_calls += 1
                    u.input_tokens += call.usage.input_tokens
                    u.output_tokens += call.usage.output_tokens
                    u.cache_read_tokens += call.usage.cache_read_tokens
                    u.cache_write_tokens += call.usage.cache_write_tokens
                u.cost += call.cost
            case ContextCompacted() as compacted if compacted.usage is not None:
                # The summary call of a compaction: a model call like any other.
                u.model_calls += 1
                u.input_tokens += compacted.usage.input_tokens
                u.output_tokens += compacted.usage.output_tokens
                u.cache_read_tokens += compacted.usage.cache_read_tokens
                u.cache_write_tokens += compacted.usage.cache_write_tokens
                u.cost += compacted.cost
            case ModelCharged() as charged:
                if charged.subagent_session_id in self._tree:
                    return  # the child's calls were counted from its own events (see the module docstring)
                u.charged_tokens += charged.tokens
                u.cost += charged.cost
            case _:
                pass
