"""Goal rows in the runtime's SQLite file, and the transaction functions that change them.

Goals live in the same file as sessions and inboxes so that a decision, ``evaluated_seq``, the
counters and the continuation commit in **one** transaction (invariant 10). The continuation uses
the runtime's generic ``pending_key`` (at most one queued continuation per goal, by constraint) and
``yields_to_followup`` (a person's follow-up supersedes it).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from agent import (
    Migration,
    Source,
    SourceKind,
    Tx,
    cancel_pending,
    enqueue,
    is_pending,
    parse_content,
)
from goals.errors import GoalConflict, GoalNotFound, InvalidGoal, StaleDecision
from goals.model import (
    Budgets,
    Goal,
    GoalId,
    GoalMemory,
    GoalStatus,
    SandboxSpec,
    StopRules,
    VerifyCommand,
    transition,
)
from goals.policy import _with_status

GOAL_CHANGED = "goal/changed"
GOAL_PROGRESS = "goal/progress"
GOAL_CLAIM = "goal/claim"
GOAL_BLOCKED = "goal/blocked"
GOAL_VERIFIED = "goal/verified"

MIGRATIONS = [
    Migration(
        version=1,
        summary="goals with budgets, counters, cursor and memory; one live goal per session",
        sql="""
CREATE TABLE goals (
    id TEXT PRIMARY KEY,
    key TEXT UNIQUE,
    idempotency_key TEXT UNIQUE,
    title TEXT NOT NULL,
    objective TEXT NOT NULL,
    status TEXT NOT NULL,
    status_reason TEXT,
    session_id TEXT NOT NULL,
    guard_id TEXT NOT NULL,
    workdir TEXT,
    model TEXT,
    tools TEXT,
    budgets TEXT NOT NULL,
    verify TEXT NOT NULL,
    rules TEXT NOT NULL,
    rounds INTEGER NOT NULL DEFAULT 0,
    tokens INTEGER NOT NULL DEFAULT 0,
    cost REAL NOT NULL DEFAULT 0,
    refused_claims INTEGER NOT NULL DEFAULT 0,
    stall_streak INTEGER NOT NULL DEFAULT 0,
    error_streak INTEGER NOT NULL DEFAULT 0,
    blocked_streak INTEGER NOT NULL DEFAULT 0,
    wall_used REAL NOT NULL DEFAULT 0,
    active_since TEXT,
    continuation_id TEXT,
    continuation_round INTEGER,
    evaluated_seq INTEGER NOT NULL DEFAULT 0,
    not_before TEXT,
    memory TEXT NOT NULL DEFAULT '{}',
    result_summary TEXT,
    evidence TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    revision INTEGER NOT NULL DEFAULT 1
);
CREATE UNIQUE INDEX goals_live_session ON goals(session_id) WHERE status IN ('active', 'paused');
CREATE INDEX goals_status ON goals(status);
""",
    ),
    Migration(
        version=2,
        summary="work-directory locks: a live goal's workdir (or one inside or around it) holds off other goals",
        # Triggers, not a unique index: they also refuse nested directories, and they leave alone
        # any two live goals an older goald let share a directory (the engine refuses new ones).
        sql="""
CREATE TRIGGER goals_workdir_lock_insert BEFORE INSERT ON goals
WHEN NEW.workdir IS NOT NULL AND NEW.status IN ('active', 'paused') AND EXISTS (
    SELECT 1 FROM goals o WHERE o.status IN ('active', 'paused') AND o.id != NEW.id AND o.workdir IS NOT NULL
    AND (o.workdir = NEW.workdir
         OR substr(NEW.workdir, 1, length(o.workdir) + 1) = o.workdir || '/'
         OR substr(o.workdir, 1, length(NEW.workdir) + 1) = NEW.workdir || '/'))
BEGIN
    SELECT RAISE(ABORT, 'goals.workdir is held by another active or paused goal');
END;
CREATE TRIGGER goals_workdir_lock_update BEFORE UPDATE OF status, workdir ON goals
WHEN NEW.workdir IS NOT NULL AND NEW.status IN ('active', 'paused')
    AND (OLD.status NOT IN ('active', 'paused') OR OLD.workdir IS NOT NEW.workdir) AND EXISTS (
    SELECT 1 FROM goals o WHERE o.status IN ('active', 'paused') AND o.id != NEW.id AND o.workdir IS NOT NULL
    AND (o.workdir = NEW.workdir
         OR substr(NEW.workdir, 1, length(o.workdir) + 1) = o.workdir || '/'
         OR substr(o.workdir, 1, length(NEW.workdir) + 1) = NEW.workdir || '/'))
BEGIN
    SELECT RAISE(ABORT, 'goals.workdir is held by another active or paused goal');
END;
""",
    ),
    Migration(
        version=3,
        summary="a goal's progress command and its own sandbox settings",
        sql="""
ALTER TABLE goals ADD COLUMN progress TEXT;
ALTER TABLE goals ADD COLUMN sandbox TEXT NOT NULL DEFAULT '{}';
""",
    ),
    Migration(
        version=4,
        summary="retention: when an ended goal's session history was pruned and its work directory removed",
        sql="""
ALTER TABLE goals ADD COLUMN history_pruned_at TEXT;
ALTER TABLE goals ADD COLUMN workdir_removed_at TEXT;
CREATE INDEX goals_ended ON goals(updated_at) WHERE status IN ('completed', 'failed', 'cancelled');
""",
    ),
]

_COLUMNS = (
    "id", "key", "idempotency_key", "title", "objective", "status", "status_reason", "session_id", "guard_id",
    "workdir", "model", "tools", "budgets", "verify", "rules", "rounds", "tokens", "cost", "refused_claims",
    "stall_streak", "error_streak", "blocked_streak", "wall_used", "active_since", "continuation_id",
    "continuation_round", "evaluated_seq", "not_before", "memory", "result_summary", "evidence", "created_at",
    "updated_at", "revision", "progress", "sandbox",
)  # fmt: skip


def goal_from_row(row: sqlite3.Row | dict[str, Any]) -> Goal:
    """Build a :class:`Goal` from a ``goals`` row."""
    d = dict(row)
    d["budgets"] = Budgets.model_validate_json(d["budgets"])
    d["verify"] = [VerifyCommand.model_validate(v) for v in json.loads(d["verify"])]
    d["rules"] = StopRules.model_validate_json(d["rules"])
    d["memory"] = GoalMemory.model_validate_json(d["memory"])
    d["tools"] = json.loads(d["tools"]) if d["tools"] else None
    d["progress"] = VerifyCommand.model_validate_json(d["progress"]) if d.get("progress") else None
    d["sandbox"] = SandboxSpec.model_validate_json(d.get("sandbox") or "{}")
    return Goal.model_validate(d)


def _row_values(goal: Goal) -> dict[str, Any]:
    return {
        "id": goal.id,
        "key": goal.key,
        "idempotency_key": goal.idempotency_key,
        "title": goal.title,
        "objective": goal.objective,
        "status": goal.status.value,
        "status_reason": goal.status_reason,
        "session_id": goal.session_id,
        "guard_id": goal.guard_id,
        "workdir": goal.workdir,
        "model": goal.model,
        "tools": json.dumps(goal.tools) if goal.tools is not None else None,
        "budgets": goal.budgets.model_dump_json(),
        "verify": json.dumps([v.model_dump() for v in goal.verify]),
        "rules": goal.rules.model_dump_json(),
        "rounds": goal.rounds,
        "tokens": goal.tokens,
        "cost": goal.cost,
        "refused_claims": goal.refused_claims,
        "stall_streak": goal.stall_streak,
        "error_streak": goal.error_streak,
        "blocked_streak": goal.blocked_streak,
        "wall_used": goal.wall_used,
        "active_since": goal.active_since.isoformat() if goal.active_since else None,
        "continuation_id": goal.continuation_id,
        "continuation_round": goal.continuation_round,
        "evaluated_seq": goal.evaluated_seq,
        "not_before": goal.not_before.isoformat() if goal.not_before else None,
        "memory": goal.memory.model_dump_json(exclude_defaults=True),
        "result_summary": goal.result_summary,
        "evidence": goal.evidence,
        "created_at": goal.created_at.isoformat(),
        "updated_at": goal.updated_at.isoformat(),
        "revision": goal.revision,
        "progress": goal.progress.model_dump_json() if goal.progress is not None else None,
        "sandbox": goal.sandbox.model_dump_json(exclude_defaults=True),
    }


def insert_goal(tx: Tx, goal: Goal) -> None:
    """Insert a new goal row."""
    values = _row_values(goal)
    try:
        tx.execute(
            f"INSERT INTO goals({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})",
            [values[c] for c in _COLUMNS],
        )
    except sqlite3.IntegrityError as exc:
        text = str(exc)
        if "goals.session_id" in text:
            raise GoalConflict(
                f"session {goal.session_id} already has an active or paused goal: cancel that goal first,"
                " or give the new goal a session of its own"
            ) from None
        if "goals.key" in text:
            raise GoalConflict(f"a goal with key {goal.key!r} already exists: use another key") from None
        if "goals.workdir" in text:
            raise GoalConflict(
                f"work directory {goal.workdir} is held by another active or paused goal:"
                " wait for it to end, or cancel it"
            ) from None
        raise


def save_goal(tx: Tx, goal: Goal, expected_revision: int) -> Goal:
    """Write ``goal`` if the stored revision is still ``expected_revision``; returns the saved goal.

    Raises:
        StaleDecision: someone changed the goal since it was read.
    """
    saved = goal.model_copy(update={"revision": expected_revision + 1, "updated_at": datetime.fromisoformat(tx.now)})
    values = _row_values(saved)
    cols = [c for c in _COLUMNS if c not in ("id", "created_at")]
    try:
        cur = tx.execute(
            f"UPDATE goals SET {', '.join(f'{c}=?' for c in cols)} WHERE id=? AND revision=?",
            [*(values[c] for c in cols), goal.id, expected_revision],
        )
    except sqlite3.IntegrityError as exc:
        if "goals.workdir" in str(exc):
            raise GoalConflict(
                f"work directory {goal.workdir} is held by another active or paused goal:"
                " wait for it to end, or cancel it"
            ) from None
        raise
    if cur.rowcount != 1:
        raise StaleDecision(f"goal {goal.id} changed since it was read")
    return saved


def _conn(tx_or_conn: Tx | sqlite3.Connection) -> sqlite3.Connection:
    return tx_or_conn.conn if isinstance(tx_or_conn, Tx) else tx_or_conn


def load_goal(tx_or_conn: Tx | sqlite3.Connection, goal_id: str) -> Goal:
    """The goal ``goal_id``. Raises ``NotFound``."""
    conn = _conn(tx_or_conn)
    row = conn.execute("SELECT * FROM goals WHERE id=?", (goal_id,)).fetchone()
    if row is None:
        raise GoalNotFound(f"no goal {goal_id}: list the goals to find its id")
    return goal_from_row(row)


def live_goal_of_session(tx_or_conn: Tx | sqlite3.Connection, session_id: str) -> Goal | None:
    """The active or paused goal that holds ``session_id``, if any."""
    conn = _conn(tx_or_conn)
    row = conn.execute(
        "SELECT * FROM goals WHERE session_id=? AND status IN ('active', 'paused')", (session_id,)
    ).fetchone()
    return goal_from_row(row) if row is not None else None


def latest_goal_of_session(tx_or_conn: Tx | sqlite3.Connection, session_id: str) -> Goal | None:
    """The goal of ``session_id`` created last, whatever its status (``None``: the session never had one)."""
    row = (
        _conn(tx_or_conn)
        .execute("SELECT * FROM goals WHERE session_id=? ORDER BY created_at DESC, id DESC LIMIT 1", (session_id,))
        .fetchone()
    )
    return goal_from_row(row) if row is not None else None


def live_goal_of_chain(tx_or_conn: Tx | sqlite3.Connection, chain: Sequence[str]) -> Goal | None:
    """The live goal of the topmost session in ``chain`` (a session and its parents, root last) that has one.

    A subagent's session has no goal of its own: it works under its root's.
    """
    for session_id in reversed(chain):
        goal = live_goal_of_session(tx_or_conn, session_id)
        if goal is not None:
            return goal
    return None


def live_goals(tx_or_conn: Tx | sqlite3.Connection) -> list[Goal]:
    """Every active or paused goal, oldest first."""
    rows = _conn(tx_or_conn).execute("SELECT * FROM goals WHERE status IN ('active', 'paused') ORDER BY id").fetchall()
    return [goal_from_row(r) for r in rows]


def list_goals(tx_or_conn: Tx | sqlite3.Connection, status: GoalStatus | None = None) -> list[Goal]:
    """Goals, newest first, optionally of one status."""
    conn = _conn(tx_or_conn)
    if status is None:
        rows = conn.execute("SELECT * FROM goals ORDER BY id DESC").fetchall()
    else:
        rows = conn.execute("SELECT * FROM goals WHERE status=? ORDER BY id DESC", (status.value,)).fetchall()
    return [goal_from_row(r) for r in rows]


def goal_by_key(tx_or_conn: Tx | sqlite3.Connection, key: str) -> Goal | None:
    """The goal with the unique ``key`` (a declared goal's, say), if any."""
    row = _conn(tx_or_conn).execute("SELECT * FROM goals WHERE key=?", (key,)).fetchone()
    return goal_from_row(row) if row is not None else None


def goal_by_idempotency_key(tx_or_conn: Tx | sqlite3.Connection, key: str) -> Goal | None:
    """The goal first created with the idempotency ``key``, if any."""
    row = _conn(tx_or_conn).execute("SELECT * FROM goals WHERE idempotency_key=?", (key,)).fetchone()
    return goal_from_row(row) if row is not None else None


def live_goal_sandboxes_with_secrets(tx_or_conn: Tx | sqlite3.Connection) -> list[SandboxSpec]:
    """The sandbox settings of every live goal that names secrets (what must be redacted before any
    of their sessions runs), without building the goals: a daemon reads this before it serves."""
    rows = _conn(tx_or_conn).execute(
        "SELECT sandbox FROM goals WHERE status IN ('active', 'paused')"
        " AND json_extract(sandbox, '$.secrets') IS NOT NULL"
    )
    return [SandboxSpec.model_validate_json(r[0]) for r in rows]


def goal_counts(tx_or_conn: Tx | sqlite3.Connection) -> dict[str, int]:
    """How many goals there are of each status (every status listed, zero included)."""
    rows = _conn(tx_or_conn).execute("SELECT status, COUNT(*) AS n FROM goals GROUP BY status").fetchall()
    counts = {s.value: 0 for s in GoalStatus}
    counts.update({str(r["status"]): int(r["n"]) for r in rows})
    return counts


def resolve_goal_id(conn: sqlite3.Connection, ref: str) -> str:
    """A goal id from a full id or a unique prefix of one. Raises ``NotFound`` / ``InvalidInput``."""
    if not ref.startswith(GoalId.prefix):
        raise InvalidGoal(f"malformed goal id {ref[:40]!r}: must start with {GoalId.prefix!r}")
    body = ref[len(GoalId.prefix) :]
    if len(body) > 26 or not set(body) <= set("0123456789ABCDEFGHJKMNPQRSTVWXYZ"):
        # No stored id can match it; say it is malformed rather than not found.
        raise InvalidGoal(f"malformed goal id {ref[:40]!r}: expected {GoalId.prefix!r} and Crockford base32")
    rows = conn.execute("SELECT id FROM goals WHERE id >= ? AND id < ? LIMIT 2", (ref, ref + "\uffff")).fetchall()
    if not rows:
        raise GoalNotFound(f"no goal {ref}: list the goals to find its id")
    if len(rows) > 1 and rows[0]["id"] != ref:
        raise InvalidGoal(f"goal id prefix {ref!r} is ambiguous: give more of the id")
    return str(rows[0]["id"])


def emit_changed(tx: Tx, before: GoalStatus | None, goal: Goal) -> None:
    """Record a status change as a ``goal/changed`` event in the goal's session."""
    if before is goal.status:
        return
    tx.emit(
        goal.session_id,
        GOAL_CHANGED,
        {
            "goalId": goal.id,
            "from": before.value if before else None,
            "status": goal.status.value,
            "reason": goal.status_reason,
            "rounds": goal.rounds,
            "tokens": goal.tokens,
            "cost": goal.cost,
        },
    )


def pending_key(goal_id: str) -> str:
    """The inbox ``pending_key`` of a goal's continuation."""
    return f"goal:{goal_id}"


def issue_continuation(tx: Tx, goal: Goal, round_no: int, text: str) -> Goal:
    """Enqueue the goal's continuation for ``round_no`` and record it on the goal (same transaction)."""
    receipt = enqueue(
        tx,
        goal.session_id,
        parse_content(text),
        source=Source(kind=SourceKind.GOAL, ref=f"{goal.id}#{round_no}"),
        pending_key=pending_key(goal.id),
        yields_to_followup=True,
    )
    return goal.model_copy(update={"continuation_id": receipt.message_id, "continuation_round": round_no})


def cancel_continuation(tx: Tx, goal: Goal, reason: str) -> None:
    """Cancel the goal's continuation if it is still queued (through the inbox's fate transition)."""
    cancel_pending(tx, pending_key(goal.id), reason)


def continuation_queued(tx_or_conn: Tx | sqlite3.Connection, goal: Goal) -> bool:
    """Whether the goal's continuation is queued."""
    return is_pending(tx_or_conn, pending_key(goal.id))


def set_status(
    tx: Tx, goal: Goal, status: GoalStatus, reason: str | None, now: datetime, *, reopen: bool = False
) -> Goal:
    """Apply a person's status change (pause/resume/cancel/reopen) through the one transition function."""
    transition(goal.status, status, reopen=reopen)
    return _with_status(goal, status, reason, now, reopen=reopen)


# -- retention (what :mod:`goals.retention` asks of the goal rows) -----------------------------

#: The statuses retention treats as ended for good (``exhausted`` may still be resumed).
ENDED_STATUSES = (GoalStatus.COMPLETED, GoalStatus.FAILED, GoalStatus.CANCELLED)

# A goal of the same session or work directory that is live, exhausted (resumable) or ended on or
# after the cutoff holds the older goal's session history or directory.
_HOLDS = "(o.status IN ('active', 'paused', 'exhausted') OR o.updated_at >= :cutoff)"


def sessions_due_for_pruning(
    tx_or_conn: Tx | sqlite3.Connection, ended_before: str, limit: int
) -> list[tuple[str, str]]:
    """``(goal id, session id)`` of goals that ended (completed, failed, cancelled) before
    ``ended_before`` and whose session history was not pruned yet, oldest first; a session that a
    live, resumable or more recent goal holds is left out. A goal's ``updated_at`` is when it ended:
    an ended goal's row changes no more."""
    rows = (
        _conn(tx_or_conn)
        .execute(
            "SELECT g.id, g.session_id FROM goals g WHERE g.status IN ('completed', 'failed', 'cancelled')"
            " AND g.updated_at < :cutoff AND g.history_pruned_at IS NULL AND NOT EXISTS"
            f" (SELECT 1 FROM goals o WHERE o.session_id = g.session_id AND o.id != g.id AND {_HOLDS})"
            " ORDER BY g.updated_at LIMIT :limit",
            {"cutoff": ended_before, "limit": limit},
        )
        .fetchall()
    )
    return [(str(r["id"]), str(r["session_id"])) for r in rows]


def mark_history_pruned(tx: Tx, goal_id: str) -> None:
    """Record that the goal's session history was pruned (the goal row itself is kept whole)."""
    tx.execute("UPDATE goals SET history_pruned_at=? WHERE id=? AND history_pruned_at IS NULL", (tx.now, goal_id))


def workdirs_due_for_removal(
    tx_or_conn: Tx | sqlite3.Connection, ended_before: str, limit: int
) -> list[tuple[str, str | None, str]]:
    """``(goal id, goal key, work directory)`` of goals that ended before ``ended_before`` and whose
    work directory was not removed yet, oldest first; a directory that a live, resumable or more
    recent goal uses (the same one, or one inside or around it) is left out."""
    rows = (
        _conn(tx_or_conn)
        .execute(
            "SELECT g.id, g.key, g.workdir FROM goals g WHERE g.status IN ('completed', 'failed', 'cancelled')"
            " AND g.updated_at < :cutoff AND g.workdir IS NOT NULL AND g.workdir_removed_at IS NULL AND NOT EXISTS"
            " (SELECT 1 FROM goals o WHERE o.id != g.id AND o.workdir IS NOT NULL AND (o.workdir = g.workdir"
            " OR substr(o.workdir, 1, length(g.workdir) + 1) = g.workdir || '/'"
            f" OR substr(g.workdir, 1, length(o.workdir) + 1) = o.workdir || '/') AND {_HOLDS})"
            " ORDER BY g.updated_at LIMIT :limit",
            {"cutoff": ended_before, "limit": limit},
        )
        .fetchall()
    )
    return [(str(r["id"]), r["key"], str(r["workdir"])) for r in rows]


def mark_workdir_removed(tx: Tx, goal_id: str, *, kept: bool = False) -> None:
    """Record that retention is done with the goal's work directory: removed, or ``kept`` (the
    configuration keeps it, or goald did not make it), so it is not considered again."""
    tx.execute(
        "UPDATE goals SET workdir_removed_at=? WHERE id=? AND workdir_removed_at IS NULL",
        ("kept" if kept else tx.now, goal_id),
    )


def goal_retention(tx_or_conn: Tx | sqlite3.Connection, goal_id: str) -> dict[str, Any]:
    """What retention did to the goal: ``historyPrunedAt`` and ``workdirRemovedAt`` (``"kept"``
    when the directory is kept for good), each ``None`` when not (yet). Raises ``GoalNotFound``."""
    row = (
        _conn(tx_or_conn)
        .execute("SELECT history_pruned_at, workdir_removed_at FROM goals WHERE id=?", (goal_id,))
        .fetchone()
    )
    if row is None:
        raise GoalNotFound(f"no goal {goal_id}: list the goals to find its id")
    return {"historyPrunedAt": row["history_pruned_at"], "workdirRemovedAt": row["workdir_removed_at"]}
