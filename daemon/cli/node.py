"""``goald node list`` and ``goald node drain [NODE] [--undo]``: the daemons sharing one PostgreSQL
database, and handing a node's sessions back for maintenance.

The nodes are shown the same way here and in ``goald status`` (:func:`cluster_lines`): one line per
node with its name, id, whether it is alive (its last heartbeat within the lease TTL), the leases it
holds of its limit, how long ago it last renewed them, whether it drains, and its labels; the node
that answered is marked "this node". A drain is a request, not a wait: the node hands each session
back at that session's next idle, so the command returns at once and ``node list`` shows the lease
count falling.
"""

from __future__ import annotations

import argparse
from typing import Any

from daemon.cli.parser import EXIT_OK, print_json
from daemon.client import Connection
from goals.why import span


def heartbeat_words(seconds: float | None) -> str:
    """How long ago a heartbeat was, in words (``just now``, ``4s ago``, ``2m10s ago``)."""
    if seconds is None:
        return "no heartbeat yet"
    return "heartbeat just now" if seconds < 1 else f"heartbeat {span(seconds)} ago"


def node_line(n: dict[str, Any], widths: tuple[int, int] = (0, 0)) -> str:
    """One node of ``node/list`` (or ``daemon/health``'s ``cluster.nodes``) as a line."""
    name, nid = str(n.get("name")), str(n.get("nodeId"))
    parts = [
        "alive" if n.get("alive") else "SILENT (not renewing: its leases expire)",
        f"leases {n.get('leases', 0)}/{n.get('leaseLimit', '-')}",
        heartbeat_words(n.get("heartbeatSecondsAgo")),
    ]
    if n.get("draining"):
        parts.append("draining")
    labels = n.get("labels") or []
    parts.append(f"labels {','.join(labels)}" if labels else "no labels")
    if n.get("self"):
        parts.append("(this node)")
    return f"{name:<{widths[0]}}  {nid:<{widths[1]}}  " + ", ".join(parts)


def cluster_lines(cluster: dict[str, Any] | None) -> list[str]:
    """``daemon/health``'s ``cluster`` (or the ``node/list`` answer) as a ``nodes:`` section; none
    on SQLite (``None``)."""
    if not cluster:
        return []
    ttl = float(cluster.get("leaseTtlSeconds") or 0)
    head = f"nodes:     this node is {cluster.get('name')} ({cluster.get('nodeId')}); lease TTL {ttl:g}s"
    if cluster.get("draining"):
        head += "; DRAINING: its sessions go back at their next idle"
    out = [head]
    if cluster.get("error"):
        out.append(f"  cannot renew leases: {cluster['error']}")
    nodes = cluster.get("nodes")
    if nodes is None:
        out.append("  the other nodes are unknown: the database cannot be read")
        return out
    widths = (
        max((len(str(n.get("name"))) for n in nodes), default=0),
        max((len(str(n.get("nodeId"))) for n in nodes), default=0),
    )
    out.extend(f"  {node_line(n, widths)}" for n in nodes)
    return out


async def node_command(client: Connection, args: argparse.Namespace) -> int:
    """Run ``node list`` or ``node drain`` against the daemon."""
    if args.node_command == "list":
        view = await client.call("node/list")
        if args.json:
            print_json(view)
        else:
            print("\n".join(cluster_lines(view)))
        return EXIT_OK
    params: dict[str, Any] = {"undo": bool(args.undo)}
    if args.node is not None:
        params["node"] = args.node
    result = await client.call("node/drain", params)
    if args.json:
        print_json(result)
    else:
        who = args.node or "this node"
        ids = ", ".join(result.get("nodeIds") or [])
        if args.undo:
            print(f"{who} ({ids}) takes work again")
        else:
            print(f"{who} ({ids}) drains: it hands each session back at its next idle and takes no new work")
    return EXIT_OK
