"""Several daemons on one PostgreSQL database: nodes, leases and fencing (:mod:`daemon.cluster.leases`),
the node joined to the runtime and the goal engine (:mod:`daemon.cluster.node`), ``[cluster]``
(:mod:`daemon.cluster.settings`).

A daemon on PostgreSQL is always a node (a cluster of one is a cluster); on SQLite none of this
runs. Why leases and not a consensus protocol of goald's own: PostgreSQL already gives row locks,
``SKIP LOCKED`` and ``LISTEN``/``NOTIFY``, and a replication story operators know.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from daemon.cluster.leases import LeaseManager
    from daemon.cluster.settings import ClusterSettings

#: Where each name lives, imported on first use: the settings read ``[cluster]`` without loading the
#: leases (and the goal engine they use).
_HOMES: dict[str, str] = {
    "ClusterSettings": "daemon.cluster.settings",
    "LeaseManager": "daemon.cluster.leases",
}

if not TYPE_CHECKING:  # (mypy reads the imports above; a module ``__getattr__`` would make every name Any)
    from agent.lazy import lazy_exports

    __getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())


__all__ = ["ClusterSettings", "LeaseManager"]
