"""The driver: :class:`Agent`, one asyncio task per session that runs turns.

``followup``/``steer``/``inject`` only make a message durable as queued and return ``None``; the
committed ``message/queued`` event wakes the driver. The driver loop opens a turn in the same
transaction that admits the waking batch, or commits ``idle`` in a transaction that finds nothing
waking (see :mod:`agent.inbox` for why no input is stranded). A turn planned on the queue this node
knows opens in the write that reserves its first call, checked there (:mod:`agent.opening`), and a
goal's continuing decision may be handed to go first in that write (:meth:`Agent.open_after`).
``when_idle()`` and ``status`` observe the whole agent, never one message.

Cancellation, in one place:

* ``interrupt()`` cancels the running turn's task with the reason ``cancelled``. The turn's
  handler commits the text streamed so far (marked ``interrupted``), gives every tool call of the
  turn without a result an error result, charges an open reservation in full, and the turn ends
  ``cancelled``. Queued messages stay queued unless the caller asked to discard them; a follow-up
  that arrives while the interrupt settles is simply queued and runs next.
* ``stop(grace)`` stops taking turns; a running turn ends ``interrupted`` at its next safe point
  (before a model call) or, when the grace period runs out, by cancellation as above.
* Cancelling the driver task itself (a hard stop) leaves the turn open in the store, exactly as
  a crash would; crash repair closes it when the store is next opened.
* A storage failure (the disk full) never ends the driver: every write a running driver makes
  is retried until it commits (:class:`~agent.writer.DriverWriter`); the session waits meanwhile
  and goes on by itself when space returns. Writes a caller asks for (``followup``, ``cancel_message``) raise
  :class:`~agent.errors.StorageUnavailable` instead, so that new input is refused, not half-taken.
* The spend guard's time binds a call in flight: when its deadline (or the end of its wall time)
  passes during a model call, the call is cancelled, its streamed text is kept (marked
  ``interrupted``), its reservation is charged in full, and the turn ends ``budget``. The overshoot
  is the cancellation latency, logged with the cut. No call starts with less than
  ``AgentConfig.min_call_seconds`` left, and a retry's backoff never sleeps past the end.

The parts, each in its module: the settings (:mod:`agent.config`), the retried writes
(:mod:`agent.writer`), the view as the driver holds it (:mod:`agent.history`), a model step with
its retries (:mod:`agent.step`), each attempt reserved, time-bound and settled
(:mod:`agent.attempts`, also compaction's narrow interface), and a step's tool calls
(:mod:`agent.toolcalls`), and the calls that enqueue or cancel messages (:mod:`agent.intake`).
This module keeps the rest of the public face, the loop and the turn.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from loguru import logger

from agent.attempts import Attempts, DeltaListener
from agent.config import AgentConfig, SlotFactory
from agent.errors import LeaseLost, StaleOpening, StorageUnavailable
from agent.events import Event, EventType
from agent.history import History
from agent.inbox import admit, cancel_all
from agent.intake import MessageIntake
from agent.messages import CancelReason, Delivery, ToolUseBlock
from agent.models.base import ConvMessage, FinishReason, Model, WireCache
from agent.opening import Openings
from agent.payloads import AgentStatus, EndReason, MessageQueued, StatusChanged
from agent.spend import SpendGuard
from agent.step import ModelStep
from agent.store import Store
from agent.toolcalls import ToolCalls
from agent.tools.base import ToolRegistry
from agent.turns import CANCELLED_TOOL_TEXT, OpenedTurn, TurnEnd, end_turn, take_or_idle
from agent.tx import SessionState, Tx
from agent.writer import DriverWriter


@dataclass(frozen=True)
class StatusSnapshot:
    """A status and the sequence number of the event that recorded it."""

    status: AgentStatus
    seq: int


class Agent(MessageIntake):
    """One session's agent. Create through :class:`agent.runtime.Runtime`."""

    def __init__(
        self,
        *,
        store: Store,
        session_id: str,
        model: Model,
        tools: ToolRegistry,
        guard: SpendGuard,
        config: AgentConfig,
        state: SessionState,
        workdir: Path | None = None,
        slot: SlotFactory | None = None,
        tool_extra: dict[str, Any] | None = None,
        summary_model: Model | None = None,
    ) -> None:
        self.store = store
        self.session_id = session_id
        self.model = model
        self.tools = tools
        self.guard = guard
        self.config = config
        self.workdir = workdir
        self._slot = slot
        #: Handed to every tool call as ``ToolContext.extra`` (the runtime puts itself there).
        self.tool_extra = dict(tool_extra or {})
        #: The model that writes compaction summaries (``None``: the session's own).
        self.summary_model = summary_model
        self._status = AgentStatus(state.status)
        self._status_seq = state.status_seq
        self._idle_waiters: list[asyncio.Future[StatusSnapshot]] = []
        self._wake = asyncio.Event()
        self._steer_hint = True
        self._stopping = False
        self._cancel_reason: EndReason | None = None
        #: Who asked for the interrupt in progress (recorded in the turn's end).
        self._cancel_caller: dict[str, int | str] | None = None
        self._turn_task: asyncio.Task[TurnEnd] | None = None
        self._turn_finished: asyncio.Future[None] | None = None
        self._driver: asyncio.Task[None] | None = None
        self._waiting_slot = False
        self._writer = DriverWriter(store, session_id, self.is_stopping)
        self._view = History(store, session_id, model)
        self._openings = Openings(store, session_id, self._writer)
        self._attempts = Attempts(self, self._writer, self._view)
        self._step = ModelStep(self._attempts)
        self._tools = ToolCalls(self, self._writer, self._view)

    # -- the public API --------------------------------------------------------------------

    @property
    def status(self) -> AgentStatus:
        """Whole-agent status as of the last committed status event."""
        return self._status

    @property
    def wire(self) -> WireCache:
        """The model's converted form of this session's history; its counters are the conversion
        work done so far (each message once, whatever the length of the history)."""
        return self._view.wire

    @property
    def status_seq(self) -> int:
        """Sequence number of the event that recorded :attr:`status`."""
        return self._status_seq

    async def interrupt(self, discard_queued: bool = False, caller: Mapping[str, int | str] | None = None) -> None:
        """End the running turn ``cancelled``; optionally cancel every queued message too.

        ``caller`` (a person's ``uid``/``pid`` or ``web`` name) is kept in the ``turn/end`` and
        ``message/cancelled`` events this writes. Returns once the turn's end is durable.
        Interrupting an idle agent does nothing.
        """
        task, finished = self._turn_task, self._turn_finished
        if self._status is AgentStatus.IDLE and task is None:
            return
        if discard_queued:
            await self.store.transact(
                partial(cancel_all, session_id=self.session_id, reason=CancelReason.DISCARDED, caller=caller),
                session=self.session_id,
            )
            # A turn the driver committed just before that transaction has its task by now.
            task, finished = self._turn_task, self._turn_finished
        # A second cancel while the first settles would break the turn's cleanup (and the driver).
        if task is not None and not task.done() and self._cancel_reason is None:
            self._cancel_reason = EndReason.CANCELLED
            self._cancel_caller = dict(caller) if caller else None
            task.cancel()
        if finished is not None:
            await asyncio.shield(finished)

    def open_after(self, write: Callable[[Tx], Any], rows: Sequence[Mapping[str, Any]]) -> asyncio.Future[Any] | None:
        """Hand the driver ``write`` — one that queues ``rows`` (waking messages, as
        :func:`agent.inbox.queued` reads them) on this idle session — to commit first in the write
        that opens the turn admitting them and reserves its first call (:mod:`agent.opening`): the
        future gets ``write``'s result once committed, or its error, or
        :class:`~agent.errors.StaleOpening` when the turn could not be opened so (then nothing of
        ``write`` was committed: commit it yourself). ``None``: the driver cannot take it now (it is
        not idle and waiting, it has no view in hand, or no turn slot is free)."""
        driver, slot = self._driver, self._slot() if self._slot is not None else None
        if driver is None or driver.done() or self._stopping or self._turn_task is not None:
            return None
        if self._status is not AgentStatus.IDLE or self._steer_hint or not self._view.loaded:
            return None
        if isinstance(slot, asyncio.Semaphore) and slot.locked():
            return None  # the decision would wait in memory for a turn to end elsewhere
        future = self._openings.hand(write, rows)
        if future is not None:
            self._wake.set()
        return future

    async def when_idle(self) -> StatusSnapshot:
        """Resolve at the next whole-agent idle (at once if the agent is idle now)."""
        if self._status is AgentStatus.IDLE:
            return StatusSnapshot(self._status, self._status_seq)
        fut: asyncio.Future[StatusSnapshot] = asyncio.get_running_loop().create_future()
        self._idle_waiters.append(fut)
        return await fut

    def add_tools(self, tools: list[Any]) -> None:
        """Offer more tools from the next model step on (names already present are kept)."""
        for tool in tools:
            if self.tools.get(tool.name) is None:
                self.tools.add(tool)

    def add_delta_listener(self, listener: DeltaListener) -> Callable[[], None]:
        """Receive streamed text as ``(turn_id, text)`` (ephemeral; not durable)."""
        listeners = self._attempts.listeners
        listeners.append(listener)
        return lambda: listeners.remove(listener) if listener in listeners else None

    def view(self) -> list[ConvMessage] | None:
        """The model's view of the conversation as the driver holds it (``None``: not loaded)."""
        return self._view.copy()

    # -- events ----------------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        """Observe one committed event of this session (called in commit order)."""
        if event.type == EventType.STATUS and isinstance(changed := event.payload, StatusChanged):
            self._status = changed.status
            self._status_seq = event.seq
            if self._status is AgentStatus.IDLE:
                snap = StatusSnapshot(self._status, event.seq)
                waiters, self._idle_waiters = self._idle_waiters, []
                for fut in waiters:
                    if not fut.done():
                        fut.set_result(snap)
        elif event.type == EventType.MESSAGE_QUEUED and isinstance(queued := event.payload, MessageQueued):
            if queued.delivery is not Delivery.FOLLOWUP:
                self._steer_hint = True
            if queued.delivery.wakes:
                self._wake.set()

    # -- the driver loop -------------------------------------------------------------------

    def start(self, spawn: Callable[[Any], asyncio.Task[None]] | None = None) -> None:
        """Start the driver task (``spawn`` creates it in the caller's task group)."""
        if self._driver is not None:
            return
        coro = self._run()
        self._driver = spawn(coro) if spawn is not None else asyncio.create_task(coro)

    async def stop(self, grace: float = 10.0) -> None:
        """Stop taking turns; a running turn ends at a safe point, or ``interrupted`` after ``grace``."""
        self._stopping = True
        self._wake.set()
        driver = self._driver
        if driver is None or driver.done():
            return
        if self._waiting_slot:
            # No turn is open while the driver waits for a slot: nothing to let finish.
            driver.cancel()
        await asyncio.wait([driver], timeout=grace)
        task = self._turn_task
        if not driver.done() and task is not None and not task.done() and self._cancel_reason is None:
            self._cancel_reason = EndReason.INTERRUPTED
            task.cancel()
        await asyncio.wait([driver], timeout=max(grace, 5.0))
        if not driver.done():
            driver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await driver

    def is_stopping(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stopping

    @contextlib.asynccontextmanager
    async def _slot_cm(self) -> AsyncIterator[None]:
        if self._slot is None:
            yield
            return
        cm = self._slot()
        # Waiting for a slot is a safe point: stop() may cancel the driver while it waits.
        self._waiting_slot = True
        try:
            await cm.__aenter__()
        finally:
            self._waiting_slot = False
        try:
            yield
        except BaseException as exc:
            if not await cm.__aexit__(type(exc), exc, exc.__traceback__):
                raise
        else:
            await cm.__aexit__(None, None, None)

    async def _run(self) -> None:
        # Expected and handled, so one line without a traceback (an error with one is for bugs): a
        # lost lease (another node drives the session now and repairs the turn) and a store outage
        # met while stopping (the driver's writes wait for the store until then; crash repair closes
        # the turn at the next start).
        try:
            await self._take_turns()
        except LeaseLost as exc:
            logger.info("{}; the session is let go", exc)
        except StorageUnavailable as exc:
            logger.info("session {} stopped while the store could not write: {}", self.session_id, exc.message)
        finally:
            self._openings.close()  # a write handed and never taken hears so (agent.opening)

    async def _take_turns(self) -> None:
        has_work = True
        while not self.is_stopping():
            if not has_work:
                await self._wake.wait()
                if self.is_stopping():
                    break
            self._wake.clear()
            async with self._slot_cm():
                if self.is_stopping():
                    break
                turn = self._openings.planned(not self._steer_hint and self._view.loaded)
                if turn is None and self._openings.nothing_to_open():
                    has_work = False
                    continue
                if turn is None:
                    self._openings.opened_on_read()
                    turn = await self._writer.write(partial(take_or_idle, session_id=self.session_id))
                if turn is None:
                    has_work = False
                    continue
                has_work = await self._drive(turn)
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise asyncio.CancelledError

    async def _drive(self, turn: OpenedTurn) -> bool:
        """Run an opened turn and commit its end; whether more work waits."""
        finished = asyncio.get_running_loop().create_future()
        self._turn_finished = finished
        try:
            end = await self._execute_turn(turn)
            if end.reason is EndReason.INTERRUPTED and self._writer.opening_pending:
                # Stopped before the planned turn wrote anything: it is not opened at all (what it
                # would have admitted stays queued for the next start).
                raise StaleOpening(f"session {self.session_id}: stopping before its turn was opened")
            ending = partial(end_turn, session_id=self.session_id, turn_id=turn.turn_id, end=end)
            return await asyncio.shield(self._writer.write(ending))
        except StaleOpening as exc:
            # The planned opening found the session changed: nothing of the turn was written and no
            # model was called. What the driver holds of it (the view, the guard's hold) is undone;
            # the turn is opened again on the state read (agent.opening).
            logger.debug("{}; opening it again", exc)
            self._writer.drop_opening()
            self._view.invalidate()
            self._openings.stale(exc)
            return True
        finally:
            self._openings.settled()
            if not finished.done():
                finished.set_result(None)
            self._turn_finished = None

    def _pending_cancel(self) -> EndReason | None:
        # A method, so type checkers do not assume the attribute kept the value set before an await.
        return self._cancel_reason

    async def _execute_turn(self, turn: OpenedTurn) -> TurnEnd:
        self._cancel_reason, self._cancel_caller = None, None
        task = asyncio.create_task(self._turn_body(turn), name=f"turn {turn.turn_id}")
        self._turn_task = task
        try:
            return await task
        except asyncio.CancelledError:
            # Cancelled before its first step, the body never ran, so it could not handle the
            # cancel: end the turn here (nothing ran, so nothing needs cleaning up).
            me = asyncio.current_task()
            reason = self._pending_cancel()
            if reason is None or not task.cancelled() or (me is not None and me.cancelling()):
                raise
            self._view.invalidate()  # the body did not append the admitted batch; reload
            return self._cancelled_end(reason, 0)
        finally:
            self._turn_task = None

    def _cancelled_end(self, reason: EndReason, steps: int) -> TurnEnd:
        """How a turn cut short by an interrupt or the daemon's stop ends (with who asked)."""
        if reason is EndReason.CANCELLED:
            return TurnEnd(reason=reason, error="interrupted by request", steps=steps, caller=self._cancel_caller)
        return TurnEnd(reason=reason, error="the daemon is shutting down", steps=steps)

    # -- one turn --------------------------------------------------------------------------

    async def _turn_body(self, turn: OpenedTurn) -> TurnEnd:
        steps = 0
        try:
            if not self._view.loaded:
                await self._view.reload()
            else:
                self._view.append_admitted(turn.admitted)
            while True:
                ended = await self._before_step(turn, steps)
                if ended is not None:
                    return ended
                out = await self._step.run(turn)
                if isinstance(out, TurnEnd):
                    return out.model_copy(update={"steps": steps})
                steps += 1
                uses = [b for b in out.content if isinstance(b, ToolUseBlock)]
                if out.finish_reason is FinishReason.MAX_TOKENS:
                    return TurnEnd(reason=EndReason.MAX_TOKENS, model_finish=out.finish_reason, steps=steps)
                if not uses:
                    return TurnEnd(reason=EndReason.END_TURN, model_finish=out.finish_reason, steps=steps)
                await self._tools.run(turn, uses)
        except asyncio.CancelledError:
            reason = self._cancel_reason
            task = asyncio.current_task()
            if reason is None or task is None:
                raise
            task.uncancel()
            if reason is EndReason.INTERRUPTED and self._writer.opening_pending:
                return self._cancelled_end(reason, steps)  # nothing written: not opened at all (_drive)
            await self._attempts.cleanup(turn, CANCELLED_TOOL_TEXT)
            return self._cancelled_end(reason, steps)
        except (LeaseLost, StaleOpening):
            # Nothing more is written here, not even a cleanup: the new holder repairs the turn; or
            # the turn was never opened (the driver opens it again: _drive).
            raise
        except Exception as exc:
            if isinstance(exc, StorageUnavailable):  # the store logs the outage itself (once)
                logger.info("turn {} of session {} ends: {}", turn.turn_id, self.session_id, exc.message)
            else:
                logger.exception("turn {} of session {} failed", turn.turn_id, self.session_id)
            await self._attempts.cleanup(turn, f"not run: the turn failed ({type(exc).__name__})")
            return TurnEnd(
                reason=EndReason.ERROR,
                error=f"internal error: {type(exc).__name__}: {exc}",
                error_kind="internal",
                steps=steps,
            )

    async def _before_step(self, turn: OpenedTurn, steps: int) -> TurnEnd | None:
        """Admit queued steering and context; how the turn ends if it must end before the step."""
        if self._steer_hint:
            self._steer_hint = False
            admit_now = partial(admit, session_id=self.session_id, turn_id=turn.turn_id, waking=False)
            self._view.append_admitted(await self._writer.write(admit_now))
        if self._stopping:
            return TurnEnd(reason=EndReason.INTERRUPTED, error="the daemon is shutting down", steps=steps)
        if steps >= self.config.max_steps:
            return TurnEnd(reason=EndReason.MAX_STEPS, steps=steps)
        return None
