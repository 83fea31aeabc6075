"""Work-directory locks: one live goal at a time holds a work directory.

Two goals working in the same directory would overwrite each other's files, and so would a goal
working in a directory inside (or around) another goal's. A goal holds its work directory while it
is live (``active`` or ``paused``) and lets go when it ends (completed, failed, cancelled,
exhausted); resuming an exhausted goal takes the lock again, so it may be refused.

The check runs in the transaction that creates (or revives) the goal, so it is exactly as durable
as the goal row, and it names the goal in the way; those transactions run one at a time
(:data:`CLAIMS`). The ``goals`` schema (migration 2) holds the same rule as triggers, a backstop
against any writer that skips this module.

Sessions: a directory inside (or around) another's would let the outer one's model swap the inner
directory for a symlink (``rm -rf inner; ln -s / inner``), and the inner session's next command
would get whatever that points to. So a work directory may not contain or lie inside that of any
stored session or live goal (:func:`check_nesting`, at ``session/new`` and when a goal claims its
directory). Sharing one directory exactly is allowed between sessions (a goal on a session, its
subagents, two editor sessions on one project): neither can swap the directory both stand in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent import Tx, session_rows, sessions_near_query
from goals.errors import GoalConflict
from goals.model import LIVE_SQL, Goal
from goals.rows import goal_from_row

#: The lock (``Store.transact``'s ``named``) of the transactions that claim a work directory — a
#: goal's creation, a session's — on PostgreSQL: nesting is a rule over every goal and session, so
#: such claims run one at a time, while sessions' writes go on meanwhile (they hold the writer lock
#: shared, as these do). A claim that also changes a session takes that session's lock as it goes.
#: A goal's resume, rarer, still holds the writer lock alone (which excludes these as well).
CLAIMS = "workdir-claims"


def _canonical(raw: str) -> Path:
    # Resolved (symlinks too): two spellings of one directory must collide.
    return Path(raw).expanduser().resolve()


def _near(path: Path) -> tuple[str, list[str], str, str]:
    """SQL that keeps the stored work directories equal to ``path``, around it or inside it:
    ``(condition, params...)``. Stored directories are canonical (resolved when the goal or session
    was made), so comparing strings finds them without resolving every stored path: the cost of a
    check does not grow with the number of goals and sessions."""
    ancestors = [str(path), *(str(p) for p in path.parents)]
    inside = str(path).rstrip("/") + "/"
    # Every string that starts with ``inside`` sorts in [inside, inside with '/' bumped to '0').
    condition = f"(workdir IN ({', '.join('?' * len(ancestors))}) OR (workdir >= ? AND workdir < ?))"
    return condition, ancestors, inside, inside[:-1] + "0"


def _holder_query(path: Path, goal_id: str) -> tuple[str, tuple[str, ...]]:
    condition, ancestors, low, high = _near(path)
    live = f"status IN {LIVE_SQL} AND workdir IS NOT NULL"
    sql = f"SELECT * FROM goals WHERE {live} AND id != ? AND {condition} ORDER BY id"
    return sql, (goal_id, *ancestors, low, high)


def _holder(path: Path, rows: list[Any]) -> Goal | None:
    for row in rows:
        other = _canonical(row["workdir"])
        if path == other or path.is_relative_to(other) or other.is_relative_to(path):
            return goal_from_row(row)
    return None


def _strictly_nested(a: Path, b: Path) -> bool:
    return a != b and (a.is_relative_to(b) or b.is_relative_to(a))


def check_nesting(tx: Tx, workdir: str) -> None:
    """Refuse ``workdir`` if it contains or lies inside the work directory of a stored session or a
    live goal (the same directory is allowed here; goals hold theirs exactly with :func:`claim_workdir`).

    Raises:
        GoalConflict: naming the session or goal in the way.
    """
    mine = _canonical(workdir)
    _refuse_nested(mine, *tx.reads(*_nesting_queries(mine)))


def _nesting_queries(mine: Path) -> list[tuple[str, tuple[str, ...]]]:
    """The stored sessions' and the live goals' work directories near ``mine`` (two reads)."""
    condition, ancestors, low, high = _near(mine)
    goals = f"SELECT id, workdir FROM goals WHERE status IN {LIVE_SQL} AND workdir IS NOT NULL AND {condition}"
    return [sessions_near_query(ancestors, low, high), (goals, (*ancestors, low, high))]


def _refuse_nested(mine: Path, sessions: list[Any], goals: list[Any]) -> None:
    for session in session_rows(sessions):
        if session.workdir is not None and _strictly_nested(mine, other := _canonical(session.workdir)):
            raise GoalConflict(_nested_message(mine, other, f"session {session.id}"))
    for row in goals:
        if _strictly_nested(mine, other := _canonical(row["workdir"])):
            raise GoalConflict(_nested_message(mine, other, f"goal {row['id']}"))


def _nested_message(mine: Path, other: Path, holder: str) -> str:
    how = "lies inside" if mine.is_relative_to(other) else "contains"
    return (
        f"work directory {mine} {how} {other}, the work directory of {holder}: a work directory may not "
        "contain or lie inside another's; choose a separate directory"
    )


def claim_workdir(tx: Tx, goal: Goal) -> None:
    """Refuse ``goal`` its work directory if another live goal holds it (or one inside or around it).

    Raises:
        GoalConflict: naming the goal that holds the directory.
    """
    if goal.workdir is None:
        return
    path = _canonical(goal.workdir)
    # The holder and what lies near, read together (one round trip on PostgreSQL).
    holders, sessions, goals = tx.reads(_holder_query(path, goal.id), *_nesting_queries(path))
    other = _holder(path, holders)
    if other is None:
        _refuse_nested(path, sessions, goals)
        return
    mine, theirs = path, _canonical(other.workdir or "")
    if mine == theirs:
        where = f"work directory {mine}"
    elif mine.is_relative_to(theirs):
        where = f"work directory {mine} lies inside {theirs}, which"
    else:
        where = f"work directory {mine} contains {theirs}, which"
    raise GoalConflict(
        f"{where} is held by goal {other.id} ({other.title!r}, {other.status.value}); "
        "one goal at a time works in a directory: wait for it to end, or cancel it"
    )
