"""An MCP server runs under the daemon's process and memory caps, in a group of its own (real bwrap).

The daemon's :func:`daemon.mcp_servers.build_mcp_servers` starts a real stdio server in its sandbox with
``sandbox_max_processes`` / ``sandbox_max_memory_mb`` (or the server's own ``max_processes`` /
``max_memory_mb``): the server's process, found by its command line in the host's ``/proc``, is in
a group (read from ``/proc/PID/cgroup``) whose process and memory limits are the configured ones;
a server that tries to fork 200 processes starts fewer than its cap; after the servers stop, the
group is gone. Neither the secrets nor the mounts are on any command line of the server's
processes (bwrap reads both from a pipe).
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from agent import SandboxUnavailable, ToolContext, ToolRegistry, detect_bwrap
from agent.limits import MIB, Mechanism, limiter
from daemon.mcp_servers import build_mcp_servers
from daemon.settings import ConfigError, load_settings

#: The server's interpreter: the system's, which every sandbox shows (the server needs only the
#: standard library); where there is none, this interpreter, shown read-only by its prefix.
SYSTEM_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else None
BASE_PYTHON = SYSTEM_PYTHON or os.path.realpath(sys.executable)

FORKER = r"""
import json, os, sys, time

def forks(n):
    children = []
    for _ in range(n):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        children.append(pid)
    for pid in children:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    return len(children)

TOOLS = [{"name": "forks", "description": "fork n processes; how many started",
          "inputSchema": {"type": "object", "properties": {"n": {"type": "integer"}}}}]
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg or "method" not in msg:
        continue
    method, params = msg["method"], msg.get("params") or {}
    reply = {"jsonrpc": "2.0", "id": msg["id"]}
    if method == "initialize":
        reply["result"] = {"protocolVersion": params["protocolVersion"], "capabilities": {"tools": {}},
                           "serverInfo": {"name": "forker", "version": "1"}}
    elif method == "tools/list":
        reply["result"] = {"tools": TOOLS}
    elif method == "tools/call":
        text = str(forks(params["arguments"]["n"]))
        reply["result"] = {"content": [{"type": "text", "text": text}], "isError": False}
    else:
        reply["error"] = {"code": -32601, "message": "Method not found"}
    print(json.dumps(reply), flush=True)
"""


def ctx() -> ToolContext:
    return ToolContext(session_id="s", turn_id="t", call_id="c")


def processes_running(script: Path) -> list[int]:
    """Host PIDs of the interpreter running ``script`` (not the bwrap processes that name it)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[0] == os.fsencode(BASE_PYTHON) and os.fsencode(script) in argv:
                found.append(int(entry))
    return found


def command_lines(pids: set[int]) -> list[bytes]:
    return [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in pids]


def limit_files(pid: int) -> dict[str, Path]:
    """The files holding the process and memory limits of ``pid``'s groups, by this machine's mechanism."""
    groups: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            groups[controller] = path
    found = limiter()
    if found.mechanism is Mechanism.CGROUP_V2:
        group = found.base / Path(groups[""]).name  # type: ignore[attr-defined]
        return {"pids": group / "pids.max", "memory": group / "memory.max"}
    assert found.mechanism is Mechanism.CGROUP_V1
    bases = found.bases  # type: ignore[attr-defined]
    return {
        "pids": bases["pids"] / Path(groups["pids"]).name / "pids.max",
        "memory": bases["memory"] / Path(groups["memory"]).name / "memory.limit_in_bytes",
    }


@pytest.mark.parametrize("own_keys", [False, True])
async def test_an_mcp_server_runs_in_a_group_of_its_own_under_the_caps(tmp_path: Path, own_keys: bool) -> None:
    try:
        await asyncio.to_thread(detect_bwrap)
    except SandboxUnavailable as exc:
        pytest.skip(f"no usable bubblewrap here: {exc}")
    if BASE_PYTHON.startswith("/tmp/"):
        pytest.skip("the interpreter lives under /tmp, which the sandbox replaces")
    if limiter().mechanism is Mechanism.RLIMIT:
        pytest.skip("no writable cgroup here: limits are rlimits per process")
    state = tmp_path / "state"
    home = state / "mcp" / "forker"
    home.mkdir(parents=True)
    script = home / "server.py"
    script.write_text(FORKER)
    server: dict[str, object] = {
        "command": [BASE_PYTHON, str(script)],
        "env": {"FORKER_TOKEN": "tok-5b1d3e7f9a"},
        "read_only_paths": [] if SYSTEM_PYTHON else [sys.base_prefix],
    }
    caps = (24, 160)
    if own_keys:  # the server's own keys beat the daemon-wide defaults
        server |= {"max_processes": caps[0], "max_memory_mb": caps[1]}
        defaults = {"sandbox_max_processes": 500, "sandbox_max_memory_mb": 4000}
    else:
        defaults = {"sandbox_max_processes": caps[0], "sandbox_max_memory_mb": caps[1]}
    settings = load_settings(None, state_dir=state, sandbox="bwrap", mcp_servers={"forker": server}, **defaults)

    async with await build_mcp_servers(settings) as servers:
        reg = ToolRegistry(list(servers.tools()))
        assert reg.names == ["forker__forks"]
        (pid,) = processes_running(script)  # the server itself, inside bwrap
        files = limit_files(pid)
        assert files["pids"].read_text().strip() == str(caps[0])
        assert int(files["memory"].read_text()) == caps[1] * MIB
        group = files["pids"].parent
        assert group.name.startswith(f"goald-{os.getpid()}-")
        # Every process of the server is in it: bwrap's too (they started from the launching bash).
        members = {int(p) for p in (group / "cgroup.procs").read_text().split()}
        assert pid in members and len(members) >= 3, members
        for argv in command_lines(members):
            assert b"tok-5b1d3e7f9a" not in argv, argv
            assert not {b"--bind", b"--ro-bind", b"--tmpfs"} & set(argv.split(b"\0")), argv  # mounts: a pipe

        out = await reg.call("forker__forks", {"n": 200}, ctx())
        assert not out.is_error, out.content
        started = int(out.content)
        assert 0 < started < caps[0], started
    assert not group.exists()  # removed with the server


def test_an_mcp_servers_caps_are_checked_like_a_goals(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"mcp_servers\.x\.max_processes.*at least 8"):
        load_settings(
            None,
            state_dir=tmp_path,
            mcp_servers={"x": {"command": ["true"], "max_processes": 2}},
        )
