"""Retention of the runtime's tables: pruning an ended session's history, and giving space back.

Who decides *which* sessions are pruned is not the runtime's business (the goal package prunes the
sessions of goals that ended long enough ago); this module prunes a session it is given, through
transaction functions over the runtime's own tables (events, inbox, turns, model calls, sessions).

What a pruned session keeps:

- **its last events**: at least the last ``keep_events`` of them, extended back to the start of the
  turn that holds the oldest of those (a turn is never cut, so a tool result never loses its call
  and a later reader of the history sees whole turns), and always its latest status event. What is
  kept is one contiguous run ``first_kept_seq .. last_seq``: a subscriber resuming inside it misses
  nothing; one resuming below it is told, by the existing "events pruned" error, where it begins;
- **its numbering**: ``sessions.seq_watermark`` records the highest sequence number ever given, so
  a new event after pruning continues the sequence (never restarts it, never reuses a number);
- **a compact summary row**: on the session, ``pruned_through_seq``, ``pruned_events``,
  ``pruned_bytes`` (the JSON bytes of the pruned events) and ``pruned_at``;
- the inbox rows, turns and model calls of the kept turns; those of pruned turns go with them
  (a still-queued message and a call still reserved are never pruned).

A session is pruned only while it is idle with nothing queued; a busy one is skipped (and tried
again at the next run). Each step deletes at most ``batch`` rows in one short transaction, so no
step holds the writer long and other writers interleave between steps.

Giving space back: a new database is created with ``auto_vacuum = INCREMENTAL``
(:meth:`agent.store.Store.open`), so freed pages go back to the file system in bounded
``PRAGMA incremental_vacuum(N)`` steps between other writes (:func:`vacuum_step`), and a WAL
checkpoint then truncates the file. A full ``VACUUM`` rewrites the whole file while holding the
writer, so it is offered only offline (:func:`vacuum_offline`); it is also the one way an older
database (created without incremental auto-vacuum) switches mode.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from agent.db import Conn, is_postgres
from agent.payloads import AgentStatus
from agent.tx import Tx

#: SQLite's ``auto_vacuum`` modes, by the number ``PRAGMA auto_vacuum`` answers.
AUTO_VACUUM_MODES = {0: "none", 1: "full", 2: "incremental"}


class PruneStep(BaseModel):
    """What one bounded pruning step of one session did."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    #: ``"pruned"``: rows went (``done`` says whether any remain); ``"busy"``: the session is not
    #: idle or has queued input, so nothing was touched; ``"nothing"``: nothing is old enough.
    outcome: str
    first_kept_seq: int | None = None
    events: int = 0
    event_bytes: int = 0
    inbox: int = 0
    turns: int = 0
    model_calls: int = 0
    done: bool = True

    @property
    def rows(self) -> int:
        """Rows deleted by the step."""
        return self.events + self.inbox + self.turns + self.model_calls


def _busy(tx: Tx, session_id: str) -> bool:
    st = tx.state(session_id)
    if st.open_turn is not None or st.status != AgentStatus.IDLE:
        return True
    return tx.one("SELECT 1 FROM inbox WHERE session_id=? AND fate='queued' LIMIT 1", (session_id,)) is not None


def first_seq_to_keep(tx: Tx, session_id: str, keep_events: int) -> int | None:
    """The lowest sequence number pruning keeps (``None``: the session has nothing to prune).

    The last ``keep_events`` events, extended back to the start of the turn holding the oldest of
    them, and never above the latest status event (so the kept run is contiguous and holds it).
    """
    st = tx.state(session_id)
    if st.last_seq == 0:
        return None
    cut = max(1, st.last_seq - keep_events + 1)
    row = tx.one(
        "SELECT MIN(start_seq) AS s FROM turns WHERE session_id=? AND start_seq<=? AND (end_seq IS NULL OR end_seq>=?)",
        (session_id, cut, cut),
    )
    if row is not None and row["s"] is not None:
        cut = min(cut, int(row["s"]))
    if st.status_seq > 0:
        cut = min(cut, st.status_seq)
    return cut


def prune_session_step(
    tx: Tx, session_id: str, *, keep_events: int, batch: int, batch_bytes: int = 1 << 20
) -> PruneStep:
    """Delete at most ``batch`` rows (and about ``batch_bytes`` bytes of events) of ``session_id``'s
    history older than what it keeps (see the module docstring), record the watermark and the
    summary row; one call is one short transaction.

    Call it again while the step says ``done=False``. The session must exist (``NotFound``).
    """
    if keep_events < 0 or batch < 1:
        raise ValueError("keep_events must be >= 0 and batch >= 1")
    if _busy(tx, session_id):
        return PruneStep(session_id=session_id, outcome="busy", done=False)
    cut = first_seq_to_keep(tx, session_id, keep_events)
    if cut is None:
        return PruneStep(session_id=session_id, outcome="nothing")
    n_events, n_bytes, left = _prune_events(tx, session_id, cut, batch, batch_bytes)
    counts: list[int] = []
    for statement in _PRUNE_AFTER_EVENTS:
        n = 0
        if left > 0:
            params = (session_id, cut, session_id, cut, left) if statement.count("?") == 5 else (session_id, cut, left)
            n = tx.execute(statement, params).rowcount
        counts.append(n)
        left -= n
    n_inbox, n_calls, n_turns = counts
    deleted = n_events + n_inbox + n_calls + n_turns
    if deleted == 0:
        return PruneStep(session_id=session_id, outcome="nothing", first_kept_seq=cut)
    # CASE, not SQLite's two-argument MAX (PostgreSQL's is GREATEST): both stores take it.
    tx.execute(
        "UPDATE sessions SET seq_watermark=CASE WHEN seq_watermark > :last THEN seq_watermark ELSE :last END,"
        " pruned_through_seq=CASE WHEN pruned_through_seq > :through THEN pruned_through_seq ELSE :through END,"
        " pruned_events=pruned_events+:events, pruned_bytes=pruned_bytes+:bytes, pruned_at=:at WHERE id=:id",
        {
            "last": tx.state(session_id).last_seq,
            "through": cut - 1,
            "events": n_events,
            "bytes": n_bytes,
            "at": tx.now,
            "id": session_id,
        },
    )
    return PruneStep(
        session_id=session_id,
        outcome="pruned",
        first_kept_seq=cut,
        events=n_events,
        event_bytes=n_bytes,
        inbox=n_inbox,
        turns=n_turns,
        model_calls=n_calls,
        done=left > 0,
    )


#: After the events, the rows of the pruned turns, in this order (while the turns still say which
#: turns are pruned): inbox rows (and those cancelled before the cut), model calls (never an open
#: reservation), then the turns themselves. Parameters: (session, cut[, session, cut], limit).
#: Rows are named by their primary keys (``rowid`` is SQLite's alone; ``DELETE … LIMIT`` neither's).
_PRUNE_AFTER_EVENTS = (
    "DELETE FROM inbox WHERE id IN (SELECT id FROM inbox WHERE session_id=? AND fate!='queued'"
    " AND queued_seq<? AND (turn_id IS NULL OR turn_id IN"
    " (SELECT id FROM turns WHERE session_id=? AND end_seq IS NOT NULL AND end_seq<?)) LIMIT ?)",
    "DELETE FROM model_calls WHERE id IN (SELECT m.id FROM model_calls m JOIN turns t ON t.id=m.turn_id"
    " WHERE t.session_id=? AND t.end_seq IS NOT NULL AND t.end_seq<? AND m.state!='reserved' LIMIT ?)",
    "DELETE FROM turns WHERE id IN (SELECT t.id FROM turns t WHERE t.session_id=?"
    " AND t.end_seq IS NOT NULL AND t.end_seq<?"
    " AND NOT EXISTS (SELECT 1 FROM model_calls m WHERE m.turn_id=t.id AND m.state='reserved')"
    " LIMIT ?)",
)


def _prune_events(tx: Tx, session_id: str, cut: int, batch: int, batch_bytes: int) -> tuple[int, int, int]:
    """Delete the session's oldest events below ``cut``: at most ``batch`` rows and about
    ``batch_bytes`` bytes (at least one row), since a step's hold of the writer grows with its bytes.
    Returns (events, bytes, rows left of the batch; 0 when the byte bound ended the step)."""
    sizes = tx.all(
        "SELECT seq, length(data) AS b FROM events WHERE session_id=? AND seq<? ORDER BY seq LIMIT ?",
        (session_id, cut, batch),
    )
    left = batch
    n_events, n_bytes, upto = 0, 0, 0
    for row in sizes:
        if n_events and n_bytes + int(row["b"]) > batch_bytes:
            left = n_events  # the byte bound ends this step; more remain
            break
        n_events, n_bytes, upto = n_events + 1, n_bytes + int(row["b"]), int(row["seq"])
    if n_events:
        tx.execute("DELETE FROM events WHERE session_id=? AND seq<=?", (session_id, upto))
    return n_events, n_bytes, left - n_events


def session_descendants(tx_or_conn: Tx | Conn, session_id: str) -> list[str]:
    """The subagent sessions under ``session_id`` (children, their children, …), parents first."""
    conn = tx_or_conn.conn if isinstance(tx_or_conn, Tx) else tx_or_conn
    rows = conn.execute(
        "WITH RECURSIVE tree(id, depth) AS (SELECT id, 0 FROM sessions WHERE parent_session_id=?"
        " UNION ALL SELECT s.id, tree.depth + 1 FROM sessions s JOIN tree ON s.parent_session_id = tree.id"
        " WHERE tree.depth < 64) SELECT id FROM tree ORDER BY depth, id",
        (session_id,),
    ).fetchall()
    return [str(r["id"]) for r in rows]


def session_retention(tx_or_conn: Tx | Conn, session_id: str) -> dict[str, Any] | None:
    """A session's retention summary row (``None``: no such session, or never pruned)."""
    conn = tx_or_conn.conn if isinstance(tx_or_conn, Tx) else tx_or_conn
    row = conn.execute(
        "SELECT pruned_through_seq, pruned_events, pruned_bytes, pruned_at FROM sessions WHERE id=?", (session_id,)
    ).fetchone()
    if row is None or row["pruned_at"] is None:
        return None
    return {
        "prunedThroughSeq": int(row["pruned_through_seq"]),
        "prunedEvents": int(row["pruned_events"]),
        "prunedBytes": int(row["pruned_bytes"]),
        "prunedAt": row["pruned_at"],
    }


# -- space ------------------------------------------------------------------------------------


def _pragma_int(conn: Conn, name: str) -> int:
    row = conn.execute(f"PRAGMA {name}").fetchone()
    return int(row[0]) if row is not None else 0


def file_bytes(path: Path) -> int:
    """The database file's size plus its WAL's (what the database takes on disk)."""
    total = 0
    for name in (path, path.with_name(path.name + "-wal")):
        try:
            total += os.stat(name).st_size
        except FileNotFoundError:
            pass
    return total


def table_names(conn: Conn) -> list[str]:
    """The store's tables, by name (SQLite's own ``sqlite_*`` tables left out)."""
    if is_postgres(conn):
        sql = (
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
            " AND table_type = 'BASE TABLE' ORDER BY table_name"
        )
    else:
        sql = "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
    return [str(r[0]) for r in conn.execute(sql).fetchall()]


def _space(conn: Conn, path: Path) -> dict[str, Any]:
    """The database's size and free space. PostgreSQL's are the server's: its database size in its
    block size, no free list goald could give back (the server's autovacuum reuses dead space)."""
    if is_postgres(conn):
        size = int(conn.execute("SELECT pg_database_size(current_database())").fetchone()[0])
        block = int(conn.execute("SELECT current_setting('block_size')").fetchone()[0])
        return {
            "fileBytes": size,
            "pageSize": block,
            "pages": size // block,
            "freePages": 0,
            "freeBytes": 0,
            "autoVacuum": "server",
        }
    page_size = _pragma_int(conn, "page_size")
    return {
        "fileBytes": file_bytes(path),
        "pageSize": page_size,
        "pages": _pragma_int(conn, "page_count"),
        "freePages": _pragma_int(conn, "freelist_count"),
        "freeBytes": _pragma_int(conn, "freelist_count") * page_size,
        "autoVacuum": AUTO_VACUUM_MODES.get(_pragma_int(conn, "auto_vacuum"), "unknown"),
    }


def database_stats(conn: Conn, path: Path, *, top: int = 10) -> dict[str, Any]:
    """The database's size, its free pages, its auto-vacuum mode, the rows of every table and the
    ``top`` largest sessions by the bytes of their stored events (on the store thread, in a read)."""
    tables = table_names(conn)
    # Table names come from the schema itself, quoted as identifiers.
    rows = {t: int(conn.execute('SELECT COUNT(*) FROM "' + t.replace('"', '""') + '"').fetchone()[0]) for t in tables}
    largest = conn.execute(
        "SELECT session_id, COUNT(*) AS n, SUM(length(data)) AS b, MIN(seq) AS lo, MAX(seq) AS hi FROM events"
        " GROUP BY session_id ORDER BY b DESC LIMIT ?",
        (top,),
    ).fetchall()
    return {
        "path": str(path),
        **_space(conn, path),
        "rows": rows,
        "largestSessions": [
            {
                "sessionId": r["session_id"],
                "events": int(r["n"]),
                "eventBytes": int(r["b"] or 0),
                "firstSeq": int(r["lo"]),
                "lastSeq": int(r["hi"]),
            }
            for r in largest
        ],
    }


def vacuum_step(conn: sqlite3.Connection, pages: int) -> int:
    """Give at most ``pages`` free pages back to the file system (outside any transaction, on the
    store thread); returns how many went. A no-op unless ``auto_vacuum`` is incremental."""
    if pages < 1:
        raise ValueError("pages must be >= 1")
    before = _pragma_int(conn, "freelist_count")
    if before == 0 or _pragma_int(conn, "auto_vacuum") != 2:
        return 0
    # executescript steps the pragma to its end (a plain execute frees one page per step).
    conn.executescript(f"PRAGMA incremental_vacuum({int(pages)});")
    return before - _pragma_int(conn, "freelist_count")


def free_pages(conn: sqlite3.Connection) -> int:
    """The database's free pages (what :func:`vacuum_step` can give back)."""
    return _pragma_int(conn, "freelist_count")


def checkpoint(conn: sqlite3.Connection) -> tuple[int, int, int]:
    """Copy the WAL into the database file and truncate both to what they hold (``PRAGMA
    wal_checkpoint(TRUNCATE)``: busy, WAL frames, frames checkpointed); without it the freed
    pages stay in the file until the next automatic checkpoint."""
    row = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    return (int(row[0]), int(row[1]), int(row[2])) if row is not None else (0, 0, 0)


def vacuum_offline(path: Path) -> dict[str, Any]:
    """Rewrite the database at ``path`` with a full ``VACUUM``, switching it to incremental
    auto-vacuum; returns the sizes before and after. Only while no daemon has the database open
    (the caller holds the state directory's lock): ``VACUUM`` holds the writer for its whole run.
    """
    if not path.exists():
        raise FileNotFoundError(f"no database at {path}")
    before = file_bytes(path)
    conn = sqlite3.connect(str(path), isolation_level=None)
    try:
        mode_before = AUTO_VACUUM_MODES.get(_pragma_int(conn, "auto_vacuum"), "unknown")
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        mode_after = AUTO_VACUUM_MODES.get(_pragma_int(conn, "auto_vacuum"), "unknown")
    finally:
        conn.close()
    return {
        "path": str(path),
        "bytesBefore": before,
        "bytesAfter": file_bytes(path),
        "autoVacuumBefore": mode_before,
        "autoVacuum": mode_after,
    }


__all__ = [
    "AUTO_VACUUM_MODES",
    "PruneStep",
    "checkpoint",
    "database_stats",
    "file_bytes",
    "first_seq_to_keep",
    "free_pages",
    "prune_session_step",
    "session_descendants",
    "session_retention",
    "table_names",
    "vacuum_offline",
    "vacuum_step",
]
