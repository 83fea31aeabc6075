"""Work-directory locks: one live goal at a time holds a work directory.

Two goals working in the same directory would overwrite each other's files, and so would a goal
working in a directory inside (or around) another goal's. A goal holds its work directory while it
is live (``active`` or ``paused``) and lets go when it ends (completed, failed, cancelled,
exhausted); resuming an exhausted goal takes the lock again, so it may be refused.

The check runs in the transaction that creates (or revives) the goal, so it is exactly as durable
as the goal row, and it names the goal in the way. The ``goals`` schema (migration 2) holds the
same rule as triggers, a backstop against any writer that skips this module.
"""

from __future__ import annotations

from pathlib import Path

from agent import Conflict, Tx
from goals.model import Goal
from goals.store import goal_from_row


def _canonical(raw: str) -> Path:
    # Resolved (symlinks too): two spellings of one directory must collide.
    return Path(raw).expanduser().resolve()


def workdir_holder(tx: Tx, workdir: str, goal_id: str) -> Goal | None:
    """The live goal other than ``goal_id`` whose work directory is ``workdir``, inside it or around it."""
    path = _canonical(workdir)
    rows = tx.all(
        "SELECT * FROM goals WHERE status IN ('active', 'paused') AND workdir IS NOT NULL AND id != ? ORDER BY id",
        (goal_id,),
    )
    for row in rows:
        other = _canonical(row["workdir"])
        if path == other or path.is_relative_to(other) or other.is_relative_to(path):
            return goal_from_row(row)
    return None


def claim_workdir(tx: Tx, goal: Goal) -> None:
    """Refuse ``goal`` its work directory if another live goal holds it (or one inside or around it).

    Raises:
        Conflict: naming the goal that holds the directory.
    """
    if goal.workdir is None:
        return
    other = workdir_holder(tx, goal.workdir, goal.id)
    if other is None:
        return
    mine, theirs = _canonical(goal.workdir), _canonical(other.workdir or "")
    if mine == theirs:
        where = f"work directory {mine}"
    elif mine.is_relative_to(theirs):
        where = f"work directory {mine} lies inside {theirs}, which"
    else:
        where = f"work directory {mine} contains {theirs}, which"
    raise Conflict(
        f"{where} is held by goal {other.id} ({other.title!r}, {other.status.value}); "
        "one goal at a time works in a directory: wait for it to end, or cancel it"
    )
