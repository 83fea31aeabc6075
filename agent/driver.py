"""The driver: :class:`Agent`, one asyncio task per session that runs turns.

``followup``/``steer``/``inject`` only make a message durable as queued and return ``None``; the
committed ``message/queued`` event wakes the driver. The driver loop opens a turn in the same
transaction that admits the waking batch, or commits ``idle`` in a transaction that finds nothing
waking (see :mod:`agent.inbox` for why no input is stranded). ``when_idle()`` and ``status``
observe the whole agent, never one message.

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
  is retried until it commits (:meth:`Agent._write`); the session waits meanwhile and goes on by
  itself when space returns. Writes a caller asks for (``followup``, ``cancel_message``) raise
  :class:`~agent.errors.StorageUnavailable` instead, so that new input is refused, not half-taken.
* The spend guard's time binds a call in flight: when its deadline (or the end of its wall time)
  passes during a model call, the call is cancelled, its streamed text is kept (marked
  ``interrupted``), its reservation is charged in full, and the turn ends ``budget``. The overshoot
  is the cancellation latency, logged with the cut. No call starts with less than
  ``AgentConfig.min_call_seconds`` left, and a retry's backoff never sleeps past the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from loguru import logger
from pydantic import BaseModel, ConfigDict, Field

from agent.calls import CallId as CallId  # re-exported: its home moved
from agent.calls import OutOfTime, commit_assistant, reserve_call, settle_call
from agent.compaction import CANCELLED_TOOL_TEXT, compact_view
from agent.context import ContextMeter, ContextPolicy, load_view
from agent.context import history_message as history_message  # re-exported: its home moved
from agent.errors import StorageUnavailable
from agent.events import Event, EventType
from agent.ids import MessageId
from agent.inbox import Admitted, admit, cancel, cancel_all, enqueue
from agent.messages import (
    CancelReason,
    Content,
    Delivery,
    Source,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    parse_content,
)
from agent.models.base import (
    ConvMessage,
    FinishReason,
    Model,
    ModelError,
    ModelErrorKind,
    ModelRequest,
    ModelResponse,
    WireCache,
)
from agent.payloads import AgentStatus, EndReason, MessageQueued, StatusChanged
from agent.spend import Refusal, Reservation, SpendGuard, Usage, estimator_for
from agent.store import SessionState, Store, Tx
from agent.tools.base import ToolContext, ToolRegistry
from agent.turns import (
    OpenedTurn,
    TurnEnd,
    charge_open_reservations,
    close_open_tool_calls,
    end_turn,
    take_or_idle,
)

#: First and longest wait between attempts of a write the store refused for lack of storage.
STORAGE_RETRY_FIRST = 0.5
STORAGE_RETRY_MAX = 15.0
_T = TypeVar("_T")


@dataclass(slots=True)
class _Deferred:
    """A tool result's write, committed with the driver's next write (see :meth:`Agent._write`)."""

    write: Callable[[Tx], None]
    #: Set on the store thread when the transaction that made the write commits.
    committed: bool = False

    def mark(self) -> None:
        self.committed = True


def _with_deferred(deferred: tuple[_Deferred, ...], fn: Callable[[Tx], _T], tx: Tx) -> _T:
    # On the store thread, so ``committed`` is exact: a write an earlier transaction committed
    # (its caller cancelled before it could see so) is never made twice.
    for item in deferred:
        if not item.committed:
            item.write(tx)
            tx.on_commit(item.mark)
    return fn(tx)


@dataclass(frozen=True)
class StatusSnapshot:
    """A status and the sequence number of the event that recorded it."""

    status: AgentStatus
    seq: int


class RetryPolicy(BaseModel):
    """How the driver retries failed model attempts (retryable kinds and malformed answers only)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_attempts: int = Field(default=4, ge=1)
    base_delay: float = Field(default=0.5, ge=0)
    max_delay: float = Field(default=30.0, ge=0)
    jitter: float = Field(default=0.2, ge=0, le=1)
    #: A ``Retry-After`` longer than this is not waited out inside the turn (which holds a
    #: concurrency slot): the attempt fails and the turn ends ``error``; a goal then backs off
    #: durably, without holding anything.
    max_retry_after: float = Field(default=300.0, ge=0)

    def retries(self, attempt: int, retry_after: float | None) -> bool:
        """Whether a retryable failure of attempt ``attempt`` is retried within the turn."""
        return attempt < self.max_attempts and (retry_after is None or retry_after <= self.max_retry_after)

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait before attempt ``attempt + 1``."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), max(self.max_delay, retry_after))
        raw = min(self.max_delay, self.base_delay * float(2 ** (attempt - 1)))
        return raw * (1 + self.jitter * (2 * random.random() - 1))


class AgentConfig(BaseModel):
    """Per-session driver settings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    system: str | None = None
    max_steps: int = Field(default=40, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    retry: RetryPolicy = RetryPolicy()
    #: No model call starts with less than this many seconds left before the spend guard's
    #: deadline or the end of its wall time (a call cut off there is paid for and yields nothing).
    min_call_seconds: float = Field(default=5.0, ge=0)
    #: When and how the model's view is compacted (:mod:`agent.context`).
    context: ContextPolicy = ContextPolicy()


SlotFactory = Callable[[], AbstractAsyncContextManager[Any]]
DeltaListener = Callable[[str, str], None]


class Agent:
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
        self._status = AgentStatus(state.status)
        self._status_seq = state.status_seq
        self._idle_waiters: list[asyncio.Future[StatusSnapshot]] = []
        self._wake = asyncio.Event()
        self._steer_hint = True
        self._stopping = False
        self._cancel_reason: EndReason | None = None
        self._turn_task: asyncio.Task[TurnEnd] | None = None
        self._turn_finished: asyncio.Future[None] | None = None
        self._history: list[ConvMessage] | None = None
        #: The history as the model converted it, one message at a time (reset with the history).
        self._wire = WireCache()
        self._estimator = estimator_for(model.spec)
        self._meter = ContextMeter(self._estimator)
        #: The model that writes compaction summaries (``None``: the session's own).
        self.summary_model = summary_model
        self._stream: list[str] = []
        self._delta_listeners: list[DeltaListener] = []
        self._driver: asyncio.Task[None] | None = None
        self._waiting_slot = False
        self._deferred: list[_Deferred] = []

    # -- the public API --------------------------------------------------------------------

    @property
    def status(self) -> AgentStatus:
        """Whole-agent status as of the last committed status event."""
        return self._status

    @property
    def wire(self) -> WireCache:
        """The model's converted form of this session's history; its counters are the conversion
        work done so far (each message once, whatever the length of the history)."""
        return self._wire

    @property
    def status_seq(self) -> int:
        """Sequence number of the event that recorded :attr:`status`."""
        return self._status_seq

    async def followup(
        self,
        content: str | Content | Any,
        *,
        message_id: MessageId | str | None = None,
        source: Source | None = None,
        pending_key: str | None = None,
        yields_to_followup: bool = False,
    ) -> None:
        """Enqueue a follow-up: durable as queued when this returns; it opens or waits for the next turn."""
        await self._enqueue(Delivery.FOLLOWUP, content, message_id, source, pending_key, yields_to_followup)

    async def steer(
        self, content: str | Content | Any, *, message_id: MessageId | str | None = None, source: Source | None = None
    ) -> None:
        """Enqueue steering: joins the running turn at its next model step; wakes an idle agent."""
        await self._enqueue(Delivery.STEER, content, message_id, source, None, False)

    async def inject(
        self, content: str | Content | Any, *, message_id: MessageId | str | None = None, source: Source | None = None
    ) -> None:
        """Enqueue context: admitted with the next model step; never wakes the agent."""
        await self._enqueue(Delivery.CONTEXT, content, message_id, source, None, False)

    async def enqueue(
        self,
        content: str | Content | Any,
        *,
        delivery: Delivery | str = Delivery.FOLLOWUP,
        message_id: MessageId | str | None = None,
        source: Source | None = None,
    ) -> MessageId:
        """Validate and enqueue with a delivery given by name; returns the message's id (a receipt)."""
        from agent.messages import parse_delivery

        mid = MessageId.parse(message_id) if message_id is not None else MessageId.new()
        await self._enqueue(parse_delivery(delivery), content, mid, source, None, False)
        return mid

    async def _enqueue(
        self,
        delivery: Delivery,
        content: object,
        message_id: MessageId | str | None,
        source: Source | None,
        pending_key: str | None,
        yields: bool,
    ) -> None:
        blocks = parse_content(content)
        mid = MessageId.parse(message_id) if message_id is not None else None
        await self.store.transact(
            partial(
                enqueue,
                session_id=self.session_id,
                content=blocks,
                delivery=delivery,
                message_id=mid,
                source=source,
                pending_key=pending_key,
                yields_to_followup=yields,
            )
        )

    async def cancel_message(self, message_id: MessageId | str, reason: str = CancelReason.CANCELLED) -> None:
        """Cancel a queued message. Raises ``InvalidTransition`` if it was already admitted."""
        mid = MessageId.parse(message_id)
        await self.store.transact(partial(cancel, session_id=self.session_id, message_id=mid, reason=reason))

    async def interrupt(self, discard_queued: bool = False) -> None:
        """End the running turn ``cancelled``; optionally cancel every queued message too.

        Returns once the turn's end is durable. Interrupting an idle agent does nothing.
        """
        task, finished = self._turn_task, self._turn_finished
        if self._status is AgentStatus.IDLE and task is None:
            return
        if discard_queued:
            await self.store.transact(partial(cancel_all, session_id=self.session_id, reason=CancelReason.DISCARDED))
            # A turn the driver committed just before that transaction has its task by now.
            task, finished = self._turn_task, self._turn_finished
        # A second cancel while the first settles would break the turn's cleanup (and the driver).
        if task is not None and not task.done() and self._cancel_reason is None:
            self._cancel_reason = EndReason.CANCELLED
            task.cancel()
        if finished is not None:
            await asyncio.shield(finished)

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
        self._delta_listeners.append(listener)
        return lambda: self._delta_listeners.remove(listener) if listener in self._delta_listeners else None

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
                turn = await self._write(partial(take_or_idle, session_id=self.session_id))
                if turn is None:
                    has_work = False
                    continue
                finished = asyncio.get_running_loop().create_future()
                self._turn_finished = finished
                try:
                    end = await self._execute_turn(turn)
                    has_work = await asyncio.shield(
                        self._write(partial(end_turn, session_id=self.session_id, turn_id=turn.turn_id, end=end))
                    )
                finally:
                    if not finished.done():
                        finished.set_result(None)
                    self._turn_finished = None
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise asyncio.CancelledError

    async def _write(self, fn: Callable[[Tx], _T]) -> _T:
        """A write the running driver depends on, retried while the store cannot write.

        A storage failure (the disk full) must not end the driver, let alone lose the turn: the
        write is tried again with backoff, and at once when another write gets through, so the
        session continues by itself when space returns. The store logs the failure once; while
        stopping, the failure is raised and crash repair closes the turn at the next start.

        A step's only tool result is not committed on its own: it goes in the same transaction as
        the driver's next write (the next call's reservation, steering admitted, the turn's end or
        its cleanup), which follows at once, with nothing awaited in between but that write. So a
        step costs two commits (the assistant message; its tool result with the next reservation)
        and a crash between the tool's end and that commit leaves what a crash just before the
        result's own commit left: a call without a result, repaired as "outcome unknown". Several
        tool calls of one step run in parallel and each result is committed as it comes.
        """
        delay = STORAGE_RETRY_FIRST
        while True:
            deferred = tuple(self._deferred)
            try:
                result = await self.store.transact(partial(_with_deferred, deferred, fn) if deferred else fn)
                if deferred:
                    self._deferred = [d for d in self._deferred if not d.committed]
                return result
            except StorageUnavailable as exc:
                if self._stopping:
                    raise
                logger.debug(
                    "session {}: a write waits for the store ({}); trying again in up to {:.1f}s",
                    self.session_id,
                    exc,
                    delay,
                )
                if await self.store.wait_writable(delay):
                    await asyncio.sleep(STORAGE_RETRY_FIRST / 10)
                delay = min(delay * 2, STORAGE_RETRY_MAX)

    def _pending_cancel(self) -> EndReason | None:
        # A method, so type checkers do not assume the attribute kept the value set before an await.
        return self._cancel_reason

    async def _execute_turn(self, turn: OpenedTurn) -> TurnEnd:
        self._cancel_reason = None
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
            self._history = None  # the body did not append the admitted batch; reload
            why = "interrupted by request" if reason is EndReason.CANCELLED else "the daemon is shutting down"
            return TurnEnd(reason=reason, error=why, steps=0)
        finally:
            self._turn_task = None

    # -- one turn --------------------------------------------------------------------------

    async def _turn_body(self, turn: OpenedTurn) -> TurnEnd:
        steps = 0
        try:
            if self._history is None:
                await self._load_history()
            else:
                self._append_admitted(turn.admitted)
            while True:
                if self._steer_hint:
                    self._steer_hint = False
                    admitted = await self._write(
                        partial(admit, session_id=self.session_id, turn_id=turn.turn_id, waking=False)
                    )
                    self._append_admitted(admitted)
                if self._stopping:
                    return TurnEnd(reason=EndReason.INTERRUPTED, error="the daemon is shutting down", steps=steps)
                if steps >= self.config.max_steps:
                    return TurnEnd(reason=EndReason.MAX_STEPS, steps=steps)
                out = await self._model_step(turn)
                if isinstance(out, TurnEnd):
                    return out.model_copy(update={"steps": steps})
                steps += 1
                uses = [b for b in out.content if isinstance(b, ToolUseBlock)]
                if out.finish_reason is FinishReason.MAX_TOKENS:
                    return TurnEnd(reason=EndReason.MAX_TOKENS, model_finish=out.finish_reason, steps=steps)
                if not uses:
                    return TurnEnd(reason=EndReason.END_TURN, model_finish=out.finish_reason, steps=steps)
                await self._run_tools(turn, uses)
        except asyncio.CancelledError:
            reason = self._cancel_reason
            task = asyncio.current_task()
            if reason is None or task is None:
                raise
            task.uncancel()
            await self._cleanup(turn, CANCELLED_TOOL_TEXT)
            why = "interrupted by request" if reason is EndReason.CANCELLED else "the daemon is shutting down"
            return TurnEnd(reason=reason, error=why, steps=steps)
        except Exception as exc:
            logger.exception("turn {} of session {} failed", turn.turn_id, self.session_id)
            await self._cleanup(turn, f"not run: the turn failed ({type(exc).__name__})")
            return TurnEnd(
                reason=EndReason.ERROR,
                error=f"internal error: {type(exc).__name__}: {exc}",
                error_kind="internal",
                steps=steps,
            )

    async def _cleanup(self, turn: OpenedTurn, tool_text: str, error_class: str = "interrupted") -> None:
        partial_text = "".join(self._stream)
        self._stream = []
        guard = self.guard

        def run(tx: Tx) -> None:
            if partial_text:
                tx.emit(
                    self.session_id,
                    EventType.ASSISTANT_MESSAGE,
                    {
                        "turnId": turn.turn_id,
                        "content": [{"type": "text", "text": partial_text}],
                        "finishReason": None,
                        "interrupted": True,
                        "model": self.model.spec,
                    },
                )
            close_open_tool_calls(tx, self.session_id, turn.turn_id, turn.start_seq, tool_text)
            charged = charge_open_reservations(tx, self.session_id, turn.turn_id, error_class)

            def settle() -> None:
                for call_id in charged:
                    guard.settle_in_full(call_id)

            tx.after_commit(settle)

        await asyncio.shield(self._write(run))
        self._history = None  # reload: the cleanup wrote history the loop did not build

    async def _model_step(self, turn: OpenedTurn) -> ModelResponse | TurnEnd:
        model, guard, price = self.model, self.guard, self.model.price
        max_tokens = self.config.max_tokens or model.max_tokens
        attempt = 0
        compact = refused = False
        while True:
            attempt += 1
            request = self._request(max_tokens)
            window = model.context_window
            if compact or self._meter.over(request.prompt_bytes, max_tokens, window, self.config.context):
                compact = False
                ended = await compact_view(self, turn, request, max_tokens)
                if ended is not None:
                    return ended
                request = self._request(max_tokens)
            prompt_bytes = request.prompt_bytes
            call_id = CallId.new()
            held = await self._reserve(turn, model, self._estimator.bound(prompt_bytes), max_tokens, attempt, call_id)
            if isinstance(held, TurnEnd):
                return held
            self._stream = []
            try:
                response = await self._complete_in_time(request, turn.turn_id)
            except OutOfTime as cut:
                await self._cleanup(turn, CANCELLED_TOOL_TEXT, error_class="deadline")
                return TurnEnd(reason=EndReason.BUDGET, error=str(cut))
            except ModelError as exc:
                if exc.kind is ModelErrorKind.CONTEXT_LENGTH and not refused and not self._stopping:
                    # Not an error of the goal's: the estimate was low. Calibrate, compact, retry once.
                    refused = compact = True
                    self._meter.refused(prompt_bytes, window, exc.message)
                    await self._settle_failed(turn, call_id, exc, attempt, True)
                    continue
                retry = (
                    exc.retried_in_turn and self.config.retry.retries(attempt, exc.retry_after) and not self._stopping
                )
                # Read now, as the failure left it: a goal does not count errors of a provider outage.
                breaker_open = getattr(model, "breaker_open", None)
                outage = bool(breaker_open()) if callable(breaker_open) else False
                await self._settle_failed(turn, call_id, exc, attempt, retry, outage)
                if retry:
                    delay = self.config.retry.delay(attempt, exc.retry_after)
                    left = guard.time_left()
                    # Never sleep past the end of the time: the next reservation is refused then.
                    await asyncio.sleep(delay if left is None else min(delay, max(left, 0.0)))
                    continue
                return TurnEnd(reason=EndReason.ERROR, error=str(exc), error_kind=exc.kind.value)
            self._stream = []
            content = response.content
            if response.finish_reason is FinishReason.MAX_TOKENS:
                # Tool calls cut off by the output limit are incomplete; never run them.
                content = [b for b in content if not isinstance(b, ToolUseBlock)]
            if not content:
                content = [TextBlock(text="")]
            usage = response.usage
            cost = price.cost(usage) if price else 0.0
            await self._write(
                partial(
                    self._commit_response,
                    call_id=call_id,
                    turn_id=turn.turn_id,
                    content=content,
                    finish=response.finish_reason.value,
                    usage=usage,
                    cost=cost,
                )
            )
            self._estimator.observe(prompt_bytes, usage.prompt_tokens)
            self._meter.observe(prompt_bytes, usage)
            self._append(ConvMessage(role="assistant", content=content))
            if content is not response.content:
                response = response.model_copy(update={"content": content})
            return response

    async def _complete_in_time(
        self, request: ModelRequest, turn_id: str, model: Model | None = None, quiet: bool = False
    ) -> ModelResponse:
        """One model attempt, cancelled if the guard's time runs out while it is in flight.

        The guard's end is read again when the wait runs out, so a limit raised meanwhile (a goal's
        budgets edited) extends the call; a time limit set where there was none applies from the
        next call. Raises :class:`OutOfTime` after the cancellation.
        """
        left = self.guard.time_left()
        if left is not None and left < self.config.min_call_seconds:
            # Checked again here: the reservation's write may have waited (a full disk) after the guard's check.
            end = self.guard.ends_at()
            when = end.isoformat() if end is not None else "the deadline"
            raise OutOfTime(
                f"deadline {when} is {max(left, 0.0):.1f}s away, less than the "
                f"{self.config.min_call_seconds:g}s a model call needs to start: the call was not started"
            )
        model = model or self.model
        # A summary's text is no answer of the agent's: it is not streamed to listeners.
        on_delta = None if quiet else self._on_delta(turn_id)
        if left is None:
            # No time limit binds this call (one set meanwhile applies from the next call, as
            # below): await it in this task; a task and a wait per call would cost a loop pass.
            return await model.complete(request, on_delta)
        call = asyncio.ensure_future(model.complete(request, on_delta))
        try:
            while True:
                left = self.guard.time_left()
                if left is not None and left <= 0:
                    break
                done, _ = await asyncio.wait({call}, timeout=left)
                if done:
                    return call.result()
            end = self.guard.ends_at()
            call.cancel()
            await asyncio.wait({call})
            if not call.cancelled():
                return call.result()  # it finished as the time ran out
            late = -(self.guard.time_left() or 0.0)
            logger.info(
                "session {}: model call cancelled at the end of its time ({}), {:.3f}s after it",
                self.session_id,
                end,
                late,
            )
            when = end.isoformat() if end is not None else "the deadline"
            raise OutOfTime(f"deadline {when} passed during the model call: it was cancelled {late:.3f}s after")
        finally:
            if not call.done():
                # The turn itself was cancelled (an interrupt, a stop): the call goes with it.
                call.cancel()
                await asyncio.wait({call})
                if not call.cancelled():
                    call.exception()  # retrieved: the turn's own cancellation is what counts

    def _commit_response(
        self, tx: Tx, *, call_id: str, turn_id: str, content: Content, finish: str, usage: Usage, cost: float
    ) -> None:
        commit_assistant(
            tx,
            session_id=self.session_id,
            turn_id=turn_id,
            call_id=call_id,
            model=self.model.spec,
            content=content,
            finish=finish,
            usage=usage,
            cost=cost,
        )
        guard = self.guard
        tx.after_commit(lambda: guard.settle(call_id, usage.total, cost))

    async def _settle_failed(
        self, turn: OpenedTurn, call_id: str, exc: ModelError, attempt: int, retry: bool, breaker_open: bool = False
    ) -> None:
        usage = exc.usage or Usage()
        cost = self.model.price.cost(usage) if self.model.price else 0.0
        guard = self.guard
        partial_text = "".join(self._stream)
        self._stream = []

        def run(tx: Tx) -> None:
            settle_call(tx, call_id, usage, cost, error_class=exc.kind.value, error=exc.message[:2000])
            tx.emit(
                self.session_id,
                EventType.MODEL_ERROR,
                {
                    "turnId": turn.turn_id,
                    "attempt": attempt,
                    "kind": exc.kind.value,
                    "message": exc.message[:2000],
                    "retrying": retry,
                    "breakerOpen": breaker_open,
                    "discardedChars": len(partial_text),
                    "usage": usage.model_dump(),
                    "cost": cost,
                },
            )
            tx.after_commit(lambda: guard.settle(call_id, usage.total, cost))

        await self._write(run)

    def _on_delta(self, turn_id: str) -> Callable[[str], None]:
        def on_delta(text: str) -> None:
            self._stream.append(text)
            for listener in list(self._delta_listeners):
                try:
                    listener(turn_id, text)
                except Exception:
                    logger.exception("delta listener failed")

        return on_delta

    async def _run_tools(self, turn: OpenedTurn, uses: list[ToolUseBlock]) -> None:
        if len(uses) == 1:
            await self._run_tool(turn, uses[0], defer=True)
            return
        async with asyncio.TaskGroup() as tg:
            for use in uses:
                tg.create_task(self._run_tool(turn, use))

    async def _run_tool(self, turn: OpenedTurn, use: ToolUseBlock, *, defer: bool = False) -> None:
        ctx = ToolContext(
            session_id=self.session_id,
            turn_id=turn.turn_id,
            call_id=use.id,
            workdir=self.workdir,
            store=self.store,
            extra=dict(self.tool_extra),
        )
        out = await self.tools.call(use.name, use.input, ctx)

        def run(tx: Tx) -> None:
            tx.emit(
                self.session_id,
                EventType.TOOL_RESULT,
                {
                    "turnId": turn.turn_id,
                    "toolUseId": use.id,
                    "name": use.name,
                    "content": out.content,
                    "isError": out.is_error,
                },
            )
            if out.denied is not None:
                tx.emit(
                    self.session_id,
                    EventType.TOOL_DENIED,
                    {"turnId": turn.turn_id, "toolUseId": use.id, "name": use.name, "reason": out.denied},
                )

        if defer:
            self._deferred.append(_Deferred(run))  # committed with the next write (see _write)
        else:
            await self._write(run)
        block = ToolResultBlock(tool_use_id=use.id, content=out.content, is_error=out.is_error)
        self._append(ConvMessage(role="tool", content=[block]))

    # -- history ---------------------------------------------------------------------------

    def _append(self, msg: ConvMessage) -> None:
        assert self._history is not None
        self._history.append(msg)

    def _append_admitted(self, admitted: list[Admitted]) -> None:
        for a in admitted:
            self._append(ConvMessage(role="user", content=a.content))

    async def _load_history(self) -> None:
        # The model's view: the history as the latest compaction shows it (agent.context).
        _, view = await load_view(self.store, self.session_id)
        self._history, self._wire = [e.msg for e in view], WireCache()
        self._meter.reset()

    def view(self) -> list[ConvMessage] | None:
        """The model's view of the conversation as the driver holds it (``None``: not loaded)."""
        return None if self._history is None else list(self._history)

    def _request(self, max_tokens: int) -> ModelRequest:
        """The next step's request, measured (the model converts only what was added: WireCache)."""
        history = self._history
        assert history is not None
        request = ModelRequest(self.config.system, tuple(history), self.tools.specs(), max_tokens, cache=self._wire)
        return dataclasses.replace(request, prompt_bytes=self.model.measure(request))

    async def _reserve(
        self, turn: OpenedTurn, model: Model, bound: int, max_tokens: int, attempt: int, call_id: CallId
    ) -> Reservation | TurnEnd:
        """Check the guard for one call and make its reservation durable; a refusal ends the turn ``budget``."""
        price = model.price
        held = self.guard.reserve(
            call_id,
            bound + max_tokens,
            price.bound(bound, max_tokens) if price else None,
            min_left=self.config.min_call_seconds,
        )
        if isinstance(held, Refusal):
            return TurnEnd(reason=EndReason.BUDGET, error=held.reason)
        await self._write(
            partial(
                reserve_call,
                call_id=call_id,
                session_id=self.session_id,
                turn_id=turn.turn_id,
                guard_id=self.guard.id,
                provider=model.provider,
                model=model.name,
                attempt=attempt,
                tokens=held.tokens,
                cost=held.cost,
            )
        )
        return held
