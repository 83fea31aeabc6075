"""Several daemons on one PostgreSQL database: nodes, leases and fencing (:mod:`daemon.cluster.leases`),
the node joined to the runtime and the goal engine (:mod:`daemon.cluster.node`), ``[cluster]``
(:mod:`daemon.cluster.settings`).

A daemon on PostgreSQL is always a node (a cluster of one is a cluster); on SQLite none of this
runs. Why leases and not a consensus protocol of goald's own: PostgreSQL already gives row locks,
``SKIP LOCKED`` and ``LISTEN``/``NOTIFY``, and a replication story operators know.
"""

from daemon.cluster.leases import LeaseManager
from daemon.cluster.settings import ClusterSettings

__all__ = ["ClusterSettings", "LeaseManager"]
