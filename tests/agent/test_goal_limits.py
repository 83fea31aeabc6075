"""Limits per goal (issue 24): one cgroup per goal holds all its commands, parallel calls included,
and its caps bind them together; at most ``max_parallel_tools`` calls of a step run at once.

With the real bubblewrap and the machine's real cgroups (skipped, saying why, where no cgroup is
writable): 24 parallel memory hogs of one step against a 256 MiB goal cap never hold more than the
cap together (the goal group's peak, read from the kernel) and are killed with the goal's verdict,
in process and through a real daemon and its scripted model; 16 parallel forkers against a 64
process cap start no more than the cap together; groups are removed after. The parallel cap is
shown with a tool double and with real shell calls logging their start and end. The v2 layout
(a goal group with no process of its own, its commands in children) is checked on a stand-in
tree, since this kind of machine has cgroup v1.

Bounded on purpose: each hog holds 100 MiB for 4 s, each forker at most 40 sleepers for 4 s.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness import TEST_MODELS, Daemon, all_events, rpc, wait_goal
from limits_testmodels import FORKS, HELD, HOLD_MEMORY, PARALLEL_HOGS
from pydantic import BaseModel
from sandboxkit import cgroup_bases, needs_cgroups, our_groups, sandbox_in

from agent import (
    EventType,
    FunctionTool,
    Reply,
    Runtime,
    SandboxUnavailable,
    ScriptedModel,
    Shell,
    ToolCall,
    ToolContext,
)
from agent.limits import MIB, CommandLimits, Mechanism, limiter
from agent.limits.cgroup import V2Limiter
from agent.limits.rlimit import RlimitLimiter
from agent.limits.stale import clean_stale

needs_bwrap = pytest.mark.needs_bwrap


class NoArgs(BaseModel):
    """No arguments."""


WAIT = 90.0
GOAL_MEMORY = CommandLimits(max_processes=512, max_memory_bytes=256 * MIB)
GOAL_PROCESSES = CommandLimits(max_processes=64)
MEMORY_VERDICT = "memory limit of the goal (256 MiB, all its commands together) exceeded: the kernel killed 1 process"
#: A hog refused memory by a system call at the cap (bwrap's "Creating new namespace failed: Cannot
#: allocate memory"), with nothing of it killed: rare, more likely the more hogs share the cap.
REFUSED_VERDICT = "memory limit of the goal (256 MiB, all its commands together) reached while this command ran"
PROCESS_VERDICT = "process limit of the goal (64, all its commands together) reached: new processes were refused"


async def run_step(
    open_runtime: Callable[..., Any], calls: list[ToolCall], tools: list[Any], parallel: int
) -> tuple[str, list[dict[str, Any]]]:
    """One session whose first step asks for ``calls`` at once (at most ``parallel`` running); its
    session id and its tool results, in the order they were committed."""
    model = ScriptedModel([Reply(tool_calls=calls), Reply.say("done")])
    async with open_runtime(model, tools=tools) as rt:
        assert isinstance(rt, Runtime)
        sid = await rt.create_session(config={"agent": {"max_parallel_tools": parallel}})
        agent = await rt.agent(sid)
        await agent.followup("go")
        async with asyncio.timeout(WAIT):
            await agent.when_idle()
        events = await rt.store.events_after(sid, 0, types=[EventType.TOOL_RESULT.value])
    model.assert_done()
    return sid, [e.data for e in events]


def goal_shell(workdir: Path, limits: CommandLimits) -> Shell:
    """The shell tool as the daemon builds it for a goal: every call in the session's goal group."""
    return Shell(lambda ctx: sandbox_in(workdir, limits=limits, limits_group=ctx.session_id), default_timeout=60)


def stdout_of(content: str) -> str:
    """What a shell result shows of the command's stdout."""
    if "--- stdout ---\n" not in content:
        return ""
    return content.split("--- stdout ---\n", 1)[1].split("\n--- stderr ---", 1)[0]


# -- the parallel cap --------------------------------------------------------------------------


async def test_at_most_max_parallel_tools_calls_run_at_once_started_in_the_order_asked(open_runtime) -> None:
    running, most, started = 0, 0, []

    async def slow(args: NoArgs, ctx: ToolContext) -> str:
        nonlocal running, most
        started.append(ctx.call_id)
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.05)
        running -= 1
        return f"done {ctx.call_id}"

    calls = [ToolCall("slow", id=f"call_{i}") for i in range(7)]
    _, results = await run_step(open_runtime, calls, [FunctionTool("slow", "a slow tool", NoArgs, slow)], parallel=2)
    assert most == 2
    assert started == [f"call_{i}" for i in range(7)]
    assert sorted(r["content"] for r in results) == sorted(f"done call_{i}" for i in range(7))


@needs_bwrap
async def test_with_a_cap_of_two_no_more_than_two_shell_calls_run_at_once(open_runtime, workdir: Path) -> None:
    log = workdir / "log"
    line = 'echo "start $$" >> log; sleep 0.4; echo "end $$" >> log'
    calls = [ToolCall("shell", {"command": line}) for _ in range(6)]
    shell = Shell(lambda ctx: sandbox_in(workdir), default_timeout=30)
    _, results = await run_step(open_runtime, calls, [shell], parallel=2)
    assert [r["isError"] for r in results] == [False] * 6
    running, most = 0, 0
    for entry in log.read_text().splitlines():
        running += 1 if entry.startswith("start") else -1
        most = max(most, running)
    assert (most, running, len(log.read_text().splitlines())) == (2, 0, 12)


def test_max_parallel_tools_is_a_setting_with_a_default_of_eight() -> None:
    from agent import AgentConfig
    from daemon.settings import ConfigError, load_settings

    assert AgentConfig().max_parallel_tools == 8
    assert load_settings(None).max_parallel_tools == 8
    assert load_settings(None, max_parallel_tools=3).max_parallel_tools == 3
    with pytest.raises(ConfigError, match="max_parallel_tools"):
        load_settings(None, max_parallel_tools=0)


# -- the goal's caps bind its parallel calls together ------------------------------------------


@needs_bwrap
async def test_24_parallel_memory_hogs_of_one_step_hold_no_more_than_the_goal_cap(open_runtime, workdir: Path) -> None:
    needs_cgroups()
    calls = [ToolCall("shell", {"command": HOLD_MEMORY}) for _ in range(PARALLEL_HOGS)]
    # The session id is the goal's key here; holding the group lets the test read its peak after.
    model_sid: list[str] = []

    def box(ctx: ToolContext) -> Any:
        if not model_sid:
            model_sid.append(ctx.session_id)
            held.append(limiter().hold(ctx.session_id, GOAL_MEMORY))
        return sandbox_in(workdir, limits=GOAL_MEMORY, limits_group=ctx.session_id)

    held: list[Any] = []
    _, results = await run_step(open_runtime, calls, [Shell(box, default_timeout=60)], parallel=PARALLEL_HOGS)
    (goal,) = held
    peak = goal.peak_memory()
    await goal.release()
    contents = [r["content"] for r in results]
    kept = [c for c in contents if stdout_of(c) == HELD]
    killed = [c for c in contents if c.startswith(MEMORY_VERDICT)]
    refused = [c for c in contents if c.startswith(REFUSED_VERDICT)]
    assert len(contents) == PARALLEL_HOGS
    assert len(kept) + len(killed) + len(refused) == PARALLEL_HOGS, [c for c in contents if c not in kept + killed]
    assert len(kept) <= 2 and len(killed) + len(refused) >= PARALLEL_HOGS - 2  # three hogs would be 300 MiB
    assert peak is not None and peak <= 256 * MIB
    print(f"24 hogs of 100 MiB: {len(kept)} kept theirs, {len(killed)} killed; goal peak {peak / MIB:.1f} MiB")
    assert our_groups() == [] and limiter().goals() == {}


@needs_bwrap
async def test_parallel_forkers_of_one_step_start_no_more_processes_than_the_goal_cap(
    open_runtime, workdir: Path
) -> None:
    needs_cgroups()
    seen: list[int] = []
    sampling = True

    async def sample() -> None:  # the goal's processes now, from the kernel, while the step runs
        while sampling:
            for goal in limiter().goals().values():
                now = goal.processes()
                if now is not None:
                    seen.append(now)
            await asyncio.sleep(0.02)

    sampler = asyncio.ensure_future(sample())
    try:
        calls = [ToolCall("shell", {"command": FORKS}) for _ in range(16)]
        _, results = await run_step(open_runtime, calls, [goal_shell(workdir, GOAL_PROCESSES)], parallel=16)
    finally:
        sampling = False
        await sampler
    contents = [r["content"] for r in results]
    started = sum(int(stdout_of(c)) for c in contents if stdout_of(c).strip().isdigit())
    # Per command, each could have started its 40: 640. The goal's 64 bind all of them (bwraps and
    # pythons included), and the sleepers of every call overlap.
    assert started <= 64, contents
    assert any(c.startswith(PROCESS_VERDICT) for c in contents), contents
    # A command that starts while the goal is at its cap still enters the goal's group: the kernel
    # refuses forks over pids.max, never a move into the group. Its bwrap is then one process over
    # the cap, and fails at its first fork; how many do depends on the machine's load.
    assert seen and max(seen) <= 64 + len(calls)
    print(f"16 forkers asking for 40 each: {started} started, at most {max(seen)} processes of the goal at once")
    assert our_groups() == [] and limiter().goals() == {}


@needs_bwrap
async def test_commands_of_one_goal_run_in_children_of_one_goal_group(workdir: Path) -> None:
    needs_cgroups()
    line = "cut -d: -f3 /proc/self/cgroup | grep goald- | sort -u"
    goal = sandbox_in(workdir, limits=GOAL_MEMORY, limits_group="goal_01TEST")
    other = sandbox_in(workdir, limits=GOAL_MEMORY, limits_group="goal_02TEST")
    alone = sandbox_in(workdir, limits=GOAL_MEMORY)
    runs = [goal.run(["bash", "-c", line], timeout=30) for _ in range(3)]
    runs += [other.run(["bash", "-c", line], timeout=30), alone.run(["bash", "-c", line], timeout=30)]
    results = await asyncio.gather(*runs)
    assert all(r.ok and r.limit is None for r in results), results
    paths = [{Path(p) for p in r.stdout.split()} for r in results]
    parents = [{p.parent.name for p in ps} for ps in paths]
    mine = f"goald-{os.getpid()}-"
    # The goal's three share one parent (its group: named after it) and each has its own child.
    assert len({frozenset(p) for p in parents[:3]}) == 1
    (goal_group,) = parents[0]
    assert goal_group.startswith(mine) and goal_group.endswith("-goal_01TEST")
    assert len({frozenset(p.name for p in ps) for ps in paths[:3]}) == 3
    (other_group,) = parents[3]
    assert other_group.endswith("-goal_02TEST") and other_group != goal_group
    # A command of no goal: a group of its own, right under the base.
    assert all(p.name.startswith(mine) and not p.parent.name.startswith("goald-") for p in paths[4])
    assert our_groups() == [] and limiter().goals() == {}


@needs_bwrap
async def test_a_daemon_holds_24_parallel_hogs_of_one_goal_to_its_cap_and_removes_its_group(tmp_path: Path) -> None:
    needs_cgroups()
    config: dict[str, Any] = {
        "providers": {**TEST_MODELS["providers"], "lim": {"kind": "scripted", "script": "limits_testmodels:models"}},
        "goal_sandbox": {"hogs": {"max_memory_mb": 256}},
        "max_parallel_tools": PARALLEL_HOGS,  # all 24 at once: the goal's cap alone holds them
    }
    d = Daemon(tmp_path / "state", config=config)
    peaks: dict[str, int] = {}
    try:
        await asyncio.to_thread(d.start)
        assert d.proc is not None
        path, daemon_pid = d.socket_path, d.proc.pid
        goal = await rpc(
            path,
            "goal/create",
            {"objective": "hold memory", "key": "hogs", "model": "lim:hogs", "budgets": {"maxRounds": 1}},
        )
        memory_base = next(b for b in cgroup_bases() if any((b / f).exists() for f in ("memory.max", "memory.stat")))

        def sample() -> None:  # the goal group's peak, from outside, while it exists
            for entry in os.listdir(memory_base):
                if entry.startswith(f"goald-{daemon_pid}-") and entry.endswith(goal["goalId"]):
                    for name in ("memory.max_usage_in_bytes", "memory.peak"):
                        try:
                            peaks[entry] = max(peaks.get(entry, 0), int((memory_base / entry / name).read_text()))
                        except (OSError, ValueError):
                            pass

        async def watch() -> None:
            while True:
                await asyncio.to_thread(sample)
                await asyncio.sleep(0.05)

        watcher = asyncio.ensure_future(watch())
        try:
            await wait_goal(path, goal["goalId"], {"exhausted", "paused", "completed"}, WAIT)
        finally:
            watcher.cancel()
        events = await all_events(path, goal["sessionId"])
        assert await rpc(path, "daemon/health")
        # The goal's group went with its last command (removed before its result was recorded).
        assert our_groups(daemon_pid) == []
        assert await asyncio.to_thread(d.terminate) == 0
    finally:
        d.close()
    contents = [e["data"]["content"] for e in events if e["type"] == "tool/result"]
    assert len(contents) == PARALLEL_HOGS
    kept = [c for c in contents if stdout_of(c) == HELD]
    killed = [c for c in contents if c.startswith(MEMORY_VERDICT)]
    refused = [c for c in contents if c.startswith(REFUSED_VERDICT)]
    assert len(kept) + len(killed) + len(refused) == PARALLEL_HOGS, [c for c in contents if c not in kept + killed]
    assert len(kept) <= 2 and killed
    assert len(peaks) == 1, peaks  # one group for the goal, all 24 calls in it
    (peak,) = peaks.values()
    assert 0 < peak <= 256 * MIB
    print(f"daemon, 24 hogs of 100 MiB: {len(kept)} kept theirs, {len(killed)} killed; goal peak {peak / MIB:.1f} MiB")


# -- the mechanisms ------------------------------------------------------------------------------


def test_v2_goal_group_holds_no_process_and_its_commands_verdicts_name_the_goal(tmp_path: Path) -> None:
    # A stand-in tree: plain files where the kernel would have the interface files.
    lim = V2Limiter(tmp_path)
    limits = CommandLimits(max_processes=64, max_memory_bytes=256 * MIB)
    first = lim.group(limits, goal="goal_01V2")
    second = lim.group(limits, goal="goal_01V2")
    (goal_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert goal_dir.name.startswith(f"goald-{os.getpid()}-") and goal_dir.name.endswith("-goal_01V2")
    assert (goal_dir / "pids.max").read_text() == "64"
    assert (goal_dir / "memory.max").read_text() == str(256 * MIB)
    assert (goal_dir / "cgroup.subtree_control").read_text() == "+pids +memory"
    children = sorted(p for p in goal_dir.iterdir() if p.is_dir())
    assert len(children) == 2 and not any((c / "pids.max").exists() for c in children)
    first.enter(4242)
    second.enter(4343)
    # Processes go into the commands' groups only: never the goal's (v2's no-internal-process rule).
    assert not (goal_dir / "cgroup.procs").exists()
    assert sorted((c / "cgroup.procs").read_text() for c in children) == ["4242", "4343"]
    # The kernel counts a kill in the victim's group, and (since 6.12) a refused fork in the goal's.
    first_dir = next(c for c in children if (c / "cgroup.procs").read_text() == "4242")
    (first_dir / "memory.events").write_text("oom 3\noom_kill 2\n")
    (goal_dir / "pids.events").write_text("max 5\n")
    assert first.verdict() == (
        "process limit of the goal (64, all its commands together) reached: new processes were refused; "
        "memory limit of the goal (256 MiB, all its commands together) exceeded: the kernel killed 2 processes "
        "of this command"
    )
    third = lim.group(limits, goal="goal_01V2")  # made after the refusal: not its verdict
    assert third.verdict() is None
    # The goal's memory cap refused charges while the third ran, nothing of it killed: named only
    # when it failed (a system call of it may have been refused memory), never for one that succeeded.
    (goal_dir / "memory.events").write_text("max 7\noom 1\noom_kill 0\n")
    assert third.verdict() is None
    assert third.verdict(failed=True) == (
        "memory limit of the goal (256 MiB, all its commands together) reached while this command ran: "
        "it may have been refused memory"
    )
    # The goal's caps changed (its policy): the live group takes them.
    fourth = lim.group(CommandLimits(max_processes=128, max_memory_bytes=256 * MIB), goal="goal_01V2")
    assert (goal_dir / "pids.max").read_text() == "128"
    for path in sorted(goal_dir.rglob("*"), reverse=True):  # the stand-in's files, which rmdir would refuse
        if path.is_file():
            path.unlink()
    for group in (first, second, third, fourth):
        asyncio.run(group.remove())
    # The commands' groups, then the goal's with the last of them.
    assert not goal_dir.exists()
    assert lim.goals() == {}


def test_groups_of_a_killed_daemon_goal_groups_with_their_commands_are_removed(tmp_path: Path) -> None:
    needs_cgroups()
    dead = subprocess.Popen(["true"])
    dead.wait()
    made = []
    for base in cgroup_bases():
        goal = base / f"goald-{dead.pid}-7-goal_01STALE"
        goal.mkdir()
        (goal / f"goald-{dead.pid}-8").mkdir()
        alone = base / f"goald-{dead.pid}-9"
        alone.mkdir()
        live = base / f"goald-{os.getpid()}-99999-goal_LIVE"
        live.mkdir()
        made.append((base, goal, alone, live))
    try:
        for base, goal, alone, live in made:
            clean_stale(base)
            assert not goal.exists() and not alone.exists()
            assert live.exists()  # ours: this process runs
    finally:
        for _, goal, alone, live in made:
            for path in (goal / f"goald-{dead.pid}-8", goal, alone, live):
                if path.exists():
                    path.rmdir()


def test_processes_left_in_a_killed_daemon_s_groups_are_killed_before_the_groups_go(tmp_path: Path) -> None:
    needs_cgroups()
    dead = subprocess.Popen(["true"])
    dead.wait()
    # What a daemon killed before bwrap's --die-with-parent was armed leaves: a process in the
    # command's group of a goal, and one in a command's group of no goal.
    orphans = [subprocess.Popen(["sleep", "300"]) for _ in range(2)]
    made = []
    try:
        for base in cgroup_bases():
            goal = base / f"goald-{dead.pid}-7-goal_01ORPHAN"
            command = goal / f"goald-{dead.pid}-8"
            alone = base / f"goald-{dead.pid}-9"
            command.mkdir(parents=True)
            alone.mkdir()
            made.append((base, goal, command, alone))
            (command / "cgroup.procs").write_text(str(orphans[0].pid))
            (alone / "cgroup.procs").write_text(str(orphans[1].pid))
        for base, goal, _, alone in made:
            clean_stale(base)
            assert not goal.exists() and not alone.exists()
        assert [p.wait(timeout=10) for p in orphans] == [-9, -9]
    finally:
        for p in orphans:
            p.kill()
            p.wait()
        for _, goal, command, alone in made:
            for path in (command, goal, alone):
                if path.exists():
                    path.rmdir()


def test_the_rlimit_fallback_keeps_caps_per_command_and_says_so() -> None:
    lim = RlimitLimiter()
    assert lim.mechanism is Mechanism.RLIMIT and lim.per_goal is False
    assert "per command, not per goal" in lim.describe()
    limits = CommandLimits(max_memory_bytes=64 * MIB)
    one, two = lim.group(limits, goal="goal_X"), lim.group(limits, goal="goal_X")
    assert one is not two and "ulimit -v 65536" in one.entry_script()
    assert lim.goals() == {}


# -- how a command enters its group --------------------------------------------------------------


@needs_bwrap
async def test_on_cgroup_v1_the_command_is_in_its_group_from_its_first_process(workdir: Path) -> None:
    needs_cgroups()
    if not limiter().enters_itself:
        pytest.skip("the daemon moves bwrap into its group here (cgroup v2 or rlimits): nothing enters itself")
    box = sandbox_in(workdir, limits=GOAL_MEMORY, limits_group="goal_01FIRST")
    # The command's first process reads where it is: already in the goal's group, in a child of its own.
    result = await box.run(["cat", "/proc/self/cgroup"], timeout=30)
    assert result.ok, result
    memory = [line for line in result.stdout.splitlines() if ":memory:" in line]
    assert memory and memory[0].split("/")[-2].endswith("-goal_01FIRST"), result.stdout
    assert our_groups() == [] and limiter().goals() == {}


@needs_bwrap
async def test_a_command_that_cannot_enter_its_group_never_runs_and_says_why(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    needs_cgroups()
    if not limiter().enters_itself:
        pytest.skip("the daemon moves bwrap into its group here (cgroup v2 or rlimits): nothing enters itself")
    from agent.limits import cgroup

    # A group whose interface file is not there: the shell in front of bwrap cannot write itself in.
    monkeypatch.setattr(cgroup._CgroupGroup, "entry_files", lambda self: [Path("/nonexistent/tasks")])
    box = sandbox_in(workdir, limits=GOAL_MEMORY, limits_group="goal_01REFUSED")
    with pytest.raises(SandboxUnavailable, match=r"cannot put the command into its cgroup: .*nonexistent"):
        await box.run(["touch", "ran"], timeout=30)
    assert not (workdir / "ran").exists()  # nothing of the command ran
    assert our_groups() == [] and limiter().goals() == {}
