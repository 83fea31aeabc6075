"""The cluster's methods: ``node/list`` (every node with its leases and last heartbeat) and
``node/drain`` (a node hands its sessions back at their next idle, for maintenance; ``undo``: it
takes work again).

Both read the lease manager the runtime was given when the daemon joined the cluster
(:mod:`daemon.cluster`), so they need nothing of the host beyond the runtime. On SQLite there is no
cluster: both answer -32007 (not supported by this kind of store), saying what would make one; on
PostgreSQL in the moment between ``READY=1`` and the node's joining, -32002 (try again).
"""

from __future__ import annotations

from loguru import logger
from pydantic import Field

from agent.errors import InvalidTransition, NotFound, NotSupported
from daemon.cluster import LeaseManager
from daemon.ports import HostPort
from daemon.rpc.context import runtime
from daemon.rpc.params import NoParams, Params
from daemon.rpc.protocol import Dispatcher, Peer
from daemon.rpc.views import JsonObject

NO_CLUSTER = (
    "there is no cluster: this daemon's store is a SQLite file; nodes exist when daemons share a"
    ' PostgreSQL database (store = "postgresql://user@host/db")'
)


class NodeDrain(Params):
    """``node/drain``: which node (its name or id; absent: the node that answers), and whether to undo."""

    node: str | None = Field(default=None, min_length=1, max_length=200)
    undo: bool = False


def leases_of(host: HostPort) -> LeaseManager:
    """This node's lease manager; :class:`NotSupported` on SQLite (no cluster), and
    :class:`InvalidTransition` in the moment after ``READY=1`` before the node has joined."""
    rt = runtime(host)
    leases = rt.leases
    if isinstance(leases, LeaseManager):
        return leases
    if rt.store.kind == "postgresql":
        raise InvalidTransition("this node is joining its cluster (right after it started); try again in a moment")
    raise NotSupported(NO_CLUSTER)


def register(d: Dispatcher, host: HostPort) -> None:
    """Add the cluster's methods to ``d``."""

    @d.method("node/list", NoParams)
    async def node_list(p: NoParams, peer: Peer) -> JsonObject:
        leases = leases_of(host)
        # This node as ``daemon/health`` shows it, and every node as the store knows it.
        return {**leases.snapshot(), "nodes": await leases.nodes()}

    @d.method("node/drain", NodeDrain)
    async def node_drain(p: NodeDrain, peer: Peer) -> JsonObject:
        leases = leases_of(host)
        asked = await leases.drain(p.node, undo=p.undo)
        target = p.node if p.node is not None else leases.name
        if not asked:
            raise NotFound(f"no live node named {target!r} (a node's name or id, as `goald node list` shows it)")
        logger.info(
            "node/drain: node {} ({}) {}; asked by {}",
            target,
            ", ".join(asked),
            "takes work again" if p.undo else "hands its sessions back at their next idle",
            _caller_text(peer),
        )
        return {"nodeIds": asked, "draining": not p.undo}


def _caller_text(peer: Peer) -> str:
    caller = peer.caller
    return " ".join(f"{k} {v}" for k, v in caller.items()) if caller else "an unknown caller"


__all__ = ["NO_CLUSTER", "NodeDrain", "leases_of", "register"]
