"""The sandbox's start-up cost per shell call.

Runs ``true`` N times (default 100) each way and prints the median and p90 wall time per call:
a bare subprocess (the floor), ``Sandbox.none`` (the unconfined path: own process group, scrubbed
environment, output capture), bubblewrap with the network off and on (a daemon-like layout: the
state directory and a work-directory root hidden, the work directory bound inside it) and with an
allow list (the daemon's proxy: a unix socket per call, and the bridge before the command), and the
``shell`` tool end to end through a ``ToolRegistry`` (which adds ``bash -c``). The bubblewrap
rows minus the ``none`` row are the sandbox's own cost. The rows "with limits" run each command in
a cgroup (processes and memory capped, ``agent.limits``): minus the row without, they are the cost
of making, entering, reading and removing the groups per call. "own group" is a command of no goal
(an MCP server's kind); "goal group" a goal's command, in a child of its goal's group, which is
made and removed with the call when no other command of the goal runs ("alone") and only held when
one does ("goal busy": the group is held throughout, as by a parallel call).

Run: ``python benchmarks/bench_sandbox.py [--calls N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from agent import CommandLimits, Sandbox, SandboxUnavailable, Shell, ToolContext, ToolRegistry, detect_bwrap
from agent.limits import limiter
from agent.sandbox import Network, NetworkProxy

#: The row of a sandbox whose network is an allow list: the proxy's socket made and removed, the
#: bridge started before ``true`` (``agent.sandbox.bridge``).
ALLOW = "bwrap, network allow list (proxy socket + bridge)"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def timed(calls: int, once: Callable[[], Awaitable[object]]) -> list[float]:
    await once()  # warm up (page cache, first exec)
    out = []
    for _ in range(calls):
        started = time.perf_counter()
        await once()
        out.append(time.perf_counter() - started)
    return out


async def bare() -> None:
    proc = await asyncio.create_subprocess_exec("true", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    await proc.communicate()


async def run(calls: int) -> None:
    try:
        found = detect_bwrap()
    except SandboxUnavailable as exc:
        print(f"bubblewrap cannot make a sandbox here: {exc}", file=sys.stderr)
        found = None
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        state = Path(tmp) / "state"
        workdir = state / "work" / "goal"
        workdir.mkdir(parents=True)
        (state / "goald.db").write_text("")
        rows: list[tuple[str, list[float]]] = [("bare subprocess", await timed(calls, bare))]
        none = Sandbox.none(workdir)
        rows.append(("Sandbox.none", await timed(calls, lambda: none.run(["true"], timeout=30))))
        if found is not None:
            for network in (False, True):
                box = Sandbox(
                    workdir,
                    hidden=(state, state / "work"),
                    network=network,
                    bwrap=found.path,
                    disable_userns=found.disable_userns,
                )
                label = f"bwrap, network {'on' if network else 'off'}"
                rows.append((label, await timed(calls, lambda box=box: box.run(["true"], timeout=30))))
            proxy = NetworkProxy()
            try:
                allowed = Sandbox(
                    workdir,
                    hidden=(state, state / "work"),
                    proxy=proxy.gate(Network("allow", ("pypi.org",))),
                    bwrap=found.path,
                    disable_userns=found.disable_userns,
                )
                label = ALLOW
                rows.append((label, await timed(calls, lambda: allowed.run(["true"], timeout=30))))
            finally:
                await proxy.stop()
            limited = Sandbox(
                workdir,
                hidden=(state, state / "work"),
                bwrap=found.path,
                disable_userns=found.disable_userns,
                limits=CommandLimits.of(512, 4096),
            )
            mechanism = limiter().mechanism.value
            label = f"bwrap, with limits ({mechanism}, own group)"
            rows.append((label, await timed(calls, lambda: limited.run(["true"], timeout=30))))
            in_goal = dataclasses.replace(limited, limits_group="goal_bench")
            label = f"bwrap, with limits ({mechanism}, goal group, alone)"
            rows.append((label, await timed(calls, lambda: in_goal.run(["true"], timeout=30))))
            held = limiter().hold("goal_bench", limited.limits)
            try:
                label = f"bwrap, with limits ({mechanism}, goal group, goal busy)"
                rows.append((label, await timed(calls, lambda: in_goal.run(["true"], timeout=30))))
            finally:
                await held.release()
            shell_box = Sandbox(
                workdir, hidden=(state, state / "work"), bwrap=found.path, disable_userns=found.disable_userns
            )
            registry = ToolRegistry([Shell(shell_box)])
            ctx = ToolContext(session_id="bench", turn_id="t", call_id="c", workdir=workdir)
            rows.append(
                (
                    "shell tool (bash -c true)",
                    await timed(calls, lambda: registry.call("shell", {"command": "true"}, ctx)),
                )
            )
    print(f"{calls} calls each; wall time per call")
    print(f"{'':56} {'median':>9} {'p90':>9}")
    for label, values in rows:
        print(f"{label:56} {statistics.median(values) * 1000:8.2f}ms {pct(values, 0.9) * 1000:8.2f}ms")
    medians = dict((label, statistics.median(values)) for label, values in rows)
    if "bwrap, network off" in medians:
        cost = (medians["bwrap, network off"] - medians["Sandbox.none"]) * 1000
        print(f"sandbox start-up cost per shell call (median, network off, over Sandbox.none): {cost:.2f}ms")
        for limited_label in (label for label in medians if label.startswith("bwrap, with limits")):
            extra = (medians[limited_label] - medians["bwrap, network off"]) * 1000
            print(f"limits' cost per shell call (median, {limited_label} over network off): {extra:.2f}ms")
    if ALLOW in medians:
        extra = (medians[ALLOW] - medians["bwrap, network off"]) * 1000
        print(f"an allow list's cost per shell call (median, its socket and bridge over network off): {extra:.2f}ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args()
    asyncio.run(run(args.calls))


if __name__ == "__main__":
    main()
