"""Limits of sandboxed commands, with the real bubblewrap and the machine's real cgroups: a fork bomb
and a memory hog end with a clear tool error, the command's cgroup is removed afterwards, and a daemon
running them keeps serving its other goals and ``daemon/health`` (there the caps are the goal's, for
all its commands together: ``test_goal_limits.py`` shows them binding parallel calls).

Bounded on purpose: the bomb starts at most 400 processes that each exit within 30 s, and its shell
call times out after a few seconds; the hog asks for at most 400 MB.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest
from harness import TEST_MODELS, Daemon, all_events, rpc, wait_goal
from sandbox_testmodels import FORK_BOMB, MEMORY_HOG
from sandboxkit import needs_cgroups, our_groups, sandbox_in

from agent import Sandbox, SandboxPolicy, Shell, ToolContext
from agent.limits import MIB, CommandLimits
from daemon.client import Connection as Client
from daemon.settings import ConfigError, load_settings

needs_bwrap = pytest.mark.needs_bwrap
LIMIT = 90.0


def boxed(workdir: Path, limits: CommandLimits) -> Sandbox:
    return sandbox_in(workdir, limits=limits)


def ctx(workdir: Path) -> ToolContext:
    return ToolContext(session_id="s", turn_id="t", call_id="c", workdir=workdir)


def processes_named(marker: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if fh.read().startswith(marker.encode()):
                        pids.append(int(entry))
            except OSError:
                pass
    return pids


def test_limits_below_their_minimum_are_refused_with_the_key_named() -> None:
    with pytest.raises(ValueError, match="max_processes must be at least 8"):
        CommandLimits(max_processes=2)
    with pytest.raises(ValueError, match="at least 16 MiB"):
        CommandLimits.of(max_memory_mb=1)
    with pytest.raises(ValueError, match="max_processes"):
        SandboxPolicy(max_processes=3)
    with pytest.raises(ConfigError, match=r"goal_sandbox\.g\.max_memory_mb"):
        load_settings(None, goal_sandbox={"g": {"max_memory_mb": 4}})
    with pytest.raises(ConfigError, match=r"sandbox_max_processes.*must be 0 \(no cap\) or at least 8"):
        load_settings(None, sandbox_max_processes=3)
    # 0 is no cap: daemon-wide, or for one goal over a daemon-wide cap.
    assert not CommandLimits.of(0, 0).active
    assert SandboxPolicy(max_processes=0).limits(CommandLimits(64, 64 * MIB)) == CommandLimits(None, 64 * MIB)
    uncapped = load_settings(None, sandbox_max_memory_mb=0, goal_sandbox={"g": {"max_processes": 0}})
    assert (uncapped.sandbox_max_memory_mb, uncapped.goal_sandbox["g"].max_processes) == (0, 0)
    assert CommandLimits.of(64, 256) == CommandLimits(64, 256 * MIB)
    assert CommandLimits.of(64, 256).memory_text() == "256 MiB"


@needs_bwrap
async def test_a_fork_bomb_through_the_shell_tool_ends_with_the_process_limit(tmp_path: Path) -> None:
    needs_cgroups()
    shell = Shell(boxed(tmp_path, CommandLimits(max_processes=32)), default_timeout=4)
    started = time.monotonic()
    out = await shell.run(shell.Args(command=FORK_BOMB), ctx(tmp_path))
    assert out.is_error
    first = out.content.splitlines()[0]
    assert first.startswith("process limit (32) reached: new processes were refused; "), out.content
    assert time.monotonic() - started < 30
    # The command's processes are gone with it, and so is its cgroup.
    assert processes_named("goald-bomb") == []
    assert our_groups() == []


@needs_bwrap
async def test_a_memory_hog_through_the_shell_tool_ends_with_the_memory_limit(tmp_path: Path) -> None:
    needs_cgroups()
    shell = Shell(boxed(tmp_path, CommandLimits.of(max_memory_mb=64)), default_timeout=60)
    out = await shell.run(shell.Args(command=MEMORY_HOG), ctx(tmp_path))
    assert out.is_error
    assert out.content.splitlines()[0].startswith(
        "memory limit (64 MiB) exceeded: the kernel killed 1 process of the command; exit code: 137"
    ), out.content
    assert our_groups() == []
    # Under the cap, the same kind of command runs as ever.
    fine = await shell.run(shell.Args(command="x=$(head -c 1000000 /dev/zero | tr '\\0' x); echo ${#x}"), ctx(tmp_path))
    assert (fine.is_error, fine.content) == (False, "exit code: 0\n--- stdout ---\n1000000")
    assert our_groups() == []


@needs_bwrap
async def test_commands_with_limits_run_side_by_side_each_in_its_own_group(tmp_path: Path) -> None:
    needs_cgroups()
    box = boxed(tmp_path, CommandLimits(max_processes=16, max_memory_bytes=64 * MIB))
    line = "cat /proc/self/cgroup | grep -E ':(pids|memory):' | cut -d: -f3 | sort -u"
    results = await asyncio.gather(*(box.run(["bash", "-c", line], timeout=30) for _ in range(4)))
    groups = [r.stdout.split() for r in results]
    assert all(r.ok and r.limit is None for r in results)
    names = {os.path.basename(g) for gs in groups for g in gs}
    assert len(names) == 4 and all(n.startswith(f"goald-{os.getpid()}-") for n in names)
    assert our_groups() == []


@needs_bwrap
async def test_a_daemon_running_a_fork_bomb_and_a_memory_hog_keeps_serving_another_goal(tmp_path: Path) -> None:
    needs_cgroups()
    config: dict[str, Any] = {
        "providers": {
            **TEST_MODELS["providers"],
            "sbx": {"kind": "scripted", "script": "sandbox_testmodels:models"},
        },
        "goal_sandbox": {"bomber": {"max_processes": 32, "max_memory_mb": 64}},
    }
    d = Daemon(tmp_path / "state", config=config)
    try:
        await asyncio.to_thread(d.start)
        path = d.socket_path
        steady = await rpc(path, "goal/create", {"objective": "[rounds=40 delay=0.05]", "model": "test:worker"})
        bomber = await rpc(
            path,
            "goal/create",
            {"objective": "exercise the limits", "key": "bomber", "model": "sbx:bomber", "budgets": {"maxRounds": 1}},
        )
        async with await Client.connect(path) as client:
            await client.call("session/subscribe", {"sessionId": bomber["sessionId"], "afterSeq": 0})
            async with asyncio.timeout(LIMIT):
                while True:  # the assistant message that asks for the bomb is committed before it runs
                    note = await client.next_notification()
                    event = note["params"].get("event", {}) if note.get("method") == "session.event" else {}
                    if event.get("type") == "assistant/message":
                        break
            # While the bomb runs: the daemon answers at once, and the other goal moves on.
            before = (await rpc(path, "goal/get", {"goalId": steady["goalId"]}))["rounds"]
            asked = time.monotonic()
            async with asyncio.timeout(5):
                health = await rpc(path, "daemon/health")
            assert health and time.monotonic() - asked < 5
            async with asyncio.timeout(LIMIT):
                while (await wait_round(path, steady["goalId"]))["rounds"] <= before:
                    pass
        await wait_goal(path, bomber["goalId"], {"exhausted", "paused", "completed"}, LIMIT)
        done = await wait_goal(path, steady["goalId"], {"completed"}, LIMIT)
        events = await all_events(path, bomber["sessionId"])
        assert await rpc(path, "daemon/health")
        assert await asyncio.to_thread(d.terminate) == 0
    finally:
        d.close()
    results = [e["data"]["content"] for e in events if e["type"] == "tool/result"]
    assert len(results) == 2, results
    assert results[0].startswith(
        "process limit of the goal (32, all its commands together) reached: new processes were refused; "
    ), results[0]
    assert results[1].startswith(
        "memory limit of the goal (64 MiB, all its commands together) exceeded: the kernel killed 1 process"
    ), results[1]
    assert done["rounds"] == 40
    assert processes_named("goald-bomb") == []


async def wait_round(path: Path, goal_id: str) -> dict[str, Any]:
    """The goal after its next ``goal/changed`` or round event (or at once, if it is no longer active)."""
    async with await Client.connect(path) as client:
        goal = await client.call("goal/get", {"goalId": goal_id})
        if goal["status"] != "active":
            return dict(goal)
        await client.call("session/subscribe", {"sessionId": goal["sessionId"], "afterSeq": 0})
        while True:
            note = await client.next_notification()
            if note.get("method") == "session.status":
                return dict(await client.call("goal/get", {"goalId": goal_id}))
