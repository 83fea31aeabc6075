"""Reads of the ``goals`` table: one goal, the live goals, listings with filters, what an
evaluation reads (:func:`round_of`) and what retention asks of the rows.

Every function takes a transaction or a bare connection (a read outside any transaction), and
builds goals only through :func:`goals.rows.goal_from_row`. Other packages read goals through these
(re-exported by :mod:`goals.store` and the package), never with their own SQL.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agent import AgentStatus, Event, SessionState, Tx, events_after_query, events_of_rows, read_events
from agent.db import Conn
from goals.errors import GoalError, GoalNotFound, InvalidGoal
from goals.model import LIVE_SQL, Goal, GoalId, GoalStatus
from goals.rows import conn_of, goal_from_row
from goals.sandbox_spec import SandboxSpec


def load_goal(tx_or_conn: Tx | Conn, goal_id: str) -> Goal:
    """The goal ``goal_id``. Raises ``NotFound``."""
    conn = conn_of(tx_or_conn)
    return _found(conn.execute("SELECT * FROM goals WHERE id=?", (goal_id,)).fetchone(), goal_id)


def _found(row: Any, goal_id: str) -> Goal:
    """The goal of ``row``, the one read for ``goal_id``. Raises ``GoalNotFound`` for no row."""
    if row is None:
        raise GoalNotFound(f"no goal {goal_id}: list the goals to find its id")
    return goal_from_row(row)


def live_goal_of_session(tx_or_conn: Tx | Conn, session_id: str) -> Goal | None:
    """The active or paused goal that holds ``session_id``, if any."""
    conn = conn_of(tx_or_conn)
    row = conn.execute(f"SELECT * FROM goals WHERE session_id=? AND status IN {LIVE_SQL}", (session_id,)).fetchone()
    return goal_from_row(row) if row is not None else None


def latest_goal_of_session(tx_or_conn: Tx | Conn, session_id: str) -> Goal | None:
    """The goal of ``session_id`` created last, whatever its status (``None``: the session never had one)."""
    row = (
        conn_of(tx_or_conn)
        .execute("SELECT * FROM goals WHERE session_id=? ORDER BY created_at DESC, id DESC LIMIT 1", (session_id,))
        .fetchone()
    )
    return goal_from_row(row) if row is not None else None


def live_goal_of_chain(tx_or_conn: Tx | Conn, chain: Sequence[str]) -> Goal | None:
    """The live goal of the topmost session in ``chain`` (a session and its parents, root last) that has one.

    A subagent's session has no goal of its own: it works under its root's.
    """
    for session_id in reversed(chain):
        goal = live_goal_of_session(tx_or_conn, session_id)
        if goal is not None:
            return goal
    return None


def live_goals(tx_or_conn: Tx | Conn) -> list[Goal]:
    """Every active or paused goal, oldest first."""
    sql = f"SELECT * FROM goals WHERE status IN {LIVE_SQL} ORDER BY id"
    rows = conn_of(tx_or_conn).execute(sql).fetchall()
    return [goal_from_row(r) for r in rows]


def live_goal_sessions(tx_or_conn: Tx | Conn) -> dict[str, str | None]:
    """The sessions of every active or paused goal (what a cluster's nodes must hold), each with
    the node label its goal needs (``None``: any node)."""
    rows = (
        conn_of(tx_or_conn).execute(f"SELECT session_id, node_label FROM goals WHERE status IN {LIVE_SQL}").fetchall()
    )
    return {str(r[0]): r[1] for r in rows}


def session_node_label(tx_or_conn: Tx | Conn, session_id: str) -> str | None:
    """The node label the live goal of ``session_id`` needs (``None``: none, or no live goal)."""
    row = (
        conn_of(tx_or_conn)
        .execute(f"SELECT node_label FROM goals WHERE session_id = ? AND status IN {LIVE_SQL}", (session_id,))
        .fetchone()
    )
    return row[0] if row is not None else None


def list_goals(
    tx_or_conn: Tx | Conn,
    status: GoalStatus | None = None,
    *,
    schedule_id: str | None = None,
    since: datetime | None = None,
) -> list[Goal]:
    """Goals, newest first; optionally of one status, started by one schedule (its goals'
    idempotency keys are ``<schedule id>@<instant>``), or created at or after ``since``."""
    where, args = [], []
    if status is not None:
        where.append("status=?")
        args.append(status.value)
    if schedule_id is not None:
        where.append("idempotency_key >= ? AND idempotency_key < ?")
        args += [schedule_id + "@", schedule_id + "@\uffff"]
    if since is not None:
        where.append("created_at >= ?")
        args.append(since.isoformat())
    sql = "SELECT * FROM goals" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id DESC"
    return [goal_from_row(r) for r in conn_of(tx_or_conn).execute(sql, args).fetchall()]


def schedule_of(goal: Goal) -> str | None:
    """The id of the schedule whose fire created ``goal`` (``None``: made otherwise). A fire's goal
    has the idempotency key ``<schedule id>@<scheduled instant>`` (``daemon.schedule.firing``)."""
    key = goal.idempotency_key or ""
    head, at, _ = key.partition("@")
    return head if at and head.startswith("sch_") else None


def goal_by_key(tx_or_conn: Tx | Conn, key: str) -> Goal | None:
    """The goal with the unique ``key`` (a declared goal's, say), if any."""
    row = conn_of(tx_or_conn).execute("SELECT * FROM goals WHERE key=?", (key,)).fetchone()
    return goal_from_row(row) if row is not None else None


def goal_by_idempotency_key(tx_or_conn: Tx | Conn, key: str) -> Goal | None:
    """The goal first created with the idempotency ``key``, if any."""
    row = conn_of(tx_or_conn).execute("SELECT * FROM goals WHERE idempotency_key=?", (key,)).fetchone()
    return goal_from_row(row) if row is not None else None


def goal_on_branch(tx_or_conn: Tx | Conn, repo: str, branch: str) -> Goal | None:
    """The goal that works on ``branch`` of the repository ``repo``, if any."""
    row = conn_of(tx_or_conn).execute("SELECT * FROM goals WHERE repo=? AND branch=?", (repo, branch)).fetchone()
    return goal_from_row(row) if row is not None else None


def live_goal_sandboxes_with_secrets(tx_or_conn: Tx | Conn) -> list[SandboxSpec]:
    """The sandbox settings of every live goal that names secrets (what must be redacted before any
    of their sessions runs), without building the goals: a daemon reads this before it serves."""
    rows = conn_of(tx_or_conn).execute(
        f"SELECT sandbox FROM goals WHERE status IN {LIVE_SQL} AND json_extract(sandbox, '$.secrets') IS NOT NULL"
    )
    return [SandboxSpec.model_validate_json(r[0]) for r in rows]


def goal_counts(tx_or_conn: Tx | Conn) -> dict[str, int]:
    """How many goals there are of each status (every status listed, zero included)."""
    rows = conn_of(tx_or_conn).execute("SELECT status, COUNT(*) AS n FROM goals GROUP BY status").fetchall()
    counts = {s.value: 0 for s in GoalStatus}
    counts.update({str(r["status"]): int(r["n"]) for r in rows})
    return counts


#: How many candidates an ambiguous goal id prefix names.
AMBIGUOUS_SHOWN = 10


def resolve_goal_id(conn: Conn, ref: str) -> str:
    """A goal id from a goal key, a full id or a unique id prefix.

    A key that exists wins (keys are unique); otherwise ``ref`` must be an id or an id prefix.

    Raises:
        GoalNotFound: no goal has that key or id.
        InvalidGoal: a malformed id, or a prefix that matches several goals (the error names
            them, up to :data:`AMBIGUOUS_SHOWN`).
    """
    if not ref.strip():
        raise InvalidGoal("malformed goal id '': give a goal id, a unique prefix of one, or a goal key")
    row = conn.execute("SELECT id FROM goals WHERE key=?", (ref,)).fetchone()
    if row is not None:
        return str(row["id"])
    if not ref.startswith(GoalId.prefix):
        raise GoalNotFound(f"no goal with key {ref[:80]!r} (nor an id: ids start with {GoalId.prefix!r})")
    body = ref[len(GoalId.prefix) :]
    if len(body) > 26 or not set(body) <= set("0123456789ABCDEFGHJKMNPQRSTVWXYZ"):
        # No stored id can match it; say it is malformed rather than not found.
        raise InvalidGoal(f"malformed goal id {ref[:40]!r}: expected {GoalId.prefix!r} and Crockford base32")
    rows = conn.execute(
        "SELECT id, key, title, status FROM goals WHERE id >= ? AND id < ? ORDER BY id LIMIT ?",
        (ref, ref + "\uffff", AMBIGUOUS_SHOWN + 1),
    ).fetchall()
    if not rows:
        raise GoalNotFound(f"no goal {ref}: list the goals to find its id")
    if len(rows) > 1 and rows[0]["id"] != ref:
        shown = "; ".join(
            f"{r['id']} ({r['status']}{', key ' + r['key'] if r['key'] else ''}: {str(r['title'])[:40]})"
            for r in rows[:AMBIGUOUS_SHOWN]
        )
        more = " and more" if len(rows) > AMBIGUOUS_SHOWN else ""
        raise InvalidGoal(f"goal id prefix {ref!r} is ambiguous: it matches {shown}{more}; give more of the id")
    return str(rows[0]["id"])


def goals_of_session(tx_or_conn: Tx | Conn, session_id: str) -> list[str]:
    """The ids of every goal (any status) that ran on ``session_id``."""
    rows = conn_of(tx_or_conn).execute("SELECT id FROM goals WHERE session_id=?", (session_id,)).fetchall()
    return [str(r["id"]) for r in rows]


# -- retention (what :mod:`goals.retention` asks of the goal rows) ----------------------------------------

#: The statuses retention treats as ended for good (``exhausted`` may still be resumed).
ENDED_STATUSES = (GoalStatus.COMPLETED, GoalStatus.FAILED, GoalStatus.CANCELLED)

# A goal of the same session or work directory that is live, exhausted (resumable) or ended on or
# after the cutoff holds the older goal's session history or directory.
_HOLDS = "(o.status IN ('active', 'paused', 'waiting', 'exhausted') OR o.updated_at >= :cutoff)"


def sessions_due_for_pruning(tx_or_conn: Tx | Conn, ended_before: str, limit: int) -> list[tuple[str, str]]:
    """``(goal id, session id)`` of goals that ended (completed, failed, cancelled) before
    ``ended_before`` and whose session history was not pruned yet, oldest first; a session that a
    live, resumable or more recent goal holds is left out. A goal's ``updated_at`` is when it ended:
    an ended goal's row changes no more."""
    rows = (
        conn_of(tx_or_conn)
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


def workdirs_due_for_removal(
    tx_or_conn: Tx | Conn, ended_before: str, limit: int
) -> list[tuple[str, str | None, str, bool]]:
    """``(goal id, goal key, work directory, whether the goal's spec keeps it)`` of goals that ended
    before ``ended_before`` and whose work directory was not removed yet, oldest first; a directory
    that a live, resumable or more recent goal uses (the same one, or one inside or around it) is
    left out."""
    rows = (
        conn_of(tx_or_conn)
        .execute(
            "SELECT g.id, g.key, g.workdir, g.keep_workdir FROM goals g"
            " WHERE g.status IN ('completed', 'failed', 'cancelled')"
            " AND g.updated_at < :cutoff AND g.workdir IS NOT NULL AND g.workdir_removed_at IS NULL AND NOT EXISTS"
            " (SELECT 1 FROM goals o WHERE o.id != g.id AND o.workdir IS NOT NULL AND (o.workdir = g.workdir"
            " OR substr(o.workdir, 1, length(g.workdir) + 1) = g.workdir || '/'"
            f" OR substr(g.workdir, 1, length(o.workdir) + 1) = o.workdir || '/') AND {_HOLDS})"
            " ORDER BY g.updated_at LIMIT :limit",
            {"cutoff": ended_before, "limit": limit},
        )
        .fetchall()
    )
    return [(str(r["id"]), r["key"], str(r["workdir"]), bool(r["keep_workdir"])) for r in rows]


def goal_retention(tx_or_conn: Tx | Conn, goal_id: str) -> dict[str, Any]:
    """What retention did to the goal: ``historyPrunedAt`` and ``workdirRemovedAt`` (``"kept"``
    when the directory is kept for good), each ``None`` when not (yet). Raises ``GoalNotFound``."""
    row = (
        conn_of(tx_or_conn)
        .execute("SELECT history_pruned_at, workdir_removed_at FROM goals WHERE id=?", (goal_id,))
        .fetchone()
    )
    if row is None:
        raise GoalNotFound(f"no goal {goal_id}: list the goals to find its id")
    return {"historyPrunedAt": row["history_pruned_at"], "workdirRemovedAt": row["workdir_removed_at"]}


# -- figures for reporting (the daemon's metrics): one small row per goal, no whole goal loaded --
#
# A goal started by a schedule has the idempotency key ``<schedule id>@<instant>``
# (``daemon.schedule.firing``); :class:`GoalFact` carries that schedule id so the daemon can label
# spend by schedule, a label set as small as the number of schedules.


@dataclass(frozen=True)
class GoalFact:
    """What the metrics need of one goal."""

    status: str
    guard_id: str
    #: The schedule whose fire created the goal (``None``: created otherwise).
    schedule_id: str | None
    rounds: int


def _schedule_of(idempotency_key: str | None) -> str | None:
    head, at, _ = (idempotency_key or "").partition("@")
    return head if at and head.startswith("sch_") else None


def goal_facts(conn: Conn) -> list[GoalFact]:
    """One :class:`GoalFact` per goal (in a read)."""
    rows = conn.execute("SELECT status, guard_id, idempotency_key, rounds FROM goals").fetchall()
    return [GoalFact(str(r[0]), str(r[1]), _schedule_of(r[2]), int(r[3])) for r in rows]


def round_queries(goal_id: str, session_id: str, last_seq: int) -> list[tuple[str, Sequence[Any]]]:
    """The reads of an evaluation at its session's idle whose last event is ``last_seq``: the goal,
    and the session's events after the goal's last evaluation up to that idle (read together)."""
    since = ("SELECT evaluated_seq FROM goals WHERE id=?", (goal_id,))
    return [("SELECT * FROM goals WHERE id=?", (goal_id,)), events_after_query(session_id, since, last_seq)]


def round_of_rows(
    goal_id: str, session_id: str, st: SessionState, rows: Sequence[Sequence[Any]]
) -> tuple[Goal, SessionState, list[Event]]:
    """What :func:`round_queries` read, at the session's idle whose state is ``st``: the goal, ``st``,
    and the interval's events (none unless the goal is live)."""
    goal_rows, event_rows = rows
    goal = _found(goal_rows[0] if goal_rows else None, goal_id)
    if goal.session_id != session_id:  # a goal's session never changes: the engine's map is wrong
        raise GoalError(f"goal {goal_id} is not session {session_id}'s")
    return goal, st, events_of_rows(session_id, event_rows) if goal.status.live else []


def round_of(tx: Tx, goal_id: str, session_id: str | None) -> tuple[Goal, SessionState, list[Event]]:
    """What an evaluation reads: the goal, its session's state, and (when the session is idle)
    the events after the goal's last evaluation up to that idle. With the goal's session known and
    its state too (the store's, :meth:`agent.tx.Tx.state`), the goal and the events are read
    together, in one round trip with the transaction's opening and its ``COMMIT``."""
    if session_id is not None and (st := tx.state(session_id)).status is AgentStatus.IDLE and st.open_turn is None:
        tx.last_read()  # the COMMIT goes with the reads: nothing is written here
        rows = tx.reads(*round_queries(goal_id, session_id, st.last_seq))
        return round_of_rows(goal_id, session_id, dataclasses.replace(st), rows)
    goal = load_goal(tx, goal_id)
    st = tx.state(goal.session_id)
    live_idle = goal.status.live and st.status is AgentStatus.IDLE and st.open_turn is None
    if not live_idle:
        return goal, dataclasses.replace(st), []
    tx.last_read()  # the COMMIT goes with it: nothing is written here
    events = read_events(tx.conn, goal.session_id, goal.evaluated_seq, limit=1_000_000, upto=st.last_seq)
    return goal, dataclasses.replace(st), events
