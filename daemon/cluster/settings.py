"""``[cluster]``: this daemon as one node of several on one PostgreSQL database (:mod:`daemon.cluster`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ClusterSettings(BaseModel):
    """How this node takes part in a cluster (read only when ``store`` is a PostgreSQL URL)."""

    model_config = ConfigDict(extra="forbid")

    #: The node's name in ``goald status`` and ``goald node drain`` (default: the host name).
    node_name: str | None = Field(default=None, min_length=1, max_length=100)
    #: Labels a goal can require of the node that runs it (``goal add --node-label``): the host that
    #: has the goal's work directory or toolchain.
    labels: list[str] = []
    #: Seconds a lease lasts without renewal: a node that stops renewing (a crash, a partition)
    #: loses its sessions to the others this long after its last heartbeat.
    lease_ttl_seconds: float = Field(default=15.0, ge=1.0, le=3600.0)
    #: Sessions this node holds at most (live goals and sessions with work). This bounds what it
    #: drives, not how many turns run at once (``max_concurrent_turns``).
    lease_limit: int = Field(default=1000, ge=1, le=1_000_000)
    #: Whether the work directories are on a file system every node mounts at the same path. When
    #: not, a node that takes over a goal whose work directory it does not have pauses the goal.
    shared_workdirs: bool = False

    @property
    def heartbeat_seconds(self) -> float:
        """How often leases are renewed and free work is claimed: well inside the TTL (a third)."""
        return self.lease_ttl_seconds / 3


__all__ = ["ClusterSettings"]
