"""Retention: the database levels off while goals keep running, and no retention step holds the writer long.

Waves of goals run on an instant scripted model; each goal runs ``--rounds`` rounds, each round one
tool call whose output is ``--output`` bytes, then completes. After every wave a retention run
(ages of a fraction of a second, so every goal of the wave is old enough; ``--keep-events`` per
session) prunes the ended goals, step by step with bounded ``incremental_vacuum`` steps in between,
followed by a WAL checkpoint (what the daemon's timer does, with a longer age). The next wave's
goals run meanwhile: it starts before the previous wave's retention, so retention steps and goal
writes interleave on the one writer.

Printed: the database size (file + WAL) after each wave (it must level off, not grow with the
waves), the bytes stored per round before pruning and kept per ended goal after, and the longest
time one retention step (a pruning transaction, an ``incremental_vacuum`` step or the checkpoint)
held the writer, with the step count.

Run: ``python benchmarks/bench_retention.py [--goals N] [--rounds N] [--waves N] [--output BYTES]``
(small by default; the issue's soak is ``--goals 100 --rounds 500``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from loguru import logger
from pydantic import BaseModel

from agent import (
    FunctionTool,
    ModelRegistry,
    ModelRequest,
    Reply,
    Runtime,
    ScriptedModel,
    TextBlock,
    ToolContext,
    ToolRegistry,
    retention,
)
from goals import GOAL_CHANGED, Budgets, GoalEngine, GoalSpec, StopRules, tools_for_goal_sessions
from goals.retention import RetentionPolicy, RetentionReport, compact, run_retention


class NoArgs(BaseModel):
    """No arguments."""


def make_rule(rounds: int) -> Any:
    def rule(request: ModelRequest) -> Reply:
        msgs = list(request.messages)
        for i in range(len(msgs) - 1, -1, -1):
            if msgs[i].role != "user":
                continue
            text = "".join(b.text for b in msgs[i].content if isinstance(b, TextBlock))
            found = re.search(r"\bRound (\d+)\b", text)
            if found:
                n, step = int(found.group(1)), sum(1 for m in msgs[i + 1 :] if m.role == "assistant")
                if step == 0:
                    return Reply.call("big")
                if step == 1 and n >= rounds:
                    return Reply.call("goal_complete", summary=f"done in {n} rounds", evidence="outputs")
                return Reply.say(f"round {n} done")
        raise AssertionError("no continuation in the request")

    return rule


async def run_wave(rt: Runtime, engine: GoalEngine, goals: int, wave: int) -> set[str]:
    """Run one wave of goals to their end; the sessions they used."""
    ended: set[str] = set()
    done = asyncio.Event()
    ids: set[str] = set()
    sessions: set[str] = set()

    def on_event(event: Any) -> None:
        if event.type == GOAL_CHANGED and event.data["goalId"] in ids and event.data["status"] != "active":
            ended.add(event.data["goalId"])
            if len(ended) == goals:
                done.set()

    remove = rt.store.hub.add_listener(on_event)
    try:
        for i in range(goals):
            spec = GoalSpec(
                objective=f"Wave {wave} goal {i}: produce the outputs.",
                budgets=Budgets(max_rounds=10_000),
                rules=StopRules(stall_rounds=100_000),
            )
            goal = await engine.create(spec)
            ids.add(goal.id)
            sessions.add(goal.session_id)
        async with asyncio.timeout(3600):
            await done.wait()
    finally:
        remove()
    return sessions


async def bench(args: argparse.Namespace) -> None:
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    model = ScriptedModel(make_rule(args.rounds), name="bench")
    registry = ModelRegistry({model.spec: model}, default=model.spec)
    output: str = "x" * int(args.output)

    async def big(a: NoArgs, ctx: ToolContext) -> str:
        return output

    tool = FunctionTool("big", "a large output", NoArgs, big, repeat_safe=True, output_cap=max(64_000, args.output))

    def tools(row: Any) -> ToolRegistry:
        return ToolRegistry([tool, *tools_for_goal_sessions(row.config)])

    policy = RetentionPolicy(
        history_seconds=1e-6,
        keep_events=args.keep_events,
        workdir_seconds=0,
        batch_rows=args.batch_rows,
        batch_bytes=args.batch_bytes,
        vacuum_pages=args.vacuum_pages,
        goals_per_run=10_000,
    )
    total = RetentionReport()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "goald.db"
        async with Runtime.open(path, models=registry, tools=tools) as rt:
            async with GoalEngine.running(rt, timer_interval=1.0) as engine:
                print(
                    f"{args.waves} waves x {args.goals} goals x {args.rounds} rounds, {args.output} B per tool output;"
                    f" keep {args.keep_events} events, {args.batch_rows} rows per step, {args.vacuum_pages} pages per"
                    " vacuum step"
                )
                print(f"{'wave':>4} {'db+wal MiB':>10} {'stored/round':>13} {'pruned MiB':>10} {'steps':>6}"
                      f" {'longest hold ms':>15} {'wave s':>7}")  # fmt: skip
                pending: asyncio.Task[RetentionReport] | None = None
                for wave in range(1, args.waves + 1):
                    started = time.perf_counter()
                    # The next wave runs while the previous wave's retention steps interleave with it.
                    sessions = await run_wave(rt, engine, args.goals, wave)
                    if pending is not None:
                        _add(total, await pending)
                    stats = await rt.store.read(lambda c: retention.database_stats(c, path, top=100_000))
                    stored = sum(s["eventBytes"] for s in stats["largestSessions"] if s["sessionId"] in sessions)
                    pending = asyncio.create_task(_retain(rt, policy, datetime.now(UTC)))
                    size = retention.file_bytes(path) / 2**20
                    print(
                        f"{wave:>4} {size:>10.2f} {stored / (args.goals * args.rounds):>13,.0f}"
                        f" {total.event_bytes / 2**20:>10.2f} {total.steps:>6}"
                        f" {total.longest_hold_seconds * 1000:>15.2f} {time.perf_counter() - started:>7.1f}"
                    )
                if pending is not None:
                    _add(total, await pending)
                final = await compact(rt.store, policy)
                _add(total, final)
                stats = await rt.store.read(lambda c: retention.database_stats(c, path, top=1))
                n_sessions = max(1, stats["rows"]["sessions"])
                print(
                    f"after compact: {retention.file_bytes(path) / 2**20:.2f} MiB,"
                    f" {stats['rows']['events']} events kept"
                    f" ({stats['rows']['events'] / n_sessions:.0f} per ended goal), {total.goals_pruned} goals pruned,"
                    f" {total.event_bytes / 2**20:.1f} MiB of events pruned"
                )
                kinds = ", ".join(f"{k} {v * 1000:.2f} ms" for k, v in sorted(total.longest_by_kind.items()))
                print(
                    f"retention steps: {total.steps}, longest writer hold {total.longest_hold_seconds * 1000:.2f} ms"
                    f" (longest by kind: {kinds})"
                )


async def _retain(rt: Runtime, policy: RetentionPolicy, now: datetime) -> RetentionReport:
    report = await run_retention(rt.store, policy, now=now)
    with contextlib.suppress(Exception):
        _, held = await rt.store.maintain(retention.checkpoint)
        report.hold(held, "checkpoint")
    return report


def _add(total: RetentionReport, report: RetentionReport) -> None:
    total.goals_pruned += report.goals_pruned
    total.events += report.events
    total.event_bytes += report.event_bytes
    total.pages_freed += report.pages_freed
    total.steps += report.steps
    total.longest_hold_seconds = max(total.longest_hold_seconds, report.longest_hold_seconds)
    for kind, seconds in report.longest_by_kind.items():
        total.longest_by_kind[kind] = max(total.longest_by_kind.get(kind, 0.0), seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--goals", type=int, default=10, help="goals per wave")
    parser.add_argument("--rounds", type=int, default=40, help="rounds per goal")
    parser.add_argument("--waves", type=int, default=8)
    parser.add_argument("--output", type=int, default=16_000, help="bytes of each tool output")
    parser.add_argument("--keep-events", type=int, default=20)
    parser.add_argument("--batch-rows", type=int, default=500)
    parser.add_argument("--batch-bytes", type=int, default=1 << 20)
    parser.add_argument("--vacuum-pages", type=int, default=256)
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
