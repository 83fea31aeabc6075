"""The cluster's rows: what a node reads and writes in the ``nodes`` and ``leases`` tables.

Plain functions of a connection, each run in one transaction on the lease manager's own connection
(:class:`daemon.cluster.leases.LeaseManager`, which says what a lease means and when each runs),
except :func:`lease_of`, which the fence reads inside the store's writing transaction. A lease is
free when no node holds it or its holder stopped renewing (:data:`FREE`); a claim takes free rows
``FOR UPDATE SKIP LOCKED``, so nodes claiming at once take different sessions, and raises the
epoch, which is what fences a late write of the node that held it before.

The tables (PostgreSQL only, :data:`MIGRATIONS`): ``nodes``, one row per daemon process (``id`` is
the process's incarnation, so a restarted daemon is a new node and never mistakes its dead
predecessor's leases for its own; ``name`` is the operator's); ``leases``, one row per top-level
session that has been held (``node_id`` NULL is free; ``epoch`` counts takeovers and is the fencing
token every driving write compares). Times are the database's (``now()``), so the nodes' clocks
need not agree.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any

from agent.db import Conn
from agent.errors import InvalidInput, NotFound
from agent.ids import SessionId
from agent.inbox import sessions_with_work
from agent.schema import Migration
from agent.sessions import load_session
from goals.store import live_goal_sessions

_NODES_AND_LEASES = """
CREATE TABLE nodes (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    host TEXT NOT NULL,
    pid BIGINT NOT NULL,
    labels TEXT NOT NULL DEFAULT '[]',
    lease_limit BIGINT NOT NULL,
    started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    draining BIGINT NOT NULL DEFAULT 0,
    stopped_at TIMESTAMPTZ
);
CREATE INDEX nodes_live ON nodes(heartbeat_at) WHERE stopped_at IS NULL;
CREATE TABLE leases (
    session_id TEXT PRIMARY KEY,
    node_id TEXT,
    epoch BIGINT NOT NULL DEFAULT 0,
    expires_at TIMESTAMPTZ,
    acquired_at TIMESTAMPTZ,
    taken_from TEXT
);
CREATE INDEX leases_node ON leases(node_id) WHERE node_id IS NOT NULL;
"""

#: The lease fence a driving write's ``COMMIT`` carries (:func:`fence_statement`): a function made
#: once, so that the check is planned once per connection rather than compiled with each write (as a
#: ``DO`` block is), and is one expression of the ``SELECT`` that also sends the write's notices.
_FENCE = """
CREATE OR REPLACE FUNCTION goald_fence(sid TEXT, node TEXT, held_epoch BIGINT) RETURNS VOID
LANGUAGE plpgsql AS $fence$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM leases WHERE session_id = sid AND node_id = node AND epoch = held_epoch) THEN
        RAISE EXCEPTION USING ERRCODE = 'GD001', MESSAGE = 'goald: the session''s lease was lost';
    END IF;
END
$fence$;
"""

MIGRATIONS: list[Migration] = [
    Migration(version=1, summary="cluster nodes and session leases", sql=_NODES_AND_LEASES, postgres=_NODES_AND_LEASES),
    Migration(version=2, summary="the lease fence as a function", sql=_FENCE, postgres=_FENCE),
]

#: A lease no live node holds (the same test the claim uses).
FREE = "(l.node_id IS NULL OR l.expires_at IS NULL OR l.expires_at < now())"
#: The channel a lease handed back is announced on (other nodes claim at once).
LEASES_CHANNEL = "goald_leases"


def _until(ttl: float) -> str:
    return f"now() + {float(ttl)} * interval '1 second'"


def register_node(conn: Conn, node_id: str, name: str, labels: list[str], lease_limit: int) -> None:
    """Add this node (nodes that left, or went silent, a week ago are history: their rows go)."""
    conn.execute("DELETE FROM nodes WHERE heartbeat_at < now() - interval '7 days'")
    conn.execute(
        "INSERT INTO nodes(id, name, host, pid, labels, lease_limit) VALUES (?,?,?,?,?,?)",
        (node_id, name, socket.gethostname(), os.getpid(), json.dumps(sorted(set(labels))), lease_limit),
    )


def leave(conn: Conn, node_id: str) -> int:
    """Free every lease the node holds and mark it stopped; returns how many were freed."""
    freed = conn.execute("UPDATE leases SET node_id = NULL, expires_at = NULL WHERE node_id = ?", (node_id,)).rowcount
    conn.execute("UPDATE nodes SET stopped_at = now() WHERE id = ?", (node_id,))
    conn.execute(f"SELECT pg_notify('{LEASES_CHANNEL}', ?)", (node_id,))
    return int(freed)


def renew(conn: Conn, node_id: str, ttl: float) -> tuple[dict[str, int], bool]:
    """The heartbeat's write: the node's leases renewed for ``ttl`` (each held session with its
    epoch: one missing was taken over) and whether the node is asked to drain."""
    row = conn.execute("UPDATE nodes SET heartbeat_at = now() WHERE id = ? RETURNING draining", (node_id,)).fetchone()
    rows = conn.execute(
        f"UPDATE leases SET expires_at = {_until(ttl)} WHERE node_id = ? RETURNING session_id, epoch",
        (node_id,),
    ).fetchall()
    return {str(r[0]): int(r[1]) for r in rows}, bool(row[0]) if row is not None else False


def try_job_lock(conn: Conn, job_class: int, key: int) -> bool:
    """Take the session-level advisory lock of one cluster job, if no other node holds it."""
    row = conn.execute(f"SELECT pg_try_advisory_lock({int(job_class)}, {int(key)})").fetchone()
    return bool(row is not None and row[0])


def candidates(conn: Conn, labels: set[str]) -> tuple[set[str], set[str]]:
    """Free work: sessions never held (or handed back), and sessions whose holder stopped renewing.

    The work (each package answers for its own tables): sessions with a waking message queued or a
    turn left open, and live goals' sessions; less those a live node holds."""
    goals = live_goal_sessions(conn)
    elsewhere = {sid for sid, need in goals.items() if need is not None and need not in labels}
    wanted = (sessions_with_work(conn) | set(goals)) - elsewhere
    if not wanted:
        return set(), set()
    rows = conn.execute("SELECT l.session_id, l.node_id IS NOT NULL, " + FREE + " FROM leases l").fetchall()
    held = {str(r[0]) for r in rows if not r[2]}
    expired = {str(r[0]) for r in rows if r[1] and r[2]}
    free = wanted - held
    return free - expired, free & expired


def take(conn: Conn, node_id: str, ttl: float, sessions: list[str]) -> dict[str, tuple[int, str | None]]:
    """Claim those of ``sessions`` that are free: each taken with its new epoch and the node that
    held it before (``None``: it was free)."""
    marks = ",".join("?" * len(sessions))
    for sid in sessions:
        conn.execute("INSERT INTO leases(session_id) VALUES (?) ON CONFLICT DO NOTHING", (sid,))
    free = conn.execute(
        f"SELECT l.session_id, l.node_id FROM leases l WHERE l.session_id IN ({marks}) AND {FREE}"
        " ORDER BY l.session_id FOR UPDATE SKIP LOCKED",
        sessions,
    ).fetchall()
    out: dict[str, tuple[int, str | None]] = {}
    for row in free:
        got = conn.execute(
            "UPDATE leases SET node_id = ?, epoch = epoch + 1, acquired_at = now(), taken_from = node_id,"
            f" expires_at = {_until(ttl)} WHERE session_id = ? RETURNING epoch",
            (node_id, row[0]),
        ).fetchone()
        out[str(row[0])] = (int(got[0]), str(row[1]) if row[1] is not None else None)
    return out


def hand_back(conn: Conn, session_id: str, node_id: str, epoch: int) -> None:
    """Free one lease the node holds at ``epoch`` (for any node to claim; announced)."""
    conn.execute(
        "UPDATE leases SET node_id = NULL, expires_at = NULL WHERE session_id = ? AND node_id = ? AND epoch = ?",
        (session_id, node_id, epoch),
    )
    conn.execute(f"SELECT pg_notify('{LEASES_CHANNEL}', ?)", (session_id,))


def fence_statement(root: str, node_id: str, epoch: int) -> str:
    """An expression (no parameters: it travels with a transaction's ``COMMIT``, in one text, in the
    ``SELECT`` that sends its notices) that fails, aborting the transaction, unless the lease of
    ``root`` names ``node_id`` at ``epoch`` (the ``goald_fence`` function, :data:`MIGRATIONS`)."""
    from psycopg import sql

    call = sql.SQL("goald_fence({}, {}, {})").format(sql.Literal(root), sql.Literal(node_id), sql.Literal(epoch))
    return call.as_string(None)


def lease_of(conn: Conn, session_id: str) -> tuple[str | None, int] | None:
    """The session's lease as stored: its holder (``None``: free) and epoch; ``None``: no lease row."""
    row = conn.execute("SELECT node_id, epoch FROM leases WHERE session_id = ?", (session_id,)).fetchone()
    return None if row is None else (row[0], int(row[1]))


def node_views(conn: Conn, node_id: str, ttl: float) -> list[dict[str, Any]]:
    """Every node that has not left, with its leases and last heartbeat (``self``: ``node_id``)."""
    rows = conn.execute(
        "SELECT n.id, n.name, n.host, n.pid, n.labels, n.draining, n.lease_limit,"
        " EXTRACT(EPOCH FROM now() - n.heartbeat_at), n.started_at::text,"
        " (SELECT COUNT(*) FROM leases l WHERE l.node_id = n.id) FROM nodes n"
        " WHERE n.stopped_at IS NULL AND n.heartbeat_at > now() - interval '1 day' ORDER BY n.name, n.id"
    ).fetchall()
    return [
        {
            "nodeId": r[0],
            "name": r[1],
            "host": r[2],
            "pid": int(r[3]),
            "labels": json.loads(r[4]),
            "draining": bool(r[5]),
            "leaseLimit": int(r[6]),
            "heartbeatSecondsAgo": round(float(r[7]), 3),
            "alive": float(r[7]) < ttl,
            "startedAt": r[8],
            "leases": int(r[9]),
            "self": r[0] == node_id,
        }
        for r in rows
    ]


def mark_draining(conn: Conn, target: str, undo: bool) -> list[str]:
    """Ask the node named or numbered ``target`` to drain (``undo``: to take work again); returns
    the ids of the nodes asked."""
    rows = conn.execute(
        "UPDATE nodes SET draining = ? WHERE (id = ? OR name = ?) AND stopped_at IS NULL RETURNING id",
        (0 if undo else 1, target, target),
    ).fetchall()
    return [str(r[0]) for r in rows]


def holder_names(conn: Conn, session_ids: list[str]) -> dict[str, str]:
    """The name of the node holding each of ``session_ids`` under a live lease (others left out)."""
    rows = conn.execute(
        "SELECT l.session_id, n.name FROM leases l JOIN nodes n ON n.id = l.node_id"
        " WHERE l.session_id = ANY(?) AND l.expires_at > now()",
        (list(session_ids),),
    ).fetchall()
    return {str(r[0]): str(r[1]) for r in rows}


def root_of(conn: Conn, session_id: str) -> str:
    """The top-level session of ``session_id`` (its lease covers the session's subagents)."""
    sid = session_id
    for _ in range(64):
        try:
            parent = load_session(conn, SessionId.parse(sid)).parent_session_id
        except (NotFound, InvalidInput):
            return sid
        if parent is None:
            return sid
        sid = str(parent)
    return sid


def holder(conn: Conn, session_id: str) -> str:
    """Who drives the session, in words (the answer of a node that does not)."""
    row = conn.execute(
        "SELECT n.name, n.id FROM leases l JOIN nodes n ON n.id = l.node_id WHERE l.session_id = ?"
        " AND l.expires_at > now()",
        (session_id,),
    ).fetchone()
    if row is None:
        return "no node yet (a node with room takes it at its next heartbeat)"
    return f"node {row[0]} ({row[1]})"
