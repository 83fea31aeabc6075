"""``goal/export`` and ``goal/import``: a goal with its sessions and events between daemons
(the document is :mod:`daemon.transfer`'s)."""

from __future__ import annotations

from typing import Any

from daemon.ports import HostPort
from daemon.rpc.context import runtime, taking_work
from daemon.rpc.params import Params
from daemon.rpc.protocol import Dispatcher, Peer
from daemon.rpc.views import JsonObject
from daemon.transfer import export_goal, import_goal


class GoalExport(Params):
    """``goal/export``: the goal (an ended one)."""

    goal_id: str


class GoalImport(Params):
    """``goal/import``: a document ``goal/export`` returned."""

    document: dict[str, Any]


def register(d: Dispatcher, host: HostPort) -> None:
    """Add the transfer methods to ``d``."""

    @d.method("goal/export", GoalExport)
    async def export(p: GoalExport, peer: Peer) -> JsonObject:
        return await export_goal(runtime(host).store, p.goal_id)

    @d.method("goal/import", GoalImport)
    async def import_(p: GoalImport, peer: Peer) -> JsonObject:
        taking_work(host)
        return await import_goal(runtime(host).store, p.document)
