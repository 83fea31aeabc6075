"""``goald acp``: the ACP bridge on stdin/stdout, with the daemon host embedded in this process.

stdout carries protocol messages and nothing else. Before anything starts, the process keeps
private duplicates of its stdin and stdout for the protocol, points file descriptor 1 at stderr
and descriptor 0 at ``/dev/null``: a stray ``print``, a library that writes to stdout, or a child
process (a verification command) inheriting the descriptors can then never corrupt the stream
or swallow the editor's input. Logs go to stderr.

The host is the daemon's own (:class:`daemon.host.Host`: store, crash repair, goal engine,
scheduler, a control socket in the state directory), so ``goald --socket STATE/goald.sock status``
inspects a running bridge. The bridge stops when the editor closes stdin, or on SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from pathlib import Path
from typing import Any, cast

from acp.agent.connection import AgentSideConnection
from acp.interfaces import Agent
from loguru import logger

from daemon.acp.bridge import AcpBridge
from daemon.host import Host
from daemon.settings import Settings, load_settings


def acp_settings(config: Path | None, state_dir: Path | None) -> Settings:
    """The bridge's settings: the config file's, with the database and control socket in the
    bridge's own state directory (``--state-dir``, else ``acp/`` inside the configured one), so
    that it never shares a database with a ``goald serve`` on the same machine.

    Raises:
        ConfigError: the file or the environment is invalid.
    """
    base = load_settings(config)
    where = (state_dir or base.state_dir / "acp").expanduser().absolute()
    return load_settings(config, state_dir=where, database=where / "goald.db", socket=where / "goald.sock")


def claim_stdio() -> tuple[int, int]:
    """Keep private copies of stdin and stdout for the protocol; point fd 0 at /dev/null and fd 1
    at stderr. Returns ``(protocol_in, protocol_out)``."""
    sys.stdout.flush()
    proto_in, proto_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
    finally:
        os.close(null)
    os.dup2(2, 1)
    return proto_in, proto_out


async def _streams(proto_in: int, proto_out: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1024 * 1024)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(proto_in, "rb", 0))
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, os.fdopen(proto_out, "wb", 0))
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    return reader, writer


async def run_acp(settings: Settings, proto_in: int, proto_out: int) -> int:
    """Serve ACP on the given descriptors until the client closes its end; returns an exit code."""
    host = Host(settings)
    host_task = asyncio.get_running_loop().create_task(host.run(), name="goald host")
    ready = asyncio.get_running_loop().create_task(host.ready.wait())
    await asyncio.wait({host_task, ready}, return_when=asyncio.FIRST_COMPLETED)
    if not ready.done():
        ready.cancel()
        exc = host_task.exception()
        print(f"goald acp: the daemon could not start: {exc}", file=sys.stderr)
        return 1
    bridge = AcpBridge(host)
    try:
        reader, writer = await _streams(proto_in, proto_out)
    except (OSError, ValueError) as exc:
        print(f"goald acp: stdin/stdout cannot carry the protocol: {exc}", file=sys.stderr)
        host.request_stop()
        await host_task
        return 1
    # The SDK answers the optional methods the bridge does not implement with "method not found".
    conn = AgentSideConnection(cast(Agent, bridge), writer, reader, listening=False)
    listen = asyncio.get_running_loop().create_task(conn.listen(), name="acp connection")
    logger.info("ACP bridge ready (state directory {})", settings.state_dir)
    try:
        await asyncio.wait({listen, host_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await bridge.close()
        await conn.close()
        listen.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await listen
        host.request_stop()
        code: Any = await host_task
    logger.info("ACP bridge stopped")
    return int(code or 0)
