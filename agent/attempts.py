"""The attempts of a session's driver: each reserved with the spend guard, bound by its time, settled.

:class:`Attempts` is the call machinery a model step (:mod:`agent.step`) and a compaction's summary
call (:mod:`agent.compaction`) share, so that every call is checked, reserved, time-bound and
charged the same way. It reads the agent's model, tools, guard and settings live from the agent
(``attempts.agent``: a goal swaps its session's guard, the ACP bridge wraps the tools), and is what
a compaction gets of the running driver.

Decisions, and why:

* **Every attempt is reserved first** (retries and summaries included): the guard holds the
  prompt's upper-bound size plus ``max_tokens``, durable before the call; a refusal ends the turn
  ``budget`` without calling.
* **The guard's time binds a call in flight** (:meth:`Attempts.complete_in_time`): the call is
  cancelled when the deadline or the end of the wall time passes, its streamed text kept
  (marked ``interrupted`` by :meth:`Attempts.cleanup`), its reservation charged in full, and the
  turn ends ``budget``. No call starts with less than ``min_call_seconds`` left.
* **A failed attempt is settled** to the usage it reported, or to its prompt's estimate when its
  answer had started but reported none (:func:`agent.calls.failed_usage` says why), with a
  ``model/error`` event recording whether the provider's breaker was open (a goal does not count
  errors of an outage), how much streamed text was discarded, and whether the usage is an estimate.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from loguru import logger

from agent.calls import ESTIMATED_NOTE, CallId, OutOfTime, commit_assistant, failed_usage, reserve_call, settle_call
from agent.errors import StaleOpening
from agent.events import EventType
from agent.history import History
from agent.messages import Content
from agent.models.base import Model, ModelError, ModelRequest, ModelResponse
from agent.payloads import EndReason
from agent.spend import Refusal, Reservation, Usage
from agent.turns import OpenedTurn, TurnEnd, charge_open_reservations, close_open_tool_calls
from agent.tx import Tx
from agent.writer import DriverWriter

if TYPE_CHECKING:
    from agent.driver import Agent

_T = TypeVar("_T")
#: Receives streamed text as ``(turn_id, text)``.
DeltaListener = Callable[[str, str], None]


class Attempts:
    """The model attempts of one session's driver (see the module docstring)."""

    def __init__(self, agent: Agent, writer: DriverWriter, history: History) -> None:
        #: The agent whose parts are read live (a goal swaps its guard, the ACP bridge wraps its tools).
        self.agent = agent
        self.writer = writer
        self.history = history
        #: The text streamed by the call in flight (kept as ``interrupted`` if the turn is cut short).
        self.stream: list[str] = []
        self.listeners: list[DeltaListener] = []

    async def write(self, fn: Callable[[Tx], _T]) -> _T:
        """A write of the running driver (:class:`~agent.writer.DriverWriter`)."""
        return await self.writer.write(fn)

    def request(self, max_tokens: int) -> ModelRequest:
        """The next step's request from the view as held, measured by the session's model."""
        return self.history.request(self.agent.model, self.agent.config.system, self.agent.tools.specs(), max_tokens)

    # -- one attempt: reserve, call in time, settle -----------------------------------------------

    async def reserve(
        self, turn: OpenedTurn, model: Model, bound: int, max_tokens: int, attempt: int, call_id: CallId
    ) -> Reservation | TurnEnd:
        """Check the guard for one call and make its reservation durable; a refusal ends the turn ``budget``."""
        price = model.price
        held = self.agent.guard.reserve(
            call_id,
            bound + max_tokens,
            price.bound(bound, max_tokens) if price else None,
            min_left=self.agent.config.min_call_seconds,
        )
        if isinstance(held, Refusal):
            return TurnEnd(reason=EndReason.BUDGET, error=held.reason)
        reservation = partial(
            reserve_call,
            call_id=call_id,
            session_id=self.agent.session_id,
            turn_id=turn.turn_id,
            guard_id=self.agent.guard.id,
            provider=model.provider,
            model=model.name,
            attempt=attempt,
            tokens=held.tokens,
            cost=held.cost,
        )
        try:
            await self.write(reservation)  # with the turn's opening, when the driver planned it
        except StaleOpening:
            self.agent.guard.release(call_id)  # rolled back with the opening: the call is never made
            raise
        return held

    async def complete_in_time(
        self, request: ModelRequest, turn_id: str, model: Model | None = None, quiet: bool = False
    ) -> ModelResponse:
        """One model attempt, cancelled if the guard's time runs out while it is in flight.

        The guard's end is read again when the wait runs out, so a limit raised meanwhile (a goal's
        budgets edited) extends the call; a time limit set where there was none applies from the
        next call. ``quiet``: the text is not streamed to listeners (a summary is no answer of the
        agent's). Raises :class:`OutOfTime` after the cancellation.
        """
        if self.writer.opening_pending:
            # Never expected (a call's reservation carries the opening): no model sees an admitted
            # message before its admission is durable.
            await self.write(nothing)
        min_seconds = self.agent.config.min_call_seconds
        left = self.agent.guard.time_left()
        if left is not None and left < min_seconds:
            # Checked again here: the reservation's write may have waited (a full disk) after the guard's check.
            end = self.agent.guard.ends_at()
            when = end.isoformat() if end is not None else "the deadline"
            raise OutOfTime(
                f"deadline {when} is {max(left, 0.0):.1f}s away, less than the "
                f"{min_seconds:g}s a model call needs to start: the call was not started"
            )
        model = model or self.agent.model
        on_delta = None if quiet else self._on_delta(turn_id)
        if left is None:
            # No time limit binds this call (one set meanwhile applies from the next call): await
            # it in this task; a task and a wait per call would cost a loop pass.
            return await model.complete(request, on_delta)
        call = asyncio.ensure_future(model.complete(request, on_delta))
        try:
            while True:
                left = self.agent.guard.time_left()
                if left is not None and left <= 0:
                    break
                done, _ = await asyncio.wait({call}, timeout=left)
                if done:
                    return call.result()
            return await self._cut(call)
        finally:
            if not call.done():
                # The turn itself was cancelled (an interrupt, a stop): the call goes with it.
                call.cancel()
                await asyncio.wait({call})
                if not call.cancelled():
                    call.exception()  # retrieved: the turn's own cancellation is what counts

    async def _cut(self, call: asyncio.Future[ModelResponse]) -> ModelResponse:
        """Cancel a call whose time ran out; raises :class:`OutOfTime` unless it finished meanwhile."""
        end = self.agent.guard.ends_at()
        call.cancel()
        await asyncio.wait({call})
        if not call.cancelled():
            return call.result()  # it finished as the time ran out
        late = -(self.agent.guard.time_left() or 0.0)
        logger.info(
            "session {}: model call cancelled at the end of its time ({}), {:.3f}s after it",
            self.agent.session_id,
            end,
            late,
        )
        when = end.isoformat() if end is not None else "the deadline"
        raise OutOfTime(f"deadline {when} passed during the model call: it was cancelled {late:.3f}s after")

    def _on_delta(self, turn_id: str) -> Callable[[str], None]:
        def on_delta(text: str) -> None:
            self.stream.append(text)
            for listener in list(self.listeners):
                try:
                    listener(turn_id, text)
                except Exception:
                    logger.exception("delta listener failed")

        return on_delta

    def commit_answer(
        self, tx: Tx, *, call_id: str, turn_id: str, content: Content, finish: str, usage: Usage, cost: float
    ) -> None:
        """Settle a call to its answer and append the answer to the session (in ``tx``)."""
        commit_assistant(
            tx,
            session_id=self.agent.session_id,
            turn_id=turn_id,
            call_id=call_id,
            model=self.agent.model.spec,
            content=content,
            finish=finish,
            usage=usage,
            cost=cost,
        )
        guard = self.agent.guard
        tx.after_commit(lambda: guard.settle(call_id, usage.total, cost))

    async def settle_failed(
        self,
        turn: OpenedTurn,
        call_id: str,
        exc: ModelError,
        *,
        attempt: int,
        retry: bool,
        prompt_bound: int,
        breaker_open: bool = False,
        prompt_estimate: int | None = None,
    ) -> None:
        """Settle a failed attempt (the usage it reported, else its prompt's estimate if its answer had
        started: ``prompt_estimate``, the likely size, else ``prompt_bound``) and record it as a
        ``model/error`` event; its streamed text is discarded."""
        usage, estimated = failed_usage(exc, prompt_bound, prompt_estimate)
        cost = self.agent.model.price.cost(usage) if self.agent.model.price else 0.0
        guard = self.agent.guard
        partial_text = "".join(self.stream)
        self.stream = []
        message = exc.message[:2000]
        data: dict[str, Any] = {
            "turnId": turn.turn_id,
            "attempt": attempt,
            "kind": exc.kind.value,
            "message": message,
            "retrying": retry,
            "breakerOpen": breaker_open,
            "discardedChars": len(partial_text),
            "usage": usage.model_dump(),
            "cost": cost,
        }
        if estimated:
            data["estimated"] = True

        def run(tx: Tx) -> None:
            error = message + ESTIMATED_NOTE if estimated else message
            settle_call(tx, call_id, usage, cost, error_class=exc.kind.value, error=error)
            tx.emit(self.agent.session_id, EventType.MODEL_ERROR, data)
            tx.after_commit(lambda: guard.settle(call_id, usage.total, cost))

        await self.write(run)

    async def cleanup(self, turn: OpenedTurn, tool_text: str, error_class: str = "interrupted") -> None:
        """Close a turn cut short: its streamed text committed as ``interrupted``, every tool call of
        the turn without a result given ``tool_text``, open reservations charged in full."""
        partial_text = "".join(self.stream)
        self.stream = []
        guard, session_id, spec = self.agent.guard, self.agent.session_id, self.agent.model.spec

        def run(tx: Tx) -> None:
            if partial_text:
                tx.emit(
                    session_id,
                    EventType.ASSISTANT_MESSAGE,
                    {
                        "turnId": turn.turn_id,
                        "content": [{"type": "text", "text": partial_text}],
                        "finishReason": None,
                        "interrupted": True,
                        "model": spec,
                    },
                )
            close_open_tool_calls(tx, session_id, turn.turn_id, turn.start_seq, tool_text)
            charged = charge_open_reservations(tx, session_id, turn.turn_id, error_class)

            def settle() -> None:
                for call_id in charged:
                    guard.settle_in_full(call_id)

            tx.after_commit(settle)

        await asyncio.shield(self.write(run))
        self.history.invalidate()  # reload: the cleanup wrote history the loop did not build


def nothing(tx: Tx) -> None:
    """A write of nothing of its own: what the driver deferred (a step's tool result, a planned
    opening) commits with it."""
