"""One in-flight ACP ``session/prompt``: the interval it owns and the stop reason it reports.

ACP must answer every prompt with a ``stopReason``, which the core deliberately never attributes
to a message (invariant 1: a follow-up has no result). Invariant 8 sanctions exactly one bridge:
the ACP prompt owns the interval from its message's ``message/queued`` event to the first
whole-agent ``idle`` after it — watched by the runtime's one interval watcher
(:class:`agent.IntervalWatcher`: receipt, admission, idle) — and reads its stop reason from the
turn that **admitted** the message — an admission fact, not a claim that this message alone
caused what the turn did (the turn may also have consumed steering or context). The small layer
here, :meth:`PromptSlot.observe`, is the only place that pairs the admitting turn with its
``turn/end``, and the consumer test of invariant 11 lists it as the exception.

The mapping, from the admitting turn's ``turn/end``:

* ``max_tokens`` or ``budget`` → ``max_tokens``; ``max_steps`` → ``max_turn_requests``;
* ``end_turn`` with ``modelFinish: refusal`` → ``refusal``; any other ``end_turn`` → ``end_turn``;
* ``error`` or ``interrupted`` → the request fails with a JSON-RPC error carrying the message;
* ``cancelled`` (an interrupt from any source), a message that was never admitted (cancelled while
  queued, so there is no turn), or an explicit ACP ``session/cancel`` → ``cancelled``.

Why a late ``turn/end`` can never settle the next prompt: a slot settles only at an ``idle`` that
follows its own ``message/queued`` (and an idle never commits while a waking message is queued),
and it only reads the ``turn/end`` of the turn named in its own message's ``message/admitted``.
A previous prompt's turn has a different id, and its end precedes the idle that settled it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Literal

from acp import RequestError

from agent import Event, EventType, IntervalWatcher, TurnEnded

StopReason = Literal["end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"]

#: JSON-RPC "internal error": the turn that admitted the prompt failed.
TURN_FAILED = -32603


@dataclass(frozen=True)
class AdmittingTurn:
    """How the turn that admitted an ACP prompt's message ended (from its ``turn/end``)."""

    turn_id: str
    reason: str
    model_finish: str | None = None
    error: str | None = None
    error_kind: str | None = None


def stop_reason(turn: AdmittingTurn | None, *, cancelled: bool) -> StopReason:
    """The ACP stop reason for a settled prompt.

    Args:
        turn: how the admitting turn ended, or ``None`` when the message was never admitted.
        cancelled: whether the prompt was cancelled (ACP ``session/cancel``, or its message
            cancelled while queued).

    Raises:
        RequestError: the admitting turn ended ``error`` or ``interrupted``; the JSON-RPC error
            carries the turn's error message.
    """
    if cancelled or turn is None:
        return "cancelled"
    match turn.reason:
        case "cancelled":
            return "cancelled"
        case "max_tokens" | "budget":
            return "max_tokens"
        case "max_steps":
            return "max_turn_requests"
        case "error" | "interrupted":
            detail = turn.error or f"the turn ended {turn.reason}"
            raise RequestError(
                TURN_FAILED,
                f"the turn failed: {detail}",
                {"turnId": turn.turn_id, "reason": turn.reason, "errorKind": turn.error_kind, "error": turn.error},
            )
        case _:
            return "refusal" if turn.model_finish == "refusal" else "end_turn"


class PromptSlot:
    """The reservation of an ACP session's one in-flight prompt, and the facts of its interval.

    The bridge creates the slot (synchronously, before any ``await``) and feeds it every event of
    the session, in sequence order, *after* the updates for that event were sent to the client;
    :attr:`settled` resolves at the first whole-agent idle after the message was queued.
    """

    def __init__(self, message_id: str) -> None:
        self.message_id = message_id
        self.watch = IntervalWatcher(message_id)
        self.turn: AdmittingTurn | None = None
        #: The message is durable as queued (a cancel can now reach it).
        self.enqueued = False
        #: ``session/cancel`` arrived while this prompt was in flight.
        self.cancel_requested = False
        self.settled: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    @property
    def message_cancelled(self) -> bool:
        """Whether the prompt's message was cancelled while queued (no turn admitted it)."""
        return self.watch.cancelled

    def observe(self, event: Event) -> None:
        """Take in one event of the session (sequence order); settle at the interval's idle."""
        if self.settled.done():
            return
        if event.type == EventType.TURN_END:
            ended = event.payload
            if isinstance(ended, TurnEnded) and self.watch.admitted_by == ended.turn_id:
                self.turn = AdmittingTurn(
                    turn_id=ended.turn_id,
                    reason=ended.reason.value,
                    model_finish=ended.model_finish,
                    error=ended.error,
                    error_kind=ended.error_kind,
                )
        if self.watch.observe(event):
            assert self.watch.idle_seq is not None
            self.settled.set_result(self.watch.idle_seq)

    def dispose(self) -> None:
        """Settle now as cancelled (the connection or the bridge is going away).

        A slot that already settled keeps its outcome: its interval closed before the disposal,
        and the response that reports it may simply not have gone out yet.
        """
        if self.settled.done():
            return
        self.cancel_requested = True
        self.settled.set_result(-1)

    def outcome(self) -> StopReason:
        """The stop reason once settled (raises ``RequestError`` for a failed turn)."""
        return stop_reason(self.turn, cancelled=self.cancel_requested or self.message_cancelled)
