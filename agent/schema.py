"""The runtime's tables, as forward migrations (one summary line each).

:class:`Migration` lives here, not in :mod:`agent.store`, so that the store imports its schema and
the schema imports nothing back (every package's migrations are a list of these).

The list is append-only: a new step is one more :class:`Migration` at the end with the next
version; a released step is never edited (a database that applied it would not apply the edit).
A package's pending steps are applied in **one** transaction (:func:`agent.store.upgrade` applies
every package's at once): a step that fails leaves the database exactly as it was.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from agent.errors import AgentError


class Migration(BaseModel):
    """One forward schema step of one package."""

    model_config = ConfigDict(frozen=True)

    version: int
    summary: str
    sql: str
    #: The step on PostgreSQL where the mechanical translation of ``sql`` (:func:`agent.migrate.pg_ddl`:
    #: ``INTEGER`` as ``BIGINT``, ``REAL`` as ``DOUBLE PRECISION``, ``AUTOINCREMENT`` as an identity)
    #: is not it: a trigger's body, say. ``None``: the translation.
    postgres: str | None = None


class MigrationFailed(AgentError, RuntimeError):
    """A schema migration failed; it was rolled back and the database is as it was before it.

    ``package`` and ``version`` name the step that failed, ``backup`` the copy taken before the
    upgrade began (``None`` when none was taken).
    """

    def __init__(self, message: str, *, package: str, version: int, backup: str | None) -> None:
        super().__init__(message)
        self.package = package
        self.version = version
        self.backup = backup


MIGRATIONS: list[Migration] = [
    Migration(
        version=1,
        summary="sessions, inbox, turns, events, spend guards and model calls",
        sql="""
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    parent_session_id TEXT,
    depth INTEGER NOT NULL DEFAULT 0,
    model TEXT,
    workdir TEXT,
    guard_id TEXT,
    config TEXT NOT NULL DEFAULT '{}',
    created_at TEXT NOT NULL
);
CREATE INDEX sessions_parent ON sessions(parent_session_id) WHERE parent_session_id IS NOT NULL;

CREATE TABLE inbox (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    delivery TEXT NOT NULL CHECK (delivery IN ('followup', 'steer', 'context')),
    source_kind TEXT NOT NULL,
    source_ref TEXT,
    content TEXT NOT NULL,
    pending_key TEXT,
    yields_to_followup INTEGER NOT NULL DEFAULT 0,
    fate TEXT NOT NULL DEFAULT 'queued' CHECK (fate IN ('queued', 'admitted', 'cancelled')),
    turn_id TEXT,
    cancel_reason TEXT,
    queued_seq INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    ended_at TEXT,
    CHECK ((fate = 'admitted') = (turn_id IS NOT NULL)),
    CHECK ((fate = 'cancelled') = (cancel_reason IS NOT NULL))
);
CREATE UNIQUE INDEX inbox_pending_key ON inbox(pending_key) WHERE fate = 'queued' AND pending_key IS NOT NULL;
CREATE INDEX inbox_queued ON inbox(session_id, queued_seq) WHERE fate = 'queued';
CREATE INDEX inbox_turn ON inbox(turn_id) WHERE turn_id IS NOT NULL;

CREATE TABLE turns (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    start_seq INTEGER NOT NULL,
    end_seq INTEGER,
    end_reason TEXT,
    error TEXT,
    steps INTEGER NOT NULL DEFAULT 0,
    started_at TEXT NOT NULL,
    ended_at TEXT
);
CREATE INDEX turns_session ON turns(session_id, start_seq);
CREATE INDEX turns_open ON turns(session_id) WHERE end_reason IS NULL;

CREATE TABLE events (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    data TEXT NOT NULL,
    at TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
);

CREATE TABLE guards (
    id TEXT PRIMARY KEY,
    max_tokens INTEGER,
    max_cost REAL,
    deadline TEXT,
    max_wall_seconds REAL,
    wall_started_at TEXT,
    created_at TEXT NOT NULL
);

CREATE TABLE model_calls (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    turn_id TEXT,
    guard_id TEXT,
    provider TEXT NOT NULL,
    model TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('reserved', 'settled', 'charged_in_full')),
    reserved_tokens INTEGER NOT NULL,
    reserved_cost REAL NOT NULL,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    cache_read_tokens INTEGER NOT NULL DEFAULT 0,
    cache_write_tokens INTEGER NOT NULL DEFAULT 0,
    cost REAL NOT NULL DEFAULT 0,
    error_class TEXT,
    error TEXT,
    started_at TEXT NOT NULL,
    ended_at TEXT
);
CREATE INDEX model_calls_open ON model_calls(session_id) WHERE state = 'reserved';
CREATE INDEX model_calls_guard ON model_calls(guard_id) WHERE guard_id IS NOT NULL;
CREATE INDEX model_calls_session ON model_calls(session_id, turn_id);
""",
    ),
    Migration(
        version=2,
        summary="retention: each session's sequence watermark and what pruning folded away",
        # The watermark keeps a pruned session's numbering going (the next seq is above every seq
        # ever given, stored or not); the pruned_* columns are the compact summary of what went.
        sql="""
ALTER TABLE sessions ADD COLUMN seq_watermark INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN pruned_through_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN pruned_events INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN pruned_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN pruned_at TEXT;
""",
    ),
    Migration(
        version=3,
        summary="model calls lose the (session, turn) index that no query uses",
        # Every model step writes its call row twice (reserved, then settled): each index is one more
        # page in the write-ahead log per step. Calls are found by id (settle), by open reservation
        # (crash repair: model_calls_open) and by guard (model_calls_guard); none by session and turn.
        sql="DROP INDEX IF EXISTS model_calls_session;",
    ),
    Migration(
        version=4,
        summary="the outbox: notifications written with the change they report, their deliveries and attempts",
        # agent.outbox says why; the tables are the runtime's, written through its functions by any package.
        sql="""
CREATE TABLE outbox (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    grp TEXT,
    payload TEXT NOT NULL,
    created_at TEXT NOT NULL,
    message_id TEXT
);
CREATE INDEX outbox_unsealed ON outbox(id) WHERE message_id IS NULL;
CREATE INDEX outbox_message ON outbox(message_id) WHERE message_id IS NOT NULL;

CREATE TABLE outbox_deliveries (
    message_id TEXT NOT NULL,
    sink TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts INTEGER NOT NULL DEFAULT 0,
    next_at TEXT NOT NULL,
    last_error TEXT,
    delivered_at TEXT,
    PRIMARY KEY (message_id, sink)
);
CREATE INDEX outbox_deliveries_due ON outbox_deliveries(next_at) WHERE state = 'pending';

CREATE TABLE outbox_attempts (
    message_id TEXT NOT NULL,
    sink TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    at TEXT NOT NULL,
    ok INTEGER NOT NULL,
    status INTEGER,
    error TEXT,
    seconds REAL NOT NULL,
    PRIMARY KEY (message_id, sink, attempt)
);
""",
    ),
    Migration(
        version=5,
        # Monotonic totals for the metrics' counters: added to in the transaction that settles or
        # charges a call, never lowered by retention (agent.usage). Started from the stored calls.
        summary="model call totals that retention does not lower",
        sql="""
CREATE TABLE usage_totals (
    provider TEXT NOT NULL,
    model TEXT NOT NULL,
    error_class TEXT NOT NULL DEFAULT '',
    calls INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    cache_read_tokens INTEGER NOT NULL DEFAULT 0,
    cache_write_tokens INTEGER NOT NULL DEFAULT 0,
    cost REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (provider, model, error_class)
);
INSERT INTO usage_totals(provider, model, error_class, calls, input_tokens, output_tokens,
    cache_read_tokens, cache_write_tokens, cost)
SELECT provider, model, COALESCE(error_class, ''), COUNT(*), SUM(input_tokens), SUM(output_tokens),
    SUM(cache_read_tokens), SUM(cache_write_tokens), SUM(cost)
FROM model_calls WHERE state != 'reserved' GROUP BY provider, model, COALESCE(error_class, '');
""",
    ),
    Migration(
        version=6,
        # PostgreSQL only (SQLite's one writer needs neither lock): a write bound to a session takes
        # the writer lock shared and the session's lock, then reads the session's state, in one
        # statement planned once per connection; the state is read after the locks are held, under
        # a snapshot of its own (a VOLATILE function's statements each take one), so it is current.
        # The state's columns are agent.tx.state_query's; tests/agent/test_store_connections.py
        # compares the two.
        summary="a session's write opened by one function: its locks, then its state",
        sql="",
        postgres="""
CREATE OR REPLACE FUNCTION goald_begin(writer_lock BIGINT, session_locks INTEGER, sid TEXT, status_type TEXT)
RETURNS TABLE (watermark BIGINT, top BIGINT, status_seq BIGINT, status_data TEXT, open_turn TEXT)
LANGUAGE plpgsql VOLATILE AS $begin$
#variable_conflict use_column
BEGIN
    PERFORM pg_advisory_xact_lock_shared(writer_lock), pg_advisory_xact_lock(session_locks, hashtext(sid));
    RETURN QUERY SELECT s.seq_watermark::BIGINT,
        (SELECT COALESCE(MAX(e.seq), 0) FROM events e WHERE e.session_id = s.id)::BIGINT,
        (SELECT e.seq FROM events e WHERE e.session_id = s.id AND e.type = status_type
            ORDER BY e.seq DESC LIMIT 1)::BIGINT,
        (SELECT e.data FROM events e WHERE e.session_id = s.id AND e.type = status_type
            ORDER BY e.seq DESC LIMIT 1)::TEXT,
        (SELECT t.id FROM turns t WHERE t.session_id = s.id AND t.end_reason IS NULL LIMIT 1)::TEXT
    FROM sessions s WHERE s.id = sid;
END
$begin$;
""",
    ),
    Migration(
        version=7,
        # PostgreSQL only: a session's write opened on the state this node last committed for it
        # (agent.backends.PgBackend.begin), sent with the transaction's first statement: the same
        # locks as goald_begin, then the state compared with the one the write was decided on; if
        # another writer changed it meanwhile the transaction fails (SQLSTATE GD002, agent.backends.
        # STALE_STATE) and the store runs the write again on the state read (agent.store.Store._run_tx).
        summary="a session's write opened on the state this node knows, checked after its locks",
        sql="",
        postgres="""
CREATE OR REPLACE FUNCTION goald_check(writer_lock BIGINT, session_locks INTEGER, sid TEXT, status_type TEXT,
    known_seq BIGINT, known_status_seq BIGINT, known_turn TEXT)
RETURNS BOOLEAN LANGUAGE plpgsql VOLATILE AS $check$
DECLARE
    st RECORD;
BEGIN
    SELECT * INTO st FROM goald_begin(writer_lock, session_locks, sid, status_type);
    IF NOT FOUND OR GREATEST(st.top, st.watermark) <> known_seq
        OR COALESCE(st.status_seq, 0) <> known_status_seq OR st.open_turn IS DISTINCT FROM known_turn THEN
        RAISE EXCEPTION 'session % changed since this node last wrote it', sid USING ERRCODE = 'GD002';
    END IF;
    RETURN TRUE;
END
$check$;
""",
    ),
    Migration(
        version=8,
        # PostgreSQL only: a write whose check is the server's, sent with a later statement or the
        # COMMIT (agent.tx.Tx.write's one_row): an update that must change exactly one row fails the
        # transaction otherwise (SQLSTATE GD003, its message the write's token), which the connection
        # turns into the caller's error (agent.db.PgConn.defer's refused).
        summary="a deferred write's check made by the server: exactly one row changed",
        sql="",
        postgres="""
CREATE OR REPLACE FUNCTION goald_one_row(changed BIGINT, token TEXT)
RETURNS BOOLEAN LANGUAGE plpgsql VOLATILE AS $one$
BEGIN
    IF changed <> 1 THEN
        RAISE EXCEPTION '%', token USING ERRCODE = 'GD003';
    END IF;
    RETURN TRUE;
END
$one$;
""",
    ),
    Migration(
        version=9,
        # PostgreSQL only: a write sent whole (agent.pgtx.commit) inserts its events in the SELECT that
        # opens it, after its check (CASE WHEN goald_check(...) THEN goald_events(...) END): one
        # statement fewer per write. The rows: a JSON array of [session_id, seq, type, data, at].
        summary="a write's events inserted in the statement that checks its state",
        sql="",
        postgres="""
CREATE OR REPLACE FUNCTION goald_events(rows TEXT)
RETURNS BOOLEAN LANGUAGE plpgsql VOLATILE AS $events$
BEGIN
    INSERT INTO events(session_id, seq, type, data, at)
    SELECT r->>0, (r->>1)::INTEGER, r->>2, r->>3, r->>4 FROM jsonb_array_elements(rows::jsonb) AS r;
    RETURN TRUE;
END
$events$;
""",
    ),
]
