"""The daemon's own methods: ``initialize``, ``daemon/health``, ``daemon/reload`` and ``shutdown``."""

from __future__ import annotations

import asyncio
from typing import TypedDict

from daemon import __version__
from daemon.rpc.context import HostPort
from daemon.rpc.params import NoParams
from daemon.rpc.protocol import PROTOCOL_VERSION, Dispatcher, Peer
from daemon.rpc.views import Empty, JsonObject


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
        return await host.health()

    @d.method("daemon/reload", NoParams)
    async def reload(p: NoParams, peer: Peer) -> dict[str, int]:
        return await host.reload()

    @d.method("shutdown", NoParams)
    async def shutdown(p: NoParams, peer: Peer) -> Empty:
        asyncio.get_running_loop().call_soon(host.request_stop)
        return {}
