"""The sandbox's start-up cost per shell call.

Runs ``true`` N rounds (default 100), each round calling every row once in a new random order (so
the machine's other work weighs on every row alike), and prints the median and p90 wall time per
call: a bare subprocess (the floor), ``Sandbox.none`` (the unconfined path: own process group,
scrubbed environment, output capture), bubblewrap with its seccomp filter, the network off and on
(the layout ``goald serve`` makes: the state directory and the work-directory root hidden, the work
directory bound inside it, and, as root, bwrap run as the sandbox user) and with an allow list (the
daemon's proxy: a unix socket per call, and the bridge before the command), and the ``shell`` tool
end to end through a ``ToolRegistry`` (which adds ``bash -c``). The bubblewrap rows minus the
``none`` row are the sandbox's own cost. The rows "with limits" run each command in a cgroup
(processes and memory capped, ``agent.limits``): minus the row without, they are the cost of
making, entering, reading and removing the groups per call. "own group" is a command of no goal
(an MCP server's kind); "goal group" a goal's command, in a child of its goal's group, which is
made and removed with the call when no other command of the goal runs ("alone") and only held when
one does ("goal busy": the group is held throughout, as by a parallel call). The line "cost per
command, bwrap + seccomp + cgroup" is the "alone" row over ``Sandbox.none``: what a goal's command
pays for the sandbox, to keep under 15 ms. The load average is printed with the figures, and, as
root with cgroup v1's ``cpuacct``, each call's CPU time (every process of it, reparented ones
included), which a loaded machine hardly changes.

The resident memory of the benchmark is printed too: ``--heap-mib N`` grows it first, as a daemon's
heap (starting a command must not cost more the larger the daemon is).

Run: ``python benchmarks/bench_sandbox.py [--calls N] [--heap-mib N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agent import CommandLimits, Sandbox, SandboxUnavailable, Shell, ToolContext, ToolRegistry, detect_bwrap
from agent.limits import limiter
from agent.sandbox import Network, NetworkProxy, sandbox_user
from agent.sandbox.identity import hand_over, prepare_root

#: The row of a sandbox whose network is an allow list: the proxy's socket made and removed, the
#: bridge started before ``true`` (``agent.sandbox.bridge``).
ALLOW = "bwrap, network allow list (proxy socket + bridge)"
#: The rows of a goal's command: bwrap (with its seccomp filter, as every bwrap row) in a cgroup
#: inside the goal's.
GOAL = "bwrap, with limits"
#: What a command may cost over ``Sandbox.none`` (issue 24).
BUDGET_MS = 15.0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def bare() -> None:
    proc = await asyncio.create_subprocess_exec("true", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    await proc.communicate()


class CpuClock:
    """CPU time of this process and of everything it starts, reparented or not: a cgroup v1 ``cpuacct``
    group of the benchmark's own (as root, where that hierarchy is mounted). Unlike wall time it
    hardly moves with the machine's load: what a call costs the machine, not how long it waited."""

    BASE = Path("/sys/fs/cgroup/cpuacct")

    def __init__(self) -> None:
        self.group: Path | None = None
        if os.geteuid() != 0 or not (self.BASE / "cpuacct.usage").exists():
            return
        group = self.BASE / f"goald-bench-{os.getpid()}"
        try:
            group.mkdir()
            (group / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            return
        self.group = group

    def now(self) -> int | None:
        """CPU nanoseconds used so far; ``None`` without the group."""
        return None if self.group is None else int((self.group / "cpuacct.usage").read_text())

    def close(self) -> None:
        if self.group is not None:
            (self.BASE / "cgroup.procs").write_text(str(os.getpid()))
            self.group.rmdir()


async def interleaved(
    calls: int, rows: list[tuple[str, Callable[[], Awaitable[object]]]], cpu: CpuClock
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """``calls`` rounds, each calling every row once in a new random order, so that whatever else the
    machine does at a moment weighs on every row alike (the rows' differences are the point). The
    wall time of each call, and its CPU time where :class:`CpuClock` can tell."""
    for _, once in rows:
        await once()  # warm up (page cache, first exec, the filter compiled)
    times: dict[str, list[float]] = {label: [] for label, _ in rows}
    cpu_times: dict[str, list[float]] = {label: [] for label, _ in rows}
    order = list(rows)
    for _ in range(calls):
        random.shuffle(order)
        for label, once in order:
            used = cpu.now()
            started = time.perf_counter()
            await once()
            times[label].append(time.perf_counter() - started)
            after = cpu.now()
            if used is not None and after is not None:
                cpu_times[label].append((after - used) / 1e9)
    return times, cpu_times


def resident_mib() -> int:
    """This process's resident memory, in MiB."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20


def daemon_layout(tmp: Path) -> tuple[Path, Path, tuple[int, int] | None]:
    """A state directory with a database and a work-directory root under it, a work directory in it,
    and who commands run as: laid out as ``goald serve`` lays them out (as root: the sandbox user,
    the root and the state directory ``0710`` to its group, the work directory its own)."""
    tmp.chmod(0o711)
    state = tmp / "state"
    state.mkdir()
    (state / "goald.db").write_text("")
    user = sandbox_user()
    root = state / "work"
    if user is None:
        root.mkdir()
    else:
        os.chown(state, -1, user.gid)
        state.chmod(0o710)
        prepare_root(root, user)
    workdir = root / "goal"
    workdir.mkdir(mode=0o700)
    hand_over(workdir, user)
    return state, workdir, None if user is None else user.ids


async def run(calls: int) -> None:
    try:
        found = detect_bwrap()
    except SandboxUnavailable as exc:
        print(f"bubblewrap cannot make a sandbox here: {exc}", file=sys.stderr)
        found = None
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        state, workdir, run_as = daemon_layout(Path(tmp))
        none = Sandbox.none(workdir)
        rows: list[tuple[str, Callable[[], Awaitable[object]]]] = [
            ("bare subprocess", bare),
            ("Sandbox.none", lambda: none.run(["true"], timeout=30)),
        ]
        proxy = NetworkProxy(owner=run_as)
        held = None
        if found is not None:
            common: dict[str, Any] = {
                "hidden": (state, state / "work"),
                "bwrap": found.path,
                "disable_userns": found.disable_userns,
                "run_as": run_as,
            }
            for network in (False, True):
                box = Sandbox(workdir, network=network, **common)
                label = f"bwrap, network {'on' if network else 'off'}"
                rows.append((label, lambda box=box: box.run(["true"], timeout=30)))
            allowed = Sandbox(workdir, proxy=proxy.gate(Network("allow", ("pypi.org",))), **common)
            rows.append((ALLOW, lambda: allowed.run(["true"], timeout=30)))
            limited = Sandbox(workdir, limits=CommandLimits.of(512, 4096), **common)
            mechanism = limiter().mechanism.value
            rows.append((f"bwrap, with limits ({mechanism}, own group)", lambda: limited.run(["true"], timeout=30)))
            in_goal = dataclasses.replace(limited, limits_group="goal_bench")
            rows.append((f"{GOAL} ({mechanism}, goal group, alone)", lambda: in_goal.run(["true"], timeout=30)))
            held = limiter().hold("goal_bench_busy", limited.limits)
            busy = dataclasses.replace(limited, limits_group="goal_bench_busy")
            rows.append((f"{GOAL} ({mechanism}, goal group, goal busy)", lambda: busy.run(["true"], timeout=30)))
            registry = ToolRegistry([Shell(Sandbox(workdir, **common))])
            ctx = ToolContext(session_id="bench", turn_id="t", call_id="c", workdir=workdir)
            rows.append(("shell tool (bash -c true)", lambda: registry.call("shell", {"command": "true"}, ctx)))
        cpu = CpuClock()
        try:
            times, cpu_times = await interleaved(calls, rows, cpu)
        finally:
            cpu.close()
            if held is not None:
                await held.release()
            await proxy.stop()
    loads.append(os.getloadavg()[0])
    who = "as the sandbox user" if run_as is not None else "as this user"
    print(
        f"{calls} rounds, every row once a round in random order; wall time per call; bwrap {who}; "
        f"{resident_mib()} MiB resident"
    )
    print(f"{'':56} {'median':>9} {'p90':>9} {'CPU':>9}")
    for label, values in times.items():
        used = f"{statistics.median(cpu_times[label]) * 1000:8.2f}ms" if cpu_times[label] else f"{'-':>10}"
        print(f"{label:56} {statistics.median(values) * 1000:8.2f}ms {pct(values, 0.9) * 1000:8.2f}ms {used}")
    medians = {label: statistics.median(values) for label, values in times.items()}
    print(f"load average (1 min) before and after: {loads[0]:.2f}, {loads[1]:.2f}")
    if "bwrap, network off" not in medians:
        return
    floor = medians["Sandbox.none"]
    cost = (medians["bwrap, network off"] - floor) * 1000
    print(f"sandbox start-up cost per shell call (median, network off, over Sandbox.none): {cost:.2f}ms")
    for label in (label for label in medians if label.startswith(GOAL)):
        extra = (medians[label] - medians["bwrap, network off"]) * 1000
        print(f"limits' cost per shell call (median, {label} over network off): {extra:.2f}ms")
    alone = next(label for label in medians if label.endswith("goal group, alone)"))
    print(
        "cost per command, bwrap + seccomp + cgroup (median, a goal's command alone over Sandbox.none): "
        f"{(medians[alone] - floor) * 1000:.2f}ms (budget {BUDGET_MS:g}ms)"
    )
    if cpu_times[alone] and cpu_times["Sandbox.none"]:
        extra = (statistics.median(cpu_times[alone]) - statistics.median(cpu_times["Sandbox.none"])) * 1000
        print(f"the same in CPU time (every process of the call, whatever the load): {extra:.2f}ms")
    if ALLOW in medians:
        extra = (medians[ALLOW] - medians["bwrap, network off"]) * 1000
        print(f"an allow list's cost per shell call (median, its socket and bridge over network off): {extra:.2f}ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100, help="rounds (each calls every row once)")
    parser.add_argument(
        "--heap-mib", type=int, default=0, help="grow this process by N MiB first, as a daemon's memory (default 0)"
    )
    args = parser.parse_args()
    heap = bytearray(args.heap_mib << 20)
    for at in range(0, len(heap), 4096):  # touched: resident, as a daemon's heap is
        heap[at] = 1
    asyncio.run(run(args.calls))


if __name__ == "__main__":
    main()
