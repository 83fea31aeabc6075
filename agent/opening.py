"""A turn opened in the driver's next write: planned on what this node knows, checked where it commits.

A turn's opening was a transaction of its own, and the turn's first call's reservation the next: two
round trips before the model is called. The driver now plans the turn on the session's state as
this node last committed it (the queue its own writes left: :func:`agent.turns.plan_opening`),
builds the first request on the plan, and opens the turn first in the write that reserves that call
(:func:`agent.turns.open_planned`, :meth:`agent.writer.DriverWriter.open_with_next`). The opening
checks that it admits what the plan said; if the session changed meanwhile (a message queued or
cancelled, another node's write) the whole write is rolled back (:class:`~agent.errors.StaleOpening`),
the driver drops what it held of the turn (its view, the guard's hold) and opens it again on the
state read. No model is called before that write commits (:meth:`agent.attempts.Attempts.
complete_in_time` makes sure of it), so no model sees a message before its admission is durable, and
a cancelled message never reaches one.

A package above may go one step further (:meth:`agent.driver.Agent.open_after`): the goal engine
hands the driver its decision at an idle, whose continuation the turn then admits. The decision
commits first in the same write, so a round's decision, its continuation, the turn's opening and its
first reservation are one round trip. What the handed write raises rolls the write back; the hander
hears of it (its own error, or :class:`~agent.errors.StaleOpening` when the turn could not be opened
so: it then commits its write itself), as it does when the driver does not take the write at all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from agent.errors import StaleOpening
from agent.inbox import wakes
from agent.payloads import AgentStatus
from agent.store import Store
from agent.turns import OpenedTurn, open_planned, plan_opening
from agent.tx import Tx
from agent.writer import DriverWriter


@dataclass(slots=True)
class Handed:
    """A write handed to the driver to commit first in the opening of the turn it queues."""

    write: Callable[[Tx], Any]
    #: The messages ``write`` queues, as :func:`agent.inbox.queued` reads them (ids given at the commit).
    rows: tuple[Mapping[str, Any], ...]
    future: asyncio.Future[Any] = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


def _resolve(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _open(tx: Tx, session_id: str, plan: OpenedTurn, handed: Handed | None) -> None:
    if handed is not None:
        try:
            result = handed.write(tx)
        except Exception as exc:  # its own error, handed back (Openings.stale); the write is rolled back
            raise StaleOpening(f"session {session_id}: the write handed with the turn's opening refused") from exc
        tx.after_commit(partial(_resolve, handed.future, result))
    open_planned(tx, session_id, plan)


class Openings:
    """How one session's driver opens its turns (see the module docstring)."""

    def __init__(self, store: Store, session_id: str, writer: DriverWriter) -> None:
        self.store = store
        self.session_id = session_id
        self.writer = writer
        #: Whether the next turn may be planned (not right after a plan that found the session changed).
        self.may_plan = True
        self._handed: Handed | None = None
        #: The handed write of the turn being opened, until its write commits or is rolled back.
        self._pending: Handed | None = None

    def hand(self, write: Callable[[Tx], Any], rows: Sequence[Mapping[str, Any]]) -> asyncio.Future[Any] | None:
        """Take ``write`` for the next turn's opening; ``None`` if one is already handed."""
        if self._handed is not None or not self.may_plan:
            return None
        self._handed = Handed(write, tuple(rows))
        return self._handed.future

    def planned(self, may: bool) -> OpenedTurn | None:
        """The turn to open in the driver's next write (with what was handed), or ``None``: open it
        now on the state read (``may``: whether the driver may plan at all now). A handed write not
        taken is handed back (:class:`~agent.errors.StaleOpening`)."""
        handed, self._handed = self._handed, None
        plan = None
        if may and self.may_plan:
            plan = plan_opening(self.store.known_state(self.session_id), handed.rows if handed else ())
        if plan is None:
            if handed is not None:
                handed.fail(StaleOpening(f"session {self.session_id}: no turn could be planned for the handed write"))
            return None
        self.writer.open_with_next(partial(_open, session_id=self.session_id, plan=plan, handed=handed))
        self._pending = handed
        return plan

    def nothing_to_open(self) -> bool:
        """Whether the session is idle with nothing waking, as this node last committed it: a wake
        then needs no transaction (an event of the driver's own opening, delivered during the turn).
        Another node's write makes the state unknown here before its events arrive (:meth:`agent.
        store.Store._relay_soon`), and those events wake the driver again; on SQLite the state this
        process committed is the truth."""
        state = self.store.known_state(self.session_id)
        if state is None or state.queue is None or state.open_turn is not None:
            return False
        return state.status is AgentStatus.IDLE and not wakes(list(state.queue))

    def opened_on_read(self) -> None:
        """A turn was opened (or the session went idle) on the state read: plan the next one again."""
        self.may_plan = True

    def stale(self, exc: StaleOpening) -> None:
        """The planned opening's write was rolled back: the next turn opens on the state read, and a
        handed write hears why (its own error, or ``exc``)."""
        self.may_plan = False
        pending, self._pending = self._pending, None
        if pending is not None:
            cause = exc.__cause__
            pending.fail(cause if isinstance(cause, Exception) else exc)

    def close(self) -> None:
        """The driver ends: a handed write not taken, or taken and never written, hears so."""
        handed, self._handed = self._handed, None
        if handed is not None:
            handed.fail(StaleOpening(f"session {self.session_id}: the driver stopped before taking the handed write"))
        self.settled()

    def settled(self) -> None:
        """The turn is over: a handed write whose turn never wrote anything hears that it was not
        committed (the driver stopped, or lost the session, before its first write)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.fail(StaleOpening(f"session {self.session_id}: the turn ended before its opening was written"))
