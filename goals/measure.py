"""What the engine measures at an idle before it asks the policy: the work directory and the
goal's commands.

* The work directory's content fingerprint (:class:`Fingerprinter`: each walk of
  :mod:`goals.workdir_fingerprint` in a daemon thread of its own, bounded in bytes and time, stopped with
  the engine without waiting for it), which also says whether it still exists and what it
  holds on disk. A walk whose reading was cut short gives no fingerprint (``None``): the policy
  judges no progress from it, and no earlier verification is reused on it.
* The verification commands, run only when the agent claimed completion (in this interval, or
  a claim kept from a pause) and the goal is active: a claim refused before on the very same
  content is not verified again (the earlier failing results are reused), so a model that keeps
  claiming without changing anything does not make the engine run the commands every round.
* The ``progress`` command, run only when a round ended (the goal's continuation was admitted):
  only a round's end is judged for progress (policy rule 9), so only then is it measured.

Everything runs through the goal's :data:`~goals.verify.CommandRunner` (the daemon's runs each
command in that goal's sandbox).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from goals.decision import ContinuationFate, Interval
from goals.fingerprint_limits import FingerprintLimits, WalkStats, WalkStopped
from goals.model import Goal, GoalStatus, VerifyResult
from goals.verify import CommandRunner, progress_digest, run_all
from goals.workdir_fingerprint import fingerprint_within

#: Fingerprints that run at once (each in a thread of its own).
MAX_WALKS_AT_ONCE = 4


@dataclass(frozen=True)
class Walked:
    """A fingerprint's outcome: the digest (``None``: the work directory is missing) and its stats."""

    digest: str | None
    stats: WalkStats

    @property
    def known(self) -> str | None:
        """The digest when it describes the tree (``None``: missing, or reading was cut short)."""
        return self.digest if self.stats.complete else None


class Fingerprinter:
    """Runs fingerprints for the goal engine: each in a thread of its own, at most
    :data:`MAX_WALKS_AT_ONCE` at a time, within ``limits``, and stoppable.

    :meth:`stop` ends the walks asked for until then: it sets the flag they check between
    directories, files and chunks, and every :meth:`walk` awaiting one raises :class:`WalkStopped`
    at once, without waiting for its thread. The threads are daemon threads: a walk stuck in a
    system call (a hung network file system) can neither delay the event loop's shutdown nor the
    process's exit. Walks asked for after a stop run as usual.
    """

    def __init__(self, limits: FingerprintLimits | None = None, *, at_once: int = MAX_WALKS_AT_ONCE) -> None:
        self.limits = limits or FingerprintLimits()
        self._slots = asyncio.Semaphore(at_once)
        #: The stop flag of the walks asked for since the last stop, and their waiters.
        self._flag = threading.Event()
        self._waiting: set[asyncio.Event] = set()

    def stop(self) -> None:
        """Stop every walk asked for until now (they raise :class:`WalkStopped`)."""
        flag, self._flag = self._flag, threading.Event()
        flag.set()
        for stopped in self._waiting:
            stopped.set()

    async def walk(self, workdir: Path) -> Walked:
        """Fingerprint ``workdir`` in a thread.

        Raises:
            WalkStopped: :meth:`stop` was called while the walk waited for its turn or ran.
        """
        flag, stopped = self._flag, asyncio.Event()
        self._waiting.add(stopped)
        try:
            async with self._slots:
                if flag.is_set():
                    raise WalkStopped("the fingerprint was stopped")
                return await self._run(workdir, flag, stopped)
        finally:
            self._waiting.discard(stopped)

    async def _run(self, workdir: Path, flag: threading.Event, stopped: asyncio.Event) -> Walked:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Walked] = loop.create_future()
        stats = WalkStats()

        def run() -> None:
            result: Walked | BaseException
            try:
                result = Walked(fingerprint_within(workdir, self.limits, flag, stats), stats)
            except BaseException as exc:  # handed to the awaiting task
                result = exc
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(_settle, done, result)

        threading.Thread(target=run, name=f"goald-fingerprint {workdir.name}", daemon=True).start()
        waiter = asyncio.ensure_future(stopped.wait())
        both: list[asyncio.Future[Any]] = [done, waiter]
        try:
            await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if not done.done():
            done.cancel()
            raise WalkStopped("the fingerprint was stopped")
        return done.result()


def _settle(done: asyncio.Future[Walked], result: Walked | BaseException) -> None:
    if done.done():
        return
    if isinstance(result, BaseException):
        done.set_exception(result)
    else:
        done.set_result(result)


@dataclass(frozen=True)
class Measured:
    """What :func:`measure` found (the policy's inputs besides the goal and the interval)."""

    #: The work directory's fingerprint (``None``: no work directory, it is missing, or the walk's
    #: reading was cut short: see ``walk``).
    fingerprint: str | None
    workdir_exists: bool
    #: The verification's results; ``None`` when it did not run.
    verification: list[VerifyResult] | None = None
    #: The results are the earlier ones, reused for unchanged content.
    verification_reused: bool = False
    #: The progress command's digest; ``None`` when it did not run.
    progress: str | None = None
    #: A command was stopped (or not run) because the goal's deadline or wall time ran out.
    out_of_time: bool = False
    #: What the fingerprint's walk did and saw (its bounds, the bytes on disk); ``None``: no walk.
    walk: WalkStats | None = None


async def measure(
    goal: Goal, interval: Interval, runner: CommandRunner, walker: Fingerprinter | None = None
) -> Measured:
    """Measure ``goal``'s work directory and run its commands as this interval calls for.

    Raises:
        WalkStopped: the engine is stopping (``walker`` was stopped): nothing may be decided.
    """
    workdir = Path(goal.workdir) if goal.workdir else None
    if workdir is None:
        return Measured(fingerprint=None, workdir_exists=True)
    walked = await (walker or Fingerprinter()).walk(workdir)
    fp, walk = walked.known, walked.stats
    exists = walked.digest is not None
    if not exists or goal.status is not GoalStatus.ACTIVE:
        return Measured(fingerprint=fp, workdir_exists=exists, walk=walk)
    verification, reused, progress = None, False, None
    claimed = bool(interval.claims) or goal.memory.pending_claim is not None
    if claimed and goal.verify:
        previous = goal.memory.verify_results
        same = fp is not None and fp == goal.memory.verify_fingerprint
        if same and previous and not all(r.passed for r in previous):
            verification, reused = previous, True
        else:
            verification = await run_all(goal.verify, workdir, runner)
    out_of_time = any(r.out_of_time for r in verification or []) and not reused
    if goal.progress is not None and interval.continuation_fate is ContinuationFate.ADMITTED:
        observed = await runner(goal.progress, workdir)
        # Cut by the goal's time, the command observed nothing: no digest (the fingerprint alone judges).
        progress = None if observed.out_of_time else progress_digest(observed)
        out_of_time = out_of_time or observed.out_of_time
    return Measured(fp, True, verification, reused, progress, out_of_time, walk)


__all__ = ["MAX_WALKS_AT_ONCE", "Fingerprinter", "Measured", "Walked", "measure"]
