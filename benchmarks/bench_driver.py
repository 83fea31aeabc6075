"""Harness overhead per model step.

A session whose scripted model answers at once and calls one no-op tool each step runs N steps
(default 1,000) in one turn, at both durability settings. For each it prints the mean and p99 per
step, the mean of the first 100 steps beside that of the last 100 (flat means nothing rewrites
history per step), and, measured in the same run on the same kind of file, the cost of one bare
aiosqlite ``INSERT`` + ``COMMIT`` at the same ``synchronous`` level and the ratio.

Run: ``python benchmarks/bench_driver.py [--steps N]``.
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


async def bare_commit_cost(path: Path, synchronous: str, n: int = 2000) -> float:
    """Mean seconds of one aiosqlite INSERT + COMMIT."""
    async with aiosqlite.connect(str(path)) as conn:
        await conn.execute("PRAGMA journal_mode=WAL")
        await conn.execute(f"PRAGMA synchronous={synchronous}")
        await conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
        await conn.commit()
        for _ in range(50):
            await conn.execute("INSERT INTO t(v) VALUES (?)", ("x" * 100,))
            await conn.commit()
        t0 = time.perf_counter()
        for _ in range(n):
            await conn.execute("INSERT INTO t(v) VALUES (?)", ("x" * 100,))
            await conn.commit()
        return (time.perf_counter() - t0) / n


async def run_steps(path: Path, durability: str, steps: int) -> list[float]:
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
        tools=lambda row: tools,  # type: ignore[arg-type]
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
    args = parser.parse_args()
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    with tempfile.TemporaryDirectory() as tmp:
        for durability, sync in (("normal", "NORMAL"), ("full", "FULL")):
            per_step = await run_steps(Path(tmp) / f"steps-{durability}.db", durability, args.steps)
            bare = await bare_commit_cost(Path(tmp) / f"bare-{durability}.db", sync)
            mean = statistics.fmean(per_step)
            first = statistics.fmean(per_step[:100])
            last = statistics.fmean(per_step[-100:])
            print(f"durability={durability} (synchronous={sync}), {len(per_step)} steps, one no-op tool call each")
            print(
                f"  per step: mean {mean * 1e3:.3f} ms, p50 {pct(per_step, 0.5) * 1e3:.3f} ms, "
                f"p99 {pct(per_step, 0.99) * 1e3:.3f} ms"
            )
            print(
                f"  first 100 steps mean {first * 1e3:.3f} ms, last 100 steps mean {last * 1e3:.3f} ms "
                f"(last/first {last / first:.2f})"
            )
            print(f"  bare aiosqlite INSERT+COMMIT: {bare * 1e3:.3f} ms; step/bare ratio {mean / bare:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
