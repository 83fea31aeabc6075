"""A fleet: many active goals in one daemon host.

N goals (default 1,000) on an instant scripted model each run R rounds (default 10) in one
in-process daemon host (the same ``Host`` that ``goald serve`` runs, with its concurrency limit,
goal engine, scheduler and control socket). Prints rounds per second, the event loop's lag
(p50/p99 of how late a 10 ms ticker wakes up) and the process's peak RSS.

Run: ``python benchmarks/bench_fleet.py [--goals N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from loguru import logger

from agent import EventType, ModelRequest, Reply, ScriptedModel
from daemon.host import Host
from daemon.settings import load_settings
from goals import Budgets, GoalSpec, StopRules


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def ticker(lags: list[float], stop: asyncio.Event, period: float = 0.01) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        t0 = loop.time()
        await asyncio.sleep(period)
        lags.append(loop.time() - t0 - period)


async def run(goals: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        settings = load_settings(None, state_dir=Path(tmp), log_level="WARNING")
        host = Host(settings)

        def rule(request: ModelRequest) -> Reply:
            return Reply.say("working")

        host.models.add(ScriptedModel(rule, name="fleet", record=False), "scripted:fleet")
        server = asyncio.get_running_loop().create_task(host.run())
        await asyncio.wait_for(host.ready.wait(), 60)
        assert host.rt is not None and host.engine is not None
        rt, engine = host.rt, host.engine
        finished = 0
        all_done = asyncio.Event()
        admitted = 0

        def on_event(event: object) -> None:
            nonlocal finished, admitted
            etype = getattr(event, "type", "")
            data = getattr(event, "data", {})
            if etype == EventType.MESSAGE_ADMITTED and data.get("source", {}).get("kind") == "goal":
                admitted += 1
            if etype == "goal/changed" and data.get("status") != "active":
                finished += 1
                if finished >= goals:
                    all_done.set()

        rt.store.hub.add_listener(on_event)
        lags: list[float] = []
        stop = asyncio.Event()
        tick = asyncio.get_running_loop().create_task(ticker(lags, stop))
        t0 = time.perf_counter()
        for _ in range(goals):
            await engine.create(
                GoalSpec(
                    objective="Fleet benchmark goal.",
                    model="scripted:fleet",
                    budgets=Budgets(max_rounds=rounds),
                    rules=StopRules(stall_rounds=10**6),
                )
            )
        created = time.perf_counter() - t0
        await asyncio.wait_for(all_done.wait(), 3600)
        total = time.perf_counter() - t0
        stop.set()
        await tick
        counts = await host.goal_counts()
        host.request_stop()
        await server
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"{goals} goals x {rounds} rounds on an instant scripted model, one daemon host "
        f"(max {settings.max_concurrent_turns} turns at once)"
    )
    print(
        f"  created all goals in {created:.2f} s; all ended after {total:.2f} s; goal statuses: "
        + ", ".join(f"{k} {v}" for k, v in counts.items() if v)
    )
    print(f"  continuations admitted: {admitted}; {admitted / total:.0f} rounds/s")
    print(
        f"  event-loop lag (10 ms ticker): p50 {statistics.median(lags) * 1e3:.1f} ms, "
        f"p99 {pct(lags, 0.99) * 1e3:.1f} ms, max {max(lags) * 1e3:.1f} ms over {len(lags)} ticks"
    )
    print(f"  peak RSS: {peak_mb:.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--goals", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    asyncio.run(run(args.goals, args.rounds))


if __name__ == "__main__":
    main()
