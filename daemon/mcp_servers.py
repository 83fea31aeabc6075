"""The configured MCP servers, each built with its own sandbox.

With ``sandbox = "bwrap"`` every server runs in a sandbox whose only writable directory is its own
``<state_dir>/mcp/<name>`` and which hides the daemon's state, database, socket, configuration and
credentials; without a usable bwrap none is started (logged), as no command runs unconfined unless
the configuration says so. The servers are built here and started by the host, before the store
opens (sessions' tool lists are built from their listings).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from loguru import logger

from agent import Bwrap, CommandLimits, McpServer, McpServers, Sandbox, SandboxUnavailable, detect_bwrap
from agent.sandbox import SandboxUser, sandbox_user
from agent.sandbox.identity import hand_over, prepare_root
from daemon.settings import McpServerSettings, Settings


async def build_mcp_servers(settings: Settings) -> McpServers:
    """The configured MCP servers (not started). With ``sandbox = "bwrap"`` each runs in a sandbox
    whose only writable directory is its own ``<state_dir>/mcp/<name>``; without a usable bwrap
    none is started (logged), as no command runs unconfined unless the config says so."""
    s = settings
    if not s.mcp_servers:
        return McpServers()
    bwrap = None
    if s.sandbox == "bwrap":
        try:
            bwrap = await asyncio.to_thread(detect_bwrap)
        except SandboxUnavailable as exc:
            logger.error("MCP servers not started: {}", exc)
            return McpServers()
    creds = os.environ.get("CREDENTIALS_DIRECTORY")
    visible = (s.state_dir.expanduser(), s.database_path.parent, s.socket_path.parent, *s.roots)
    config = [s.config_file] if s.config_file is not None else []
    hidden = tuple(p for p in (*visible, *([Path(creds)] if creds else []), *config) if p != Path("/"))
    servers = []
    user = None
    if bwrap is not None and s.mcp_servers:
        try:
            user = sandbox_user(s.sandbox_user)  # a root daemon's servers run as the sandbox user
        except SandboxUnavailable as exc:
            logger.error("MCP servers not started: {}", exc)
            return McpServers()
    for name, cfg in s.mcp_servers.items():
        home = s.state_dir.expanduser() / "mcp" / name
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        if user is not None:  # bwrap, as the sandbox user, passes through to the server's home
            prepare_root(s.state_dir.expanduser(), user, setting="state_dir")
            prepare_root(home.parent, user, setting="state_dir")
            hand_over(home, user)
        box = None
        if bwrap is not None:
            try:
                box = _server_sandbox(s, cfg, home, hidden, bwrap, user)
            except SandboxUnavailable as exc:
                logger.error("MCP server {} not started: {}", name, exc)
                continue
        servers.append(
            McpServer(
                name,
                cfg.command,
                cfg.env,
                sandbox=box,
                cwd=home,
                start_timeout=cfg.start_timeout_seconds,
                call_timeout=cfg.timeout_seconds,
            )
        )
    return McpServers(servers)


def _server_sandbox(
    s: Settings,
    cfg: McpServerSettings,
    home: Path,
    hidden: tuple[Path, ...],
    bwrap: Bwrap,
    user: SandboxUser | None,
) -> Sandbox:
    """One server's sandbox: its home writable, the daemon's own paths hidden."""
    # The sandbox starts from an empty environment: the server's variables go in with it,
    # as secrets (on no command line; redacted from its output).
    return Sandbox(
        home,
        hidden=hidden,
        network=cfg.network,
        secrets=cfg.env,
        bwrap=bwrap.path,
        disable_userns=bwrap.disable_userns,
        unshare_ipc=bwrap.unshare_ipc,
        read_only=(*s.sandbox_read_only_paths, *cfg.read_only_paths),
        run_as=None if user is None else user.ids,
        # Its own group for each start, under these caps (agent.tools.mcp).
        limits=CommandLimits.of(
            s.sandbox_max_processes if cfg.max_processes is None else cfg.max_processes,
            s.sandbox_max_memory_mb if cfg.max_memory_mb is None else cfg.max_memory_mb,
        ),
    )
