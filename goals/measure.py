"""What the engine measures at an idle before it asks the policy: the work directory and the
goal's commands.

* The work directory's content fingerprint (:class:`goals.verify.Fingerprinter`, bounded in bytes
  and time and stopped with the engine), which also says whether it still exists and what it
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

from dataclasses import dataclass
from pathlib import Path

from goals.decision import ContinuationFate, Interval
from goals.model import Goal, GoalStatus, VerifyResult
from goals.verify import CommandRunner, Fingerprinter, WalkStats, progress_digest, run_all


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


__all__ = ["Measured", "measure"]
