"""The ``goals`` table's schema: forward migrations, each with a one-line summary.

The table lives in the runtime's SQLite file (so a decision and its continuation commit in one
transaction) and is migrated under the name ``goals`` by :meth:`agent.Store.migrate`, which records
the version reached. The work-directory lock is two triggers rather than a unique index: they also
refuse nested directories, and they leave alone any two live goals an older goald let share one.
"""

from __future__ import annotations

from agent import Migration

#: The live statuses as version 8 wrote them (a migration's text never changes with the code).
_LIVE8 = "('active', 'paused', 'waiting')"
#: Version 8's first part, the same on both stores: the questions table, and the live-session index
#: made again with the waiting status.
_QUESTIONS8 = f"""
CREATE TABLE goal_questions (
    id TEXT PRIMARY KEY,
    goal_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    kind TEXT NOT NULL DEFAULT 'question',
    text TEXT NOT NULL,
    options TEXT NOT NULL DEFAULT '[]',
    default_answer TEXT,
    asked_at TEXT NOT NULL,
    deadline TEXT NOT NULL,
    answer TEXT,
    answered_at TEXT,
    answered_by TEXT,
    how TEXT,
    message_id TEXT,
    subject TEXT
);
CREATE INDEX goal_questions_goal ON goal_questions(goal_id, asked_at);
CREATE INDEX goal_questions_open ON goal_questions(answered_at) WHERE answered_at IS NULL;
DROP INDEX goals_live_session;
CREATE UNIQUE INDEX goals_live_session ON goals(session_id) WHERE status IN {_LIVE8};
"""

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
        # PostgreSQL: the same two triggers around one function (a trigger's WHEN may not hold a
        # subquery there, so the EXISTS moves into the function), refusing with the same text as a
        # check violation, which its driver raises as an IntegrityError. The transaction-scoped
        # advisory lock serializes the writes that make a goal hold a directory: SQLite has one
        # writer, but two PostgreSQL transactions could each pass the check before the other
        # commits; the check, run after the lock, sees what the holder committed.
        postgres="""
CREATE FUNCTION goals_workdir_lock() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('goals.workdir'));
    IF EXISTS (
        SELECT 1 FROM goals o WHERE o.status IN ('active', 'paused') AND o.id != NEW.id AND o.workdir IS NOT NULL
        AND (o.workdir = NEW.workdir
             OR substr(NEW.workdir, 1, length(o.workdir) + 1) = o.workdir || '/'
             OR substr(o.workdir, 1, length(NEW.workdir) + 1) = NEW.workdir || '/'))
    THEN
        RAISE EXCEPTION 'goals.workdir is held by another active or paused goal' USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER goals_workdir_lock_insert BEFORE INSERT ON goals FOR EACH ROW
WHEN (NEW.workdir IS NOT NULL AND NEW.status IN ('active', 'paused'))
EXECUTE FUNCTION goals_workdir_lock();
CREATE TRIGGER goals_workdir_lock_update BEFORE UPDATE OF status, workdir ON goals FOR EACH ROW
WHEN (NEW.workdir IS NOT NULL AND NEW.status IN ('active', 'paused')
      AND (OLD.status NOT IN ('active', 'paused') OR OLD.workdir IS DISTINCT FROM NEW.workdir))
EXECUTE FUNCTION goals_workdir_lock();
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
    Migration(
        version=5,
        summary="retention: a goal whose spec keeps its work directory after it ends",
        sql="ALTER TABLE goals ADD COLUMN keep_workdir INTEGER NOT NULL DEFAULT 0;",
    ),
    Migration(
        version=6,
        summary="placement: the node label a goal needs in a cluster",
        sql="ALTER TABLE goals ADD COLUMN node_label TEXT;",
    ),
    Migration(
        version=7,
        summary="infrastructure trouble apart: rounds re-run, their streak, tokens charged for interrupted calls",
        sql="""
ALTER TABLE goals ADD COLUMN infra_streak INTEGER NOT NULL DEFAULT 0;
ALTER TABLE goals ADD COLUMN infra_rounds INTEGER NOT NULL DEFAULT 0;
ALTER TABLE goals ADD COLUMN interrupted_tokens INTEGER NOT NULL DEFAULT 0;
""",
    ),
    Migration(
        version=8,
        summary="questions a goal asks its operator, and the waiting status holding a goal's session and workdir",
        # The live statuses gain 'waiting': the one-live-goal-per-session index and the work-directory
        # triggers are made again with it (their text otherwise as in versions 1 and 2).
        sql=_QUESTIONS8
        + f"""DROP TRIGGER goals_workdir_lock_insert;
DROP TRIGGER goals_workdir_lock_update;
CREATE TRIGGER goals_workdir_lock_insert BEFORE INSERT ON goals
WHEN NEW.workdir IS NOT NULL AND NEW.status IN {_LIVE8} AND EXISTS (
    SELECT 1 FROM goals o WHERE o.status IN {_LIVE8} AND o.id != NEW.id AND o.workdir IS NOT NULL
    AND (o.workdir = NEW.workdir
         OR substr(NEW.workdir, 1, length(o.workdir) + 1) = o.workdir || '/'
         OR substr(o.workdir, 1, length(NEW.workdir) + 1) = NEW.workdir || '/'))
BEGIN
    SELECT RAISE(ABORT, 'goals.workdir is held by another active or paused goal');
END;
CREATE TRIGGER goals_workdir_lock_update BEFORE UPDATE OF status, workdir ON goals
WHEN NEW.workdir IS NOT NULL AND NEW.status IN {_LIVE8}
    AND (OLD.status NOT IN {_LIVE8} OR OLD.workdir IS NOT NEW.workdir) AND EXISTS (
    SELECT 1 FROM goals o WHERE o.status IN {_LIVE8} AND o.id != NEW.id AND o.workdir IS NOT NULL
    AND (o.workdir = NEW.workdir
         OR substr(NEW.workdir, 1, length(o.workdir) + 1) = o.workdir || '/'
         OR substr(o.workdir, 1, length(NEW.workdir) + 1) = NEW.workdir || '/'))
BEGIN
    SELECT RAISE(ABORT, 'goals.workdir is held by another active or paused goal');
END;
""",
        postgres=_QUESTIONS8
        + f"""CREATE OR REPLACE FUNCTION goals_workdir_lock() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('goals.workdir'));
    IF EXISTS (
        SELECT 1 FROM goals o WHERE o.status IN {_LIVE8} AND o.id != NEW.id AND o.workdir IS NOT NULL
        AND (o.workdir = NEW.workdir
             OR substr(NEW.workdir, 1, length(o.workdir) + 1) = o.workdir || '/'
             OR substr(o.workdir, 1, length(NEW.workdir) + 1) = NEW.workdir || '/'))
    THEN
        RAISE EXCEPTION 'goals.workdir is held by another active or paused goal' USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;
DROP TRIGGER goals_workdir_lock_insert ON goals;
DROP TRIGGER goals_workdir_lock_update ON goals;
CREATE TRIGGER goals_workdir_lock_insert BEFORE INSERT ON goals FOR EACH ROW
WHEN (NEW.workdir IS NOT NULL AND NEW.status IN {_LIVE8})
EXECUTE FUNCTION goals_workdir_lock();
CREATE TRIGGER goals_workdir_lock_update BEFORE UPDATE OF status, workdir ON goals FOR EACH ROW
WHEN (NEW.workdir IS NOT NULL AND NEW.status IN {_LIVE8}
      AND (OLD.status NOT IN {_LIVE8} OR OLD.workdir IS DISTINCT FROM NEW.workdir))
EXECUTE FUNCTION goals_workdir_lock();
""",
    ),
    Migration(
        version=9,
        summary="a goal on a git repository: its repository, base ref, branch, the commit it started from,"
        " and the goal it replays",
        sql="""
ALTER TABLE goals ADD COLUMN repo TEXT;
ALTER TABLE goals ADD COLUMN base TEXT;
ALTER TABLE goals ADD COLUMN branch TEXT;
ALTER TABLE goals ADD COLUMN base_commit TEXT;
ALTER TABLE goals ADD COLUMN replay_of TEXT;
ALTER TABLE goals ADD COLUMN commit_on_complete INTEGER NOT NULL DEFAULT 0;
""",
    ),
]

__all__ = ["MIGRATIONS"]
