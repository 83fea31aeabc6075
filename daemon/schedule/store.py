"""The ``schedules`` and ``schedule_runs`` tables: their schema and every query of them.

A schedule's row is the single source of truth (the service rebuilds APScheduler's jobs from the
rows); every scheduled instant ends as exactly one ``schedule_runs`` row and a ``schedule/run``
event in the schedule's own session, written by :func:`record_runs` in the caller's transaction
with the schedule's cursor (``last_fire_at``, the latest instant handled) and ``last_goal_id``.
The daemon owns these tables; nothing outside this module names them in SQL.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from agent import InvalidInput, Migration, NotFound, Tx, create_session
from agent.db import Conn
from daemon.alerts.kinds import notify_schedule_run
from daemon.schedule.model import (
    DateTrigger,
    IntervalTrigger,
    RunOutcome,
    Schedule,
    ScheduleId,
    ScheduleRun,
    ScheduleSpec,
)

SCHEDULE_RUN = "schedule/run"
SCHEDULE_CHANGED = "schedule/changed"
MIGRATIONS = [
    Migration(
        version=1,
        summary="schedules with their cursor, and one schedule_runs row per scheduled instant",
        sql="""
CREATE TABLE schedules (
    id TEXT PRIMARY KEY,
    key TEXT UNIQUE,
    trigger TEXT NOT NULL,
    timezone TEXT NOT NULL,
    goal TEXT NOT NULL,
    misfire TEXT NOT NULL CHECK (misfire IN ('coalesce', 'skip')),
    starting_deadline_seconds REAL,
    concurrency TEXT NOT NULL CHECK (concurrency IN ('forbid', 'replace', 'allow')),
    session_id TEXT NOT NULL,
    anchor_at TEXT,
    active_since TEXT NOT NULL,
    last_fire_at TEXT,
    last_goal_id TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE schedule_runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    schedule_id TEXT NOT NULL,
    scheduled_for TEXT NOT NULL,
    outcome TEXT NOT NULL
        CHECK (outcome IN ('fired', 'skipped_concurrency', 'missed', 'coalesced', 'error')),
    reason TEXT NOT NULL,
    goal_id TEXT,
    recorded_at TEXT NOT NULL
);
CREATE INDEX schedule_runs_schedule ON schedule_runs(schedule_id, id);
""",
    ),
    Migration(
        version=2,
        summary="at most one schedule_runs row per schedule and instant: the claim that lets one node fire it",
        sql="CREATE UNIQUE INDEX schedule_runs_instant ON schedule_runs(schedule_id, scheduled_for);",
    ),
    Migration(
        version=3,
        summary="the node that recorded each schedule run (PostgreSQL clusters; NULL for a daemon on SQLite)",
        sql="ALTER TABLE schedule_runs ADD COLUMN node_id TEXT;",
    ),
    Migration(
        version=4,
        summary="a schedule may be suspended (suspended_at); a run may be skipped_suspended, or manual",
        # SQLite cannot change a CHECK: the runs table is made again with the new outcome.
        sql="""
ALTER TABLE schedules ADD COLUMN suspended_at TEXT;
ALTER TABLE schedule_runs RENAME TO schedule_runs_v3;
DROP INDEX schedule_runs_schedule;
DROP INDEX schedule_runs_instant;
CREATE TABLE schedule_runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    schedule_id TEXT NOT NULL,
    scheduled_for TEXT NOT NULL,
    outcome TEXT NOT NULL CHECK (outcome IN
        ('fired', 'skipped_concurrency', 'skipped_suspended', 'missed', 'coalesced', 'error')),
    reason TEXT NOT NULL,
    goal_id TEXT,
    recorded_at TEXT NOT NULL,
    node_id TEXT,
    manual INTEGER NOT NULL DEFAULT 0
);
INSERT INTO schedule_runs(id, schedule_id, scheduled_for, outcome, reason, goal_id, recorded_at, node_id)
    SELECT id, schedule_id, scheduled_for, outcome, reason, goal_id, recorded_at, node_id FROM schedule_runs_v3;
DROP TABLE schedule_runs_v3;
CREATE INDEX schedule_runs_schedule ON schedule_runs(schedule_id, id);
CREATE UNIQUE INDEX schedule_runs_instant ON schedule_runs(schedule_id, scheduled_for);
""",
        postgres="""
ALTER TABLE schedules ADD COLUMN suspended_at TEXT;
ALTER TABLE schedule_runs DROP CONSTRAINT schedule_runs_outcome_check;
ALTER TABLE schedule_runs ADD CONSTRAINT schedule_runs_outcome_check CHECK (outcome IN
    ('fired', 'skipped_concurrency', 'skipped_suspended', 'missed', 'coalesced', 'error'));
ALTER TABLE schedule_runs ADD COLUMN manual BIGINT NOT NULL DEFAULT 0;
""",
    ),
]

#: One run to record: the scheduled instant, its outcome, the reason and the goal it created.
RunRow = tuple[datetime, RunOutcome, str, str | None]


def iso(dt: datetime) -> str:
    """``dt`` as stored: UTC, ISO 8601 with microseconds."""
    return dt.astimezone(UTC).isoformat(timespec="microseconds")


def load_schedule(conn: Conn, schedule_id: str) -> Schedule:
    """The schedule ``schedule_id`` with its last outcome. Raises ``NotFound``."""
    row = conn.execute("SELECT * FROM schedules WHERE id=?", (schedule_id,)).fetchone()
    if row is None:
        raise NotFound(f"no schedule {schedule_id}")
    return schedule_from_row(conn, row)


def schedule_from_row(conn: Conn, row: Any) -> Schedule:
    """A schedule from its row, with its last run's outcome and reason."""
    d = dict(row)
    d["trigger"] = json.loads(d["trigger"])
    d["goal"] = json.loads(d["goal"])
    last = conn.execute(
        "SELECT outcome, reason FROM schedule_runs WHERE schedule_id=? ORDER BY id DESC LIMIT 1", (d["id"],)
    ).fetchone()
    if last is not None:
        d["last_outcome"], d["last_reason"] = last["outcome"], last["reason"]
    return Schedule.model_validate(d)


def resolve_schedule(conn: Conn, ref: str) -> str:
    """A schedule id from a full id, a unique id prefix, or a schedule key."""
    if not ref.startswith(ScheduleId.prefix):
        row = conn.execute("SELECT id FROM schedules WHERE key=?", (ref,)).fetchone()
        if row is None:
            raise NotFound(f"no schedule with id or key {ref[:80]!r}")
        return str(row["id"])
    rows = conn.execute(
        "SELECT id FROM schedules WHERE id >= ? AND id < ? ORDER BY id LIMIT 2", (ref, ref + "\uffff")
    ).fetchall()
    if not rows:
        raise NotFound(f"no schedule {ref[:80]}")
    if len(rows) > 1 and rows[0]["id"] != ref:
        raise InvalidInput(f"schedule id prefix {ref!r} is ambiguous")
    return str(rows[0]["id"])


def record_runs(
    tx: Tx, sched: Schedule, rows: list[RunRow], *, off_trigger: bool = False, manual: bool = False
) -> list[ScheduleRun]:
    """Claim and record runs, emit their events, and move the schedule's cursor, in the caller's
    transaction; returns the runs recorded.

    A run is recorded only if its instant is still unclaimed: after the cursor (as this transaction
    reads it) and without a row (the unique index of migration 2, met with ``ON CONFLICT DO
    NOTHING``: a failed statement would abort a PostgreSQL transaction). An instant another node
    (or an earlier pass) handled, or any instant of a removed schedule, is left out.

    ``off_trigger``: runs at times that are not the trigger's instants (``schedule run``, a resume's
    fire): the cursor is neither checked nor moved, only ``last_goal_id`` (the concurrency policy
    of the next fire sees their goal). ``manual``: the runs were asked for by a person.
    """
    row = tx.one("SELECT last_fire_at FROM schedules WHERE id=?", (sched.id,))
    if row is None:
        return []
    handled = datetime.fromisoformat(row["last_fire_at"]) if row["last_fire_at"] is not None else None
    if off_trigger:
        handled = None
    # Which node handled the instant, where there can be several (as a turn names its node: agent.turns).
    node = tx.store.node_id if tx.store.kind == "postgresql" else None
    out = []
    for scheduled_for, outcome, reason, goal_id in rows:
        if handled is not None and scheduled_for <= handled:
            continue
        inserted = tx.one(
            "INSERT INTO schedule_runs(schedule_id, scheduled_for, outcome, reason, goal_id, recorded_at, node_id,"
            " manual) VALUES (?,?,?,?,?,?,?,?) ON CONFLICT (schedule_id, scheduled_for) DO NOTHING RETURNING id",
            (sched.id, iso(scheduled_for), outcome.value, reason, goal_id, tx.now, node, int(manual)),
        )
        if inserted is None:
            continue
        data: dict[str, Any] = {
            "scheduleId": sched.id,
            "scheduledFor": iso(scheduled_for),
            "outcome": outcome.value,
            "reason": reason,
        }
        if goal_id is not None:
            data["goalId"] = goal_id
        if node is not None:
            data["node"] = node
        if manual:
            data["manual"] = True
        tx.emit(sched.session_id, SCHEDULE_RUN, data)
        notify_schedule_run(tx, sched.id, sched.key, outcome.value, reason, iso(scheduled_for))
        out.append(
            ScheduleRun(
                id=int(inserted[0]),
                schedule_id=sched.id,
                scheduled_for=scheduled_for,
                outcome=outcome,
                reason=reason,
                goal_id=goal_id,
                recorded_at=datetime.fromisoformat(tx.now),
                node_id=node,
                manual=manual,
            )
        )
    if out and off_trigger:
        goal_ids = [r.goal_id for r in out if r.goal_id is not None]
        if goal_ids:
            tx.execute("UPDATE schedules SET last_goal_id=?, updated_at=? WHERE id=?", (goal_ids[-1], tx.now, sched.id))
    elif out:
        cursor = max(r.scheduled_for for r in out)
        goal_ids = [r.goal_id for r in out if r.goal_id is not None]
        tx.execute(
            "UPDATE schedules SET last_fire_at=?, last_goal_id=COALESCE(?, last_goal_id), updated_at=? WHERE id=?",
            (iso(cursor), goal_ids[-1] if goal_ids else None, tx.now, sched.id),
        )
    return out


def save_schedule(tx: Tx, spec: ScheduleSpec, now: datetime) -> str:
    """Insert the schedule of ``spec``, or update the one with its ``key``; returns its id. An
    update that changes nothing writes nothing; one that changes the timing restarts it from ``now``.

    Raises:
        InvalidInput: a one-shot time already past.
    """
    row = tx.one("SELECT * FROM schedules WHERE key=?", (spec.key,)) if spec.key is not None else None
    old = schedule_from_row(tx.conn, row) if row is not None else None
    timing_changed = old is None or (old.trigger, old.timezone) != (spec.trigger, spec.timezone)
    if timing_changed and isinstance(spec.trigger, DateTrigger) and spec.trigger.at <= now:
        raise InvalidInput(f"the one-shot time {spec.trigger.at.isoformat()} is already past")
    anchor = old.anchor_at if old is not None else None
    if timing_changed and isinstance(spec.trigger, IntervalTrigger):
        anchor = spec.trigger.start or now + timedelta(seconds=spec.trigger.seconds)
    values = {
        "trigger": spec.trigger.model_dump_json(),
        "timezone": spec.timezone,
        "goal": json.dumps(spec.goal, sort_keys=True),
        "misfire": spec.misfire,
        "starting_deadline_seconds": spec.starting_deadline_seconds,
        "concurrency": spec.concurrency,
        "anchor_at": iso(anchor) if anchor is not None else None,
    }
    if old is None:
        sid = ScheduleId.new()
        session = create_session(tx, config={"schedule": sid})
        values |= {"id": sid, "key": spec.key, "session_id": session, "active_since": iso(now)}
        values |= {"created_at": tx.now, "updated_at": tx.now}
        cols = ", ".join(values)
        tx.execute(f"INSERT INTO schedules({cols}) VALUES ({', '.join('?' * len(values))})", list(values.values()))
        tx.emit(session, SCHEDULE_CHANGED, {"scheduleId": sid, "change": "added"})
        return sid
    if old.spec() == spec:
        return old.id
    if timing_changed:
        values["active_since"] = iso(now)
    values["updated_at"] = tx.now
    sets = ", ".join(f"{k}=?" for k in values)
    tx.execute(f"UPDATE schedules SET {sets} WHERE id=?", [*values.values(), old.id])
    tx.emit(old.session_id, SCHEDULE_CHANGED, {"scheduleId": old.id, "change": "updated"})
    return old.id


def list_schedules(conn: Conn) -> list[Schedule]:
    """Every schedule, oldest first, with its last outcome."""
    return [schedule_from_row(conn, r) for r in conn.execute("SELECT * FROM schedules ORDER BY id").fetchall()]


def schedule_timings(conn: Conn) -> dict[str, datetime]:
    """Every schedule's id with the instant its current timing took effect (``active_since``).

    What a node following the table compares (:mod:`daemon.schedule.service`): ``active_since`` is
    set when a schedule is added and whenever its trigger or zone changes (:func:`save_schedule`),
    and by nothing else; the other columns (template, policies, cursor) are read at each fire.
    """
    rows = conn.execute("SELECT id, active_since FROM schedules").fetchall()
    return {str(r["id"]): datetime.fromisoformat(r["active_since"]) for r in rows}


def delete_schedule(tx: Tx, ref: str) -> Schedule:
    """Delete a schedule (by id, unique id prefix or key); its runs and session stay as history."""
    sched = load_schedule(tx.conn, resolve_schedule(tx.conn, ref))
    tx.execute("DELETE FROM schedules WHERE id=?", (sched.id,))
    tx.emit(sched.session_id, SCHEDULE_CHANGED, {"scheduleId": sched.id, "change": "removed"})
    return sched


def set_suspended(tx: Tx, ref: str, suspended: bool) -> tuple[Schedule, bool]:
    """Suspend (or resume) a schedule by id, unique id prefix or key; returns it as it was before
    and whether anything changed (suspending a suspended schedule writes nothing)."""
    sched = load_schedule(tx.conn, resolve_schedule(tx.conn, ref))
    if (sched.suspended_at is not None) == suspended:
        return sched, False
    tx.execute(
        "UPDATE schedules SET suspended_at=?, updated_at=? WHERE id=?",
        (tx.now if suspended else None, tx.now, sched.id),
    )
    change = "suspended" if suspended else "resumed"
    tx.emit(sched.session_id, SCHEDULE_CHANGED, {"scheduleId": sched.id, "change": change})
    return sched, True


def list_runs(conn: Conn, ref: str, limit: int) -> list[ScheduleRun]:
    """A schedule's runs, newest first, at most ``limit``."""
    sid = resolve_schedule(conn, ref)
    rows = conn.execute(
        "SELECT * FROM schedule_runs WHERE schedule_id=? ORDER BY id DESC LIMIT ?", (sid, limit)
    ).fetchall()
    return [ScheduleRun.model_validate(dict(r)) for r in rows]


__all__ = [
    "MIGRATIONS",
    "SCHEDULE_CHANGED",
    "SCHEDULE_RUN",
    "RunRow",
    "delete_schedule",
    "iso",
    "list_runs",
    "list_schedules",
    "load_schedule",
    "record_runs",
    "resolve_schedule",
    "save_schedule",
    "schedule_from_row",
    "schedule_timings",
    "set_suspended",
]
