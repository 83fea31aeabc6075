"""Retention: what an ended goal keeps, and how the store stops growing without bound.

A daemon that runs for months would otherwise keep every prompt and every tool output of every goal
it ever ran. Retention applies to goals that **ended for good** — ``completed``, ``failed`` or
``cancelled`` — a configurable time ago. An ``exhausted`` goal is not ended for good (it resumes
with a raised budget, and its budget is counted from its model calls), so it is kept whole until
it is cancelled. A session that a live, exhausted or more recently ended goal also uses is left
alone until that goal too is old enough.

What an ended goal keeps after pruning (what ``goal show`` / ``goal/get``, the status page and an
export still read):

- its whole goal row: objective, outcome (status and reason), result summary and evidence,
  counters (rounds, tokens, cost, wall time), budgets, progress notes, verification settings;
- the last ``keep_events`` events of its session (extended back to a turn's start, always with the
  session's latest status; see :mod:`agent.retention`), subagent sessions likewise;
- its session's numbering (a watermark) and a summary row of what was pruned (through which
  sequence number, how many events, how many bytes, when);
- its work directory until ``workdir_seconds`` after it ended; then the directory is removed if
  goald made it for the goal (``<work root>/<goal id>``) and neither the goal's spec
  (``keep_workdir``, ``goald goal add --keep-workdir``) nor the configuration (``keep_workdirs``
  lists goal keys or ids) keeps it. A directory the goal's creator named is never removed: it is
  theirs.

How it runs: each session is pruned in steps of at most ``batch_rows`` deleted rows, each its own
short transaction on the store's one writer, so goal writes interleave between steps; each step
is followed by a bounded ``incremental_vacuum`` of at most ``vacuum_pages`` pages. The longest
writer hold of any step is reported. The daemon runs :func:`run_retention` on a timer and
:func:`compact` on request (which also frees every free page and checkpoints the WAL).
"""

from __future__ import annotations

import asyncio
import shutil
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

from loguru import logger
from pydantic import BaseModel, ConfigDict, Field

from agent import Store, Tx, retention
from goals.snapshots import Snapshots
from goals.store import (
    mark_history_pruned,
    mark_workdir_removed,
    sessions_due_for_pruning,
    workdirs_due_for_removal,
)

DAY = 86_400.0


class RetentionPolicy(BaseModel):
    """How long ended goals keep their history and work directories (ages in seconds; 0: forever)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Seconds after a goal ended before its session history is pruned (0: never).
    history_seconds: float = Field(default=30 * DAY, ge=0)
    #: Events each pruned session keeps (the newest; extended back to a turn's start).
    keep_events: int = Field(default=200, ge=0)
    #: Seconds after a goal ended before the work directory goald made for it is removed (0: never).
    workdir_seconds: float = Field(default=90 * DAY, ge=0)
    #: Goal keys or ids whose work directories are never removed.
    keep_workdirs: list[str] = []
    #: The work-directory roots: only ``<root>/<goal id>`` (a directory goald made) is ever removed.
    workdir_roots: list[Path] = []
    #: Where goals' checkpoints are kept (:mod:`goals.snapshots`): a goal's go after ``workdir_seconds``
    #: with its work directory, or alone when the directory is kept.
    snapshots_root: Path | None = None
    #: Rows deleted by one step (one transaction): bounds how long a step holds the writer.
    batch_rows: int = Field(default=500, ge=1)
    #: Bytes of events deleted by one step, about (at least one event): bounds the hold by size too.
    batch_bytes: int = Field(default=1 << 20, ge=1)
    #: Pages given back to the file system by one ``incremental_vacuum`` step.
    vacuum_pages: int = Field(default=256, ge=1)
    #: Goals considered per run (the rest wait for the next run).
    goals_per_run: int = Field(default=200, ge=1)


class RetentionReport(BaseModel):
    """What one retention run did."""

    goals_pruned: int = 0
    sessions_pruned: int = 0
    sessions_busy: int = 0
    events: int = 0
    event_bytes: int = 0
    inbox: int = 0
    turns: int = 0
    model_calls: int = 0
    workdirs_removed: list[str] = []
    workdirs_kept: int = 0
    pages_freed: int = 0
    steps: int = 0
    longest_hold_seconds: float = 0.0
    #: The longest hold by kind of step: ``prune``, ``vacuum``, ``checkpoint``, ``mark``.
    longest_by_kind: dict[str, float] = {}
    bytes_before: int = 0
    bytes_after: int = 0

    def hold(self, seconds: float, kind: str = "prune") -> None:
        """Count one step of ``kind`` that held the writer ``seconds``."""
        self.steps += 1
        self.longest_hold_seconds = max(self.longest_hold_seconds, seconds)
        self.longest_by_kind[kind] = max(self.longest_by_kind.get(kind, 0.0), seconds)


def _cutoff(now: datetime, seconds: float) -> str:
    return (now - timedelta(seconds=seconds)).isoformat(timespec="microseconds")


async def _vacuum(store: Store, policy: RetentionPolicy, report: RetentionReport) -> int:
    if store.kind == "postgresql":
        return 0  # PostgreSQL's autovacuum reuses the space (a file to shrink is SQLite's)
    freed, held = await store.maintain(lambda conn: retention.vacuum_step(conn, policy.vacuum_pages))
    report.hold(held, "vacuum")
    report.pages_freed += freed
    return freed


async def _prune_session(store: Store, session_id: str, policy: RetentionPolicy, report: RetentionReport) -> bool:
    """Prune one session to the end, step by step; ``False`` if it was busy."""
    pruned = False
    while True:

        def step(tx: Tx) -> retention.PruneStep:
            return retention.prune_session_step(
                tx, session_id, keep_events=policy.keep_events, batch=policy.batch_rows, batch_bytes=policy.batch_bytes
            )

        result, held = await store.timed_transact(step)
        report.hold(held)
        if result.outcome == "busy":
            report.sessions_busy += 1
            return False
        report.events += result.events
        report.event_bytes += result.event_bytes
        report.inbox += result.inbox
        report.turns += result.turns
        report.model_calls += result.model_calls
        pruned = pruned or result.rows > 0
        if result.rows:
            await _vacuum(store, policy, report)
        if result.done:
            if pruned:
                report.sessions_pruned += 1
            return True


def _remove_if_made_for(path: Path, goal_id: str, roots: list[Path]) -> bool | None:
    """Remove ``path`` if goald made it for the goal (``<root>/<goal id>``): ``True`` removed,
    ``False`` absent already, ``None`` not goald's to remove (blocking: run in a thread)."""
    if path.name != goal_id or not any(path.parent == root.expanduser().resolve() for root in roots):
        return None
    if path.is_symlink():
        raise OSError(f"{path} is a symlink, not the directory goald made")
    if not path.exists():
        return False
    # rmtree walks by descriptor below the top (no symlink inside is followed).
    shutil.rmtree(path)
    return True


async def _remove_workdirs(store: Store, policy: RetentionPolicy, now: datetime, report: RetentionReport) -> None:
    if policy.workdir_seconds <= 0:
        return
    cutoff = _cutoff(now, policy.workdir_seconds)
    due = await store.read(lambda conn: workdirs_due_for_removal(conn, cutoff, policy.goals_per_run))
    for goal_id, key, raw, spec_keeps in due:
        keep = spec_keeps or goal_id in policy.keep_workdirs or (key is not None and key in policy.keep_workdirs)
        removed: bool | None = None
        if not keep:
            try:
                removed = await asyncio.to_thread(_remove_if_made_for, Path(raw), goal_id, policy.workdir_roots)
            except OSError as exc:
                logger.warning("retention: cannot remove the work directory {} of goal {}: {}", raw, goal_id, exc)
                continue
        if removed:
            logger.info("retention: removed the work directory {} of goal {}", raw, goal_id)
            report.workdirs_removed.append(raw)
        if policy.snapshots_root is not None:
            # Its recorded start and rounds go after the same period even when the directory is kept
            # (a directory someone named, reused by goal after goal, must not be copied forever).
            await asyncio.to_thread(Snapshots(policy.snapshots_root).remove, goal_id)
        kept = removed is None
        report.workdirs_kept += kept

        def mark(tx: Tx, goal_id: str = goal_id, kept: bool = kept) -> None:
            mark_workdir_removed(tx, goal_id, kept=kept)

        _, held = await store.timed_transact(mark)
        report.hold(held, "mark")


async def run_retention(store: Store, policy: RetentionPolicy, *, now: datetime | None = None) -> RetentionReport:
    """Prune the sessions of goals that ended long enough ago and remove their work directories
    (see the module docstring); bounded steps, each its own short transaction."""
    now = now or datetime.now(UTC)
    report = RetentionReport(bytes_before=await store.size_bytes())
    if policy.history_seconds > 0:
        cutoff = _cutoff(now, policy.history_seconds)
        due = await store.read(lambda conn: sessions_due_for_pruning(conn, cutoff, policy.goals_per_run))
        for goal_id, session_id in due:
            children = await store.read(partial(retention.session_descendants, session_id=session_id))
            sessions = [session_id, *children]
            finished = True
            for sid in sessions:
                finished = await _prune_session(store, sid, policy, report) and finished
            if finished:

                def mark(tx: Tx, goal_id: str = goal_id) -> None:
                    mark_history_pruned(tx, goal_id)

                _, held = await store.timed_transact(mark)
                report.hold(held, "mark")
                report.goals_pruned += 1
    await _remove_workdirs(store, policy, now, report)
    report.bytes_after = await store.size_bytes()
    if report.goals_pruned or report.workdirs_removed:
        logger.info(
            "retention: {} goals pruned ({} events, {} bytes), {} work directories removed; longest step {:.1f} ms",
            report.goals_pruned,
            report.events,
            report.event_bytes,
            len(report.workdirs_removed),
            report.longest_hold_seconds * 1000,
        )
    return report


async def compact(store: Store, policy: RetentionPolicy, *, now: datetime | None = None) -> RetentionReport:
    """Run retention, then give every free page back in bounded steps and checkpoint the WAL, so
    the file shrinks (with ``auto_vacuum = incremental``; an older database needs the offline
    vacuum once)."""
    report = await run_retention(store, policy, now=now)
    report.bytes_before = report.bytes_before or await store.size_bytes()
    while await _vacuum(store, policy, report):
        pass
    if store.kind == "sqlite":
        _, held = await store.maintain(retention.checkpoint)
        report.hold(held, "checkpoint")
    report.bytes_after = await store.size_bytes()
    return report


async def retention_loop(store: Store, policy: RetentionPolicy, interval: float) -> None:
    """Run :func:`run_retention` every ``interval`` seconds until cancelled: a timer (it sleeps
    between runs and reads nothing while it waits). A failed run is logged and retried at the next
    tick; every step is idempotent, so a run that overlaps ``store compact`` does no harm."""
    while True:
        await asyncio.sleep(interval)
        try:
            await run_retention(store, policy)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("retention run failed; retried in {} s", interval)
