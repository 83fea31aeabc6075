"""The daemon's own methods: ``initialize``, ``daemon/health``, ``daemon/reload`` and ``shutdown``.

``daemon/health`` is the host's health (state, uptime, goals by status, providers, storage) with
what an operator asks next: the process id, the config file and state directory in use, the
database's size on disk, the socket, and the next schedule fire.
"""

from __future__ import annotations

import asyncio
import os
from typing import TypedDict

from agent.errors import StorageUnavailable
from agent.retention import file_bytes
from daemon import __version__
from daemon.rpc.context import HostPort
from daemon.rpc.params import NoParams
from daemon.rpc.protocol import PROTOCOL_VERSION, Dispatcher, Peer
from daemon.rpc.views import Empty, JsonObject
from daemon.schedule.service import Scheduler


class ServerInfo(TypedDict):
    """Who answers."""

    name: str
    version: str


class Initialized(TypedDict):
    """``initialize``'s answer."""

    serverInfo: ServerInfo
    protocolVersion: int


def register(d: Dispatcher, host: HostPort) -> None:
    """Add the daemon's own methods to ``d``."""

    @d.method("initialize", NoParams)
    async def initialize(p: NoParams, peer: Peer) -> Initialized:
        return {"serverInfo": {"name": "goald", "version": __version__}, "protocolVersion": PROTOCOL_VERSION}

    @d.method("daemon/health", NoParams)
    async def health(p: NoParams, peer: Peer) -> JsonObject:
        s = host.settings
        out = dict(await host.health())
        out["pid"] = os.getpid()
        out["configPath"] = str(s.config_file) if s.config_file is not None else None
        out["stateDir"] = str(s.state_dir.expanduser())
        rt = host.rt
        if rt is not None:
            # The store as it is open: the SQLite file, or the PostgreSQL URL without a password.
            out["store"] = rt.store.kind
            out["databasePath"] = rt.store.location
            # How it is reached: its connections, and (PostgreSQL) the round trips made so far and
            # the writes run again because another writer had changed their session meanwhile.
            out["storeConnections"], out["storeRoundTrips"] = rt.store.connections, rt.store.round_trips
            out["storeReruns"] = rt.store.reruns
            try:
                out["databaseBytes"] = await rt.store.size_bytes()
            except StorageUnavailable:  # the outage is in "storage"; the health still answers
                out["databaseBytes"] = None
        else:
            out["store"] = "postgresql" if s.store is not None else "sqlite"
            out["databasePath"] = str(s.database_path)
            out["databaseBytes"] = await asyncio.to_thread(file_bytes, s.database_path)
        out["socketPath"] = str(s.socket_path)
        out["nextFire"] = await _next_fire(host.scheduler)
        return out

    @d.method("daemon/reload", NoParams)
    async def reload(p: NoParams, peer: Peer) -> dict[str, int]:
        return await host.reload()

    @d.method("shutdown", NoParams)
    async def shutdown(p: NoParams, peer: Peer) -> Empty:
        asyncio.get_running_loop().call_soon(host.request_stop)
        return {}


async def _next_fire(sched: Scheduler | None) -> JsonObject | None:
    """The soonest planned fire of any schedule (``None``: no schedule will fire)."""
    if sched is None:
        return None
    try:
        listed = await sched.list()
    except StorageUnavailable:  # unreachable (PostgreSQL): the health says so under "storage"
        return None
    planned = [s for s in listed if s.next_fire_at is not None]
    if not planned:
        return None
    first = min(planned, key=lambda s: s.next_fire_at or 0)
    at = first.next_fire_at
    return {"scheduleId": first.id, "key": first.key, "at": at.isoformat() if at else None, "timezone": first.timezone}
