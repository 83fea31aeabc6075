"""What the engine measures at an idle before it asks the policy: the work directory and the
goal's commands.

* The work directory's content fingerprint (:func:`goals.verify.fingerprint`), which also says
  whether it still exists.
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
from dataclasses import dataclass
from pathlib import Path

from goals.decision import ContinuationFate, Interval
from goals.model import Goal, GoalStatus, VerifyResult
from goals.verify import CommandRunner, fingerprint, progress_digest, run_all


@dataclass(frozen=True)
class Measured:
    """What :func:`measure` found (the policy's inputs besides the goal and the interval)."""

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


async def measure(goal: Goal, interval: Interval, runner: CommandRunner) -> Measured:
    """Measure ``goal``'s work directory and run its commands as this interval calls for."""
    workdir = Path(goal.workdir) if goal.workdir else None
    if workdir is None:
        return Measured(fingerprint=None, workdir_exists=True)
    fp = await asyncio.to_thread(fingerprint, workdir)
    if fp is None or goal.status is not GoalStatus.ACTIVE:
        return Measured(fingerprint=fp, workdir_exists=fp is not None)
    verification, reused, progress = None, False, None
    claimed = bool(interval.claims) or goal.memory.pending_claim is not None
    if claimed and goal.verify:
        previous = goal.memory.verify_results
        if fp == goal.memory.verify_fingerprint and previous and not all(r.passed for r in previous):
            verification, reused = previous, True
        else:
            verification = await run_all(goal.verify, workdir, runner)
    out_of_time = any(r.out_of_time for r in verification or []) and not reused
    if goal.progress is not None and interval.continuation_fate is ContinuationFate.ADMITTED:
        observed = await runner(goal.progress, workdir)
        # Cut by the goal's time, the command observed nothing: no digest (the fingerprint alone judges).
        progress = None if observed.out_of_time else progress_digest(observed)
        out_of_time = out_of_time or observed.out_of_time
    return Measured(fp, True, verification, reused, progress, out_of_time)


__all__ = ["Measured", "measure"]
