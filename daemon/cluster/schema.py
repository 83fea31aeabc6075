"""The cluster's tables (PostgreSQL only): its nodes and the leases of their sessions.

``nodes``: one row per daemon process (``id`` is the process's incarnation, so a restarted daemon
is a new node and never mistakes its dead predecessor's leases for its own); ``name`` is the
operator's. ``leases``: one row per top-level session that has been held; ``node_id`` NULL is free;
``epoch`` counts takeovers and is the fencing token every driving write compares. Times are the
database's (``now()``), so the nodes' clocks need not agree.
"""

from __future__ import annotations

from agent.schema import Migration

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

MIGRATIONS: list[Migration] = [
    Migration(version=1, summary="cluster nodes and session leases", sql=_NODES_AND_LEASES, postgres=_NODES_AND_LEASES),
]

__all__ = ["MIGRATIONS"]
