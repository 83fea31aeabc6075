"""Harness overhead per model step.

A session whose scripted model answers at once and calls one no-op tool each step runs N steps
(default 1,000) in one turn, at both durability settings. For each it prints the mean, median and
p99 per step, the mean of the first 100 steps beside that of the last 100 (flat means nothing
rewrites history per step), and, measured in the same run on the same kind of file, the cost of
one bare aiosqlite ``INSERT`` + ``COMMIT`` at the same ``synchronous`` level and the ratios.

The floor is measured so that the ratio means something on a shared, noisy machine: every bare
commit is timed on its own after a warm-up, and bare blocks alternate with the step runs (``--runs``
of each), so a burst of load elsewhere lands on both sides. The ratio is given median to median
(the typical step against the typical commit) and mean to mean (checkpoints and stalls included
on both sides).

Run: ``python benchmarks/bench_driver.py [--steps N] [--runs K]``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiosqlite
from loguru import logger
from pydantic import BaseModel

from agent import (
    Durability,
    FunctionTool,
    ModelRegistry,
    ModelRequest,
    Reply,
    Runtime,
    ScriptedModel,
    ToolContext,
    ToolRegistry,
)


class _NoArgs(BaseModel):
    pass


async def _noop(args: _NoArgs, ctx: ToolContext) -> str:
    return "ok"


async def bare_commit_times(path: Path, synchronous: str, n: int = 1000, warm: int = 200) -> list[float]:
    """Seconds of each of ``n`` aiosqlite INSERT + COMMIT pairs, after ``warm`` untimed ones."""
    async with aiosqlite.connect(str(path)) as conn:
        await conn.execute("PRAGMA journal_mode=WAL")
        await conn.execute(f"PRAGMA synchronous={synchronous}")
        await conn.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v TEXT)")
        await conn.commit()
        for _ in range(warm):
            await conn.execute("INSERT INTO t(v) VALUES (?)", ("x" * 100,))
            await conn.commit()
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            await conn.execute("INSERT INTO t(v) VALUES (?)", ("x" * 100,))
            await conn.commit()
            times.append(time.perf_counter() - t0)
        return times


async def run_steps(path: Path, durability: Durability, steps: int) -> list[float]:
    """Per-step durations (seconds) of one turn of ``steps`` tool-calling steps."""
    stamps: list[float] = []

    def rule(request: ModelRequest) -> Reply:
        stamps.append(time.perf_counter())
        if len(stamps) > steps:
            return Reply.say("done")
        return Reply.call("noop")

    model = ScriptedModel(rule, name="bench", record=False)
    registry = ModelRegistry({model.spec: model}, default=model.spec)
    tools = ToolRegistry([FunctionTool("noop", "does nothing", _NoArgs, _noop)])
    async with Runtime.open(
        path,
        durability=durability,
        models=registry,
        tools=lambda row: tools,
    ) as rt:
        sid = await rt.create_session(config={"agent": {"max_steps": steps + 10}})
        agent = await rt.agent(sid)
        await agent.followup("go")
        await agent.when_idle()
    return [b - a for a, b in itertools.pairwise(stamps)][:steps]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3, help="step runs (and bare blocks) per durability")
    args = parser.parse_args()
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    with tempfile.TemporaryDirectory() as tmp:
        modes: tuple[tuple[Durability, str], ...] = (("normal", "NORMAL"), ("full", "FULL"))
        for durability, sync in modes:
            bare_path = Path(tmp) / f"bare-{durability}.db"
            bare = await bare_commit_times(bare_path, sync)
            runs: list[list[float]] = []
            for i in range(args.runs):
                runs.append(await run_steps(Path(tmp) / f"steps-{durability}-{i}.db", durability, args.steps))
                bare += await bare_commit_times(bare_path, sync)
            per_step = [d for run in runs for d in run]
            first = statistics.fmean(d for run in runs for d in run[:100])
            last = statistics.fmean(d for run in runs for d in run[-100:])
            mean, median = statistics.fmean(per_step), statistics.median(per_step)
            bare_mean, bare_median = statistics.fmean(bare), statistics.median(bare)
            print(
                f"durability={durability} (synchronous={sync}), {args.runs} runs of {args.steps} steps,"
                " one no-op tool call each"
            )
            print(
                f"  per step: mean {mean * 1e3:.3f} ms, p50 {median * 1e3:.3f} ms, "
                f"p99 {pct(per_step, 0.99) * 1e3:.3f} ms"
            )
            print(
                f"  first 100 steps mean {first * 1e3:.3f} ms, last 100 steps mean {last * 1e3:.3f} ms "
                f"(last/first {last / first:.2f})"
            )
            print(
                f"  bare aiosqlite INSERT+COMMIT ({len(bare)} timed, warm): mean {bare_mean * 1e3:.3f} ms, "
                f"p50 {bare_median * 1e3:.3f} ms"
            )
            print(f"  step/bare ratio: median {median / bare_median:.2f}, mean {mean / bare_mean:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
