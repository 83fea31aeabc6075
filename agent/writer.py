"""The running driver's writes: retried while the store cannot write, a step's tool result deferred.

A storage failure (the disk full) must not end the driver, let alone lose the turn: a write the
running driver depends on is tried again with backoff, and at once when another write gets
through, so the session continues by itself when space returns. The store logs the failure once;
while the agent stops, the failure is raised and crash repair closes the turn at the next start.
(Writes a caller asks for — ``followup``, ``cancel_message`` — do not come here: they raise
:class:`~agent.errors.StorageUnavailable`, so that new input is refused, not half-taken.)

A step's only tool result is not committed on its own: it goes in the same transaction as the
driver's next write (the next call's reservation, steering admitted, the turn's end or its
cleanup), which follows at once, with nothing awaited in between but that write. So a step costs
two commits (the assistant message; its tool result with the next reservation) and a crash between
the tool's end and that commit leaves what a crash just before the result's own commit left: a
call without a result, repaired as "outcome unknown". Several tool calls of one step run in
parallel and each result is committed as it comes. The turn's last answer (no tool call) goes the
same way, with the turn's end, and so does an answer whose calls change nothing but through the
driver, with the first write after it: a result, the next reservation, or what one of its calls
records (:meth:`agent.tools.base.ToolContext.transact`) — a step of such calls costs one commit
(:mod:`agent.step`). A turn the driver planned opens first in its next write (:meth:`DriverWriter.
open_with_next`, :mod:`agent.opening`); an opening that finds the session changed rolls that write
back whole and is dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

from loguru import logger

from agent.errors import StaleOpening, StorageUnavailable
from agent.store import Store
from agent.tx import Tx

#: First and longest wait between attempts of a write the store refused for lack of storage.
STORAGE_RETRY_FIRST = 0.5
STORAGE_RETRY_MAX = 15.0
_T = TypeVar("_T")


@dataclass(slots=True)
class _Deferred:
    """A write committed with the driver's next write (see :class:`DriverWriter`)."""

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


def _fenced(session_id: str, deferred: tuple[_Deferred, ...], fn: Callable[[Tx], _T], tx: Tx) -> _T:
    tx.fence(session_id)
    return _with_deferred(deferred, fn, tx) if deferred else fn(tx)


class DriverWriter:
    """The writes of one session's running driver (see the module docstring)."""

    def __init__(self, store: Store, session_id: str, stopping: Callable[[], bool]) -> None:
        self.store = store
        self.session_id = session_id
        self._stopping = stopping
        self._deferred: list[_Deferred] = []
        #: A planned opening: the first deferred write (:meth:`open_with_next`).
        self._opening: _Deferred | None = None
        #: A write that carried deferred writes was cancelled while on the store's thread.
        self._unsettled = False

    def open_with_next(self, opening: Callable[[Tx], None]) -> None:
        """Open the turn the driver planned (:func:`agent.turns.open_planned`) first in the next
        :meth:`write`. If the opening finds the session changed it raises
        :class:`~agent.errors.StaleOpening` there: that write is rolled back whole, the opening
        dropped, and the error raised to the writer's caller (the driver opens the turn again)."""
        assert not self._deferred, "a turn opens before anything of it is deferred"
        self._opening = _Deferred(opening)
        self._deferred.append(self._opening)

    @property
    def opening_pending(self) -> bool:
        """Whether a planned opening waits for the next write (no model may be called meanwhile). An
        opening whose write committed after its caller was cancelled (an interrupt while it was on
        the store's thread) is not pending: the turn is open."""
        if self._unsettled:
            return False  # a cancelled write carried it: whether it committed, only a write tells
        return self._opening is not None and not self._opening.committed

    def drop_opening(self) -> None:
        """Forget a planned opening not yet written (and what was deferred after it): the turn is
        not opened (:mod:`agent.opening`)."""
        if self.opening_pending:
            self._deferred, self._opening = [], None

    def defer(self, write: Callable[[Tx], None]) -> None:
        """Commit ``write`` with the next :meth:`write` (a step's only tool result; the turn's last
        answer, committed with the turn's end, and an answer whose calls change nothing but through
        the driver: :mod:`agent.step`)."""
        self._deferred.append(_Deferred(write))

    async def write(self, fn: Callable[[Tx], _T]) -> _T:
        """Run ``fn`` in a transaction, with any deferred write, retried while the store cannot write.

        Every such transaction is fenced (:meth:`agent.store.Tx.fence`): a driver whose node lost the
        session's lease writes nothing more to it (:class:`~agent.errors.LeaseLost`)."""
        delay = STORAGE_RETRY_FIRST
        while True:
            deferred = tuple(self._deferred)
            try:
                result = await self.store.transact(
                    partial(_fenced, self.session_id, deferred, fn), session=self.session_id
                )
                if deferred:
                    self._deferred = [d for d in self._deferred if not d.committed]
                    self._opening = None  # first of them: committed with this write
                self._unsettled = False
                return result
            except StaleOpening:
                # Rolled back whole: nothing deferred was written (the opening went first).
                self._deferred, self._opening = [], None
                raise
            except asyncio.CancelledError:
                # The transaction may still commit on the store's thread: what it carried is marked
                # there, and the next write (after it, on the session's lane) tells.
                self._unsettled = bool(deferred)
                raise
            except StorageUnavailable as exc:
                if self._stopping():
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
