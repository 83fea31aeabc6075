"""The sandbox's census, tested whole: what a command holds, for every kind of command and setting.

A probe (:data:`agent.sandbox.census.PROBE`) runs inside the real sandbox through each path the
daemon runs commands by: the shell tool, a verification command and a progress command (the goal
engine's runner), an MCP server (the launcher a spawner without descriptors uses) and a
notification command (the command sink). What it reports is compared with
:func:`agent.sandbox.census.expected` for network off, an allow list (through the daemon's proxy),
the host's network, extra read-only paths and secrets: any descriptor, mount, capability,
namespace, variable or answering host socket not in the census fails, whatever attack would have
used it. An MCP server cannot have an allow list (its launcher refuses one).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sandboxkit import bwrap

from agent.limits import MIB, CommandLimits
from agent.sandbox import (
    Network,
    NetworkProxy,
    Sandbox,
    SandboxPolicy,
    SandboxProfile,
    SandboxResult,
    SandboxUnavailable,
    census,
    sandbox_user,
)
from agent.sandbox.identity import hand_over, prepare_root
from agent.tools.base import ToolContext
from agent.tools.shell import Shell
from daemon.alerts.config import CommandSink
from daemon.alerts.sinks import Command
from goals.model import VerifyCommand
from goals.verify import sandboxed_runner

pytestmark = pytest.mark.needs_bwrap

SECRET = "census-secret-value-0123456789"
KINDS = ("shell", "verification", "progress", "mcp", "notification")
SETTINGS = ("network_off", "network_allow", "network_host", "read_only", "secrets")
#: What bash adds to the environment of a command it runs (the shell tool and the goal's commands run
#: through ``bash -c``).
BASH = ("SHLVL", "_")


@contextlib.contextmanager
def host_endpoints() -> Iterator[list[str]]:
    """A TCP listener on the host's loopback and an abstract unix socket of the host."""
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(8)
    name = f"goald-census-{os.getpid()}"
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind("\0" + name)
    abstract.listen(8)
    try:
        yield [f"tcp:127.0.0.1:{tcp.getsockname()[1]}", f"abstract:{name}"]
    finally:
        tcp.close()
        abstract.close()


@pytest.fixture
def place(outside: Path) -> Iterator[tuple[SandboxProfile, Path, Path]]:
    """A profile as a daemon on this machine builds it (the sandbox user when root, caps set), a
    work directory made as the daemon makes one, and a toolchain directory to show read-only."""
    found = bwrap()
    user = sandbox_user()
    root = outside / "work"
    prepare_root(root, user)
    workdir = root / "g"
    workdir.mkdir(mode=0o700)
    hand_over(workdir, user)
    tool = outside / "toolchain"
    tool.mkdir()
    tool.chmod(0o755)
    profile = SandboxProfile(
        bwrap=found,
        user=user,
        hidden=(outside / "state",),
        roots=(root,),
        limits=CommandLimits(256, 512 * MIB),
        kill_grace=0.3,
        proxy=(proxy := NetworkProxy(owner=None if user is None else user.ids)),
    )
    yield profile, workdir, tool
    asyncio.run(proxy.stop())


def policy_for(setting: str, tool: Path) -> SandboxPolicy:
    return {
        "network_off": SandboxPolicy(network=False),
        "network_allow": SandboxPolicy(network=Network("allow", ("example.test",))),
        "network_host": SandboxPolicy(network=True),
        "read_only": SandboxPolicy(read_only=(tool,)),
        "secrets": SandboxPolicy(secrets={"CENSUS_TOKEN": SECRET}),
    }[setting]


class _Recording(Sandbox):
    """The sandbox a command sink builds, keeping its last result (the sink reports only a tail)."""

    results: list[SandboxResult] = []  # noqa: RUF012 - one list per test run, reset by the test

    async def run(self, cmd: Any, **kw: Any) -> SandboxResult:
        result = await super().run(cmd, **kw)
        _Recording.results.append(result)
        return result


async def probe(kind: str, box: Sandbox, workdir: Path, targets: list[str]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Run the probe as ``kind`` runs its commands; the census and the extra variables that kind sets."""
    line = shlex.join(census.command(targets))
    if kind == "shell":
        shell = Shell(lambda ctx: box)
        ctx = ToolContext(session_id="s", turn_id="t", call_id="c", workdir=workdir)
        out = (await shell.run(shell.Args(command=line, timeout_seconds=60), ctx)).content
        return census.parse(out), BASH
    if kind in ("verification", "progress"):  # the engine runs both through one runner
        run = sandboxed_runner(lambda wd: box)
        result = await run(VerifyCommand(cmd=line, timeout=60), workdir)
        return census.parse(result.output_tail), BASH
    if kind == "mcp":
        group = box.limit_group()
        try:
            argv, env = box.launcher(census.command(targets), group=group)
            done = await asyncio.to_thread(
                subprocess.run, argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60
            )
        finally:
            if group is not None:
                await group.remove()
        return census.parse(done.stdout + done.stderr), ()
    assert kind == "notification"
    _Recording.results = []
    recording = _Recording(**{f: getattr(box, f) for f in box.__dataclass_fields__})
    sink = Command(CommandSink(type="command", name="probe", command=census.command(targets)), lambda wd, p: recording)
    await sink.deliver({"id": 1, "kind": "test", "summary": "census"})
    (result,) = _Recording.results
    extra = ("GOALD_NOTIFICATION", "GOALD_NOTIFICATION_ID", "GOALD_NOTIFICATION_KIND", "GOALD_NOTIFICATION_SUMMARY")
    return census.parse(result.stdout), extra


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("kind", KINDS)
async def test_a_command_holds_exactly_the_census(
    kind: str, setting: str, place: tuple[SandboxProfile, Path, Path]
) -> None:
    profile, workdir, tool = place
    box = profile.sandbox(workdir, policy=policy_for(setting, tool))
    if kind == "mcp" and setting == "network_allow":
        with pytest.raises(SandboxUnavailable, match="allow list"):
            box.launcher(census.command())
        return
    with host_endpoints() as targets:
        seen, extra = await probe(kind, box, workdir, targets)
    assert census.differences(seen, census.expected(box, grouped=True, extra_env=extra)) == []
    if kind != "notification":  # the sink's own directory is gone by now
        assert census.owner(workdir) == census.host_identity(box)
    if os.geteuid() == 0:
        assert census.host_identity(box)[0] != 0, "a root daemon's commands run as the sandbox user"
    if setting == "network_host":
        assert seen["interfaces"] != ["lo"]
    if setting == "network_allow":  # its own namespace; the proxy's socket and variables are in the census
        assert seen["interfaces"] == ["lo"] and "/run/goald/proxy.sock" in seen["mounts"]
        assert {"HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY"} <= set(seen["env"])
    if setting == "secrets":
        assert "CENSUS_TOKEN" in seen["env"]


class _Widened(Sandbox):
    """A sandbox with one mistake more in its bwrap command line: it keeps a capability
    (``CAP_NET_RAW``, added after ``--cap-drop ALL``) and shares the daemon's IPC namespace."""

    def argv(self, cmd: Any, **kw: Any) -> list[str]:
        args = super().argv(cmd, **kw)
        args.remove("--unshare-ipc")
        at = args.index("--cap-drop") + 2
        args[at:at] = ["--cap-add", "CAP_NET_RAW"]
        return args


async def test_the_census_catches_a_capability_and_a_namespace_added(place: tuple[SandboxProfile, Path, Path]) -> None:
    """A test double whose command keeps a capability and shares a namespace: both are named."""
    profile, workdir, _ = place
    plain = profile.sandbox(workdir)
    widened = _Widened(**{f: getattr(plain, f) for f in plain.__dataclass_fields__})
    result = await widened.run(census.command(), timeout=60)
    found = census.differences(census.parse(result.stdout), census.expected(plain, grouped=True))
    net_raw = 1 << 13
    caps = [f for f in found if f.startswith("caps:")]
    assert len(caps) == 1 and all(f"'{k}': {net_raw}" in caps[0] for k in ("CapPrm", "CapEff", "CapBnd")), found
    assert "namespaces not as in the census: ipc daemon's" in found, found
    assert len(found) == 2, found
    # The same probe in the sandbox as it is: nothing to say.
    result = await plain.run(census.command(), timeout=60)
    assert census.differences(census.parse(result.stdout), census.expected(plain, grouped=True)) == []


async def test_the_census_catches_what_is_added(place: tuple[SandboxProfile, Path, Path]) -> None:
    """A test double that adds a descriptor, a mount and a variable: each is named as a difference."""
    profile, workdir, tool = place
    plain = profile.sandbox(workdir)
    added = profile.sandbox(workdir, policy=SandboxPolicy(read_only=(tool,), secrets={"EXTRA": "x"}))
    line = "exec 7</dev/null; exec " + shlex.join(census.command())
    result = await added.run(["bash", "-c", line], timeout=60)
    found = census.differences(census.parse(result.stdout), census.expected(plain, grouped=True))
    assert any(f.startswith("fds:") and "7" in f for f in found), found
    assert any(f.startswith("mounts not in the census") and str(tool) in f for f in found), found
    assert any(f.startswith("env:") and "EXTRA" in f for f in found), found
