"""Claiming a scheduled instant: however many daemons share the store, each instant is handled once.

Every node of a cluster arms the same schedules, so at each instant every node's APScheduler wakes
and tries to fire it. Exactly one of them decides what becomes of the instant; the others write
nothing. Decisions, and why:

- **The claim is the instant's ``schedule_runs`` row**, written by
  :func:`daemon.schedule.store.record_runs`: a unique index on ``(schedule_id, scheduled_for)``
  (the schedules' migration 2) and ``INSERT … ON CONFLICT DO NOTHING RETURNING`` (no row back: the
  instant is another's). The documented rule "every scheduled instant ends as exactly one run row"
  is what the database now enforces, so no second table has to agree with it. The instant is the
  trigger's planned time, computed by the same pure arithmetic on every node from the same row
  (:mod:`daemon.schedule.timing`), never a node's "now", so every node names it alike.
- **Inside the claiming transaction the cursor is read again**: an instant at or before
  ``last_fire_at`` was handled (by some node), so it is dropped. Write transactions run one at a
  time across the cluster (SQLite's writer lock; on PostgreSQL one advisory lock), so this read is
  current; it also keeps a node that woke late from recording an old instant after a newer one, so
  ``last_fire_at`` and ``last_goal_id`` always belong to the newest instant handled.
- **A fire claims in its goal's creation transaction** (:meth:`FireClaim.record`, called by the
  fire callback through :meth:`goals.GoalEngine.create`'s ``also``): the goal and its ``fired`` row
  commit together or not at all. A node that finds the instant taken raises :class:`FireTaken`
  inside that transaction, which rolls back the goal it was making; so no node ever leaves a goal
  the run rows do not know, and a crash between "goal made" and "run recorded" no longer exists.
- **Every other outcome** (``skipped_concurrency``, ``error``, and ``missed``/``coalesced`` at
  start or after a late wake-up) claims the same way in a transaction of its own
  (:meth:`FireClaim.settle`, or ``record_runs`` directly for a batch).
- **The concurrency policy reads the previous goal before claiming.** Two nodes may read its status
  a moment apart and reach different outcomes (one sees it still active and would skip, the other
  sees it ended and would fire); the instant gets the outcome of the node that claims first, which
  is what one node would have done reading a moment earlier or later. ``replace`` cancels the
  previous goal before the claim; a node that loses the claim cancelled the same goal the winner
  did (the previous goal of that instant, or an older one a later fire had already ended).

A node that loses a claim logs it at debug level: in a cluster it is the normal case.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from loguru import logger

from agent import Store, Tx
from daemon.errors import DaemonError
from daemon.schedule.model import RunOutcome, Schedule, ScheduleRun
from daemon.schedule.store import RunRow, iso, record_runs


class FireTaken(DaemonError):
    """Control flow, not a failure: the instant was already handled (by another node, or an earlier
    pass), so this fire writes nothing. Raised inside the goal's creation transaction to roll it back."""


@dataclass
class FireClaim:
    """One node's attempt to handle one scheduled instant.

    The fire callback calls :meth:`record` in the transaction that creates the goal (or, when it
    has no transaction of its own, :meth:`commit` right after making the goal); the scheduler
    settles any other outcome with :meth:`settle`. ``run`` is the recorded run once committed.
    """

    store: Store
    schedule: Schedule
    scheduled_for: datetime
    #: Appended to the run's reason (why the fire happened late, say).
    note: str | None = None
    #: What the concurrency policy did before the fire (``"; cancelled the previous goal …"``).
    replaced: str = ""
    #: Not one of the trigger's instants (``schedule run``, a resume's fire): the cursor stays.
    off_trigger: bool = False
    #: Asked for by a person (``goald schedule run``): the run row is marked ``manual``.
    manual: bool = False
    run: ScheduleRun | None = field(default=None, init=False)

    def record(self, tx: Tx, goal_id: str) -> ScheduleRun:
        """Claim the instant as ``fired`` with ``goal_id``, in the goal's creation transaction.

        Raises:
            FireTaken: the instant is another's; the caller's transaction must roll back.
        """
        made = f"created goal {goal_id}{self.replaced}"
        reason = self._reason(f"run by hand (goald schedule run): {made}" if self.manual else made)
        runs = record_runs(
            tx,
            self.schedule,
            [(self.scheduled_for, RunOutcome.FIRED, reason, goal_id)],
            off_trigger=self.off_trigger,
            manual=self.manual,
        )
        if not runs:
            raise FireTaken(f"schedule {self.schedule.id} at {iso(self.scheduled_for)} was already handled")
        run = runs[0]

        def committed() -> None:
            self.run = run

        tx.on_commit(committed)
        return run

    async def commit(self, goal_id: str) -> ScheduleRun:
        """:meth:`record` in a transaction of its own, for a fire callback that made its goal outside
        the store (a goal made there is not rolled back: such a callback must make it only after this
        returns, or make it idempotently)."""
        return await self.store.transact(lambda tx: self.record(tx, goal_id))

    async def settle(self, outcome: RunOutcome, reason: str) -> ScheduleRun | None:
        """Claim the instant with an outcome that makes no goal; ``None`` if it was another's."""
        rows: list[RunRow] = [(self.scheduled_for, outcome, self._reason(reason), None)]
        runs = await self.store.transact(
            lambda tx: record_runs(tx, self.schedule, rows, off_trigger=self.off_trigger, manual=self.manual)
        )
        if not runs:
            self.taken()
            return None
        self.run = runs[0]
        return self.run

    def taken(self) -> None:
        """Log that another node (or an earlier pass) had the instant."""
        logger.debug(
            "schedule {} at {}: already handled (another node's claim)", self.schedule.id, iso(self.scheduled_for)
        )

    def _reason(self, reason: str) -> str:
        return f"{reason}; {self.note}" if self.note else reason


__all__ = ["FireClaim", "FireTaken"]
