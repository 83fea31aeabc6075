"""Long goals under context compaction and retention: compactions, prompt-cache prefix, database size.

Goals run on the shipped scripted model with a small context window (tokens = measured prompt bytes
/ 4, the model's rule). Each round the agent calls ``dump``, whose output is ``--output`` bytes (a
build log), then says the round is done; at its last round it claims completion. Goals run
``--concurrent`` at a time, in waves; after each wave a retention run (ages of a fraction of a
second, so every ended goal of the wave is old enough) prunes the ended goals, with bounded
``incremental_vacuum`` steps, as the daemon's timer does with longer ages.

Printed after each wave: the database size (file + WAL; it must level off), bytes stored per round,
compactions so far. At the end:

* compactions per 200 rounds;
* the share of input bytes (= tokens by the rule) that repeat the previous request's prefix in the
  same session (what a provider's prompt cache can bill as cached: the system prompt, the tools and
  the leading messages, compared whole), over all requests, summaries included (target ≥ 90%);
* the longest time one compaction's transaction and one retention step held the writer.

Run: ``python benchmarks/bench_context.py`` (small); ``--full`` is the issue's soak
(100 goals x 500 rounds); ``--goals/--rounds/--concurrent/--window/--output`` set the shape.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from loguru import logger
from pydantic import BaseModel

import agent.compaction as compaction
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
    ToolResultBlock,
    retention,
)
from agent.store import Store
from goals import GOAL_CHANGED, Budgets, GoalEngine, GoalSpec, StopRules, tools_for_goal_sessions
from goals.retention import RetentionPolicy, RetentionReport, run_retention

_ROUND = re.compile(r"\bRound (\d+)\b")
_TAG = re.compile(r"\bbench goal (\d+)\b")


class DumpArgs(BaseModel):
    """Arguments of ``dump``."""

    round: int


def _texts(request: ModelRequest) -> list[str]:
    out = []
    for m in request.messages:
        for b in m.content:
            out.append(b.text if isinstance(b, TextBlock) else b.content if isinstance(b, ToolResultBlock) else "")
    return out


class Prefixes:
    """Per goal, how much of each request repeats the previous request's prefix (parts compared whole)."""

    def __init__(self) -> None:
        self.previous: dict[str, list[bytes]] = {}
        self.total = 0
        self.repeated = 0
        self.requests = 0

    def see(self, tag: str, request: ModelRequest) -> None:
        parts = [
            (request.system or "").encode(),
            json.dumps([t.__dict__ if hasattr(t, "__dict__") else str(t) for t in request.tools], default=str).encode(),
            *(json.dumps(m.model_dump(mode="json"), sort_keys=True).encode() for m in request.messages),
        ]
        before = self.previous.get(tag, [])
        same = 0
        for a, b in zip(before, parts, strict=False):
            if a != b:
                break
            same += len(a)
        self.total += sum(len(p) for p in parts)
        self.repeated += same
        self.requests += 1
        self.previous[tag] = parts


def make_rule(rounds: int, prefixes: Prefixes) -> Callable[[ModelRequest], Reply]:
    def rule(request: ModelRequest) -> Reply:
        texts = _texts(request)
        tag = next((m.group(1) for t in texts if (m := _TAG.search(t))), "?")
        prefixes.see(tag, request)
        if request.purpose == "summary":
            return Reply.say(f"Earlier (bench goal {tag}): {len(request.messages) - 1} messages of reports, all fine.")
        msgs = list(request.messages)
        for i in range(len(msgs) - 1, -1, -1):
            if msgs[i].role != "user":
                continue
            found = _ROUND.search("".join(b.text for b in msgs[i].content if isinstance(b, TextBlock)))
            if found:
                n, step = int(found.group(1)), sum(1 for m in msgs[i + 1 :] if m.role == "assistant")
                if step == 0:
                    if n >= rounds:
                        return Reply.call("goal_complete", summary=f"done in {n} rounds", evidence="reports")
                    return Reply.call("dump", round=n)
                return Reply.say(f"round {n} done")
        raise AssertionError("no continuation in the request")

    return rule


class Holds:
    """The longest time one compaction's transaction held the writer (timed on the store thread)."""

    def __init__(self, store: Store) -> None:
        self.longest = 0.0
        self.count = 0
        self._flag = threading.local()
        original_commit = compaction.commit
        run_tx = store._run_tx

        def commit(agent: Any, tx: Any, **kw: Any) -> None:
            self._flag.on = True
            original_commit(agent, tx, **kw)

        def timed(fn: Any) -> Any:
            self._flag.on = False
            started = time.perf_counter()
            try:
                return run_tx(fn)
            finally:
                if getattr(self._flag, "on", False):
                    self.count += 1
                    self.longest = max(self.longest, time.perf_counter() - started)

        compaction.commit = commit  # type: ignore[assignment]
        store._run_tx = timed  # type: ignore[method-assign]


async def run_wave(rt: Runtime, engine: GoalEngine, first: int, count: int, rounds: int, workdir: Path) -> None:
    ids: set[str] = set()
    ended: set[str] = set()
    done = asyncio.Event()

    def on_event(event: Any) -> None:
        if event.type == GOAL_CHANGED and event.data["goalId"] in ids and event.data["status"] != "active":
            ended.add(event.data["goalId"])
            if len(ended) == count:
                done.set()

    remove = rt.store.hub.add_listener(on_event)
    try:
        for i in range(first, first + count):
            # One goal at a time works in a directory (the engine refuses a second): one each.
            own = workdir / f"goal-{i}"
            own.mkdir(exist_ok=True)
            goal = await engine.create(
                GoalSpec(
                    objective=f"This is bench goal {i}: run the report every round, {rounds} rounds.",
                    workdir=str(own),
                    budgets=Budgets(max_rounds=rounds + 10),
                    rules=StopRules(stall_rounds=100_000, max_model_errors=5, error_backoff_seconds=0.01),
                )
            )
            ids.add(goal.id)
        async with asyncio.timeout(24 * 3600):
            await done.wait()
    finally:
        remove()


async def bench(args: argparse.Namespace) -> None:
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    prefixes = Prefixes()
    model = ScriptedModel(
        make_rule(args.rounds, prefixes), name="bench", max_tokens=256, context_window=args.window, record=False
    )
    registry = ModelRegistry({model.spec: model}, default=model.spec)
    line = "report line: " + "x" * 60 + "\n"

    async def dump(a: DumpArgs, ctx: ToolContext) -> str:
        return (f"round {a.round} " + line * (args.output // len(line) + 1))[: args.output]

    tool = FunctionTool("dump", "prints a long report", DumpArgs, dump, repeat_safe=True, output_cap=args.output + 64)

    def tools(row: Any) -> ToolRegistry:
        return ToolRegistry([tool, *tools_for_goal_sessions(row.config)])

    policy = RetentionPolicy(history_seconds=1e-6, keep_events=args.keep_events, workdir_seconds=0)
    total_retention = RetentionReport()
    waves = -(-args.goals // args.concurrent)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "goald.db"
        workdir = Path(tmp) / "work"
        workdir.mkdir()
        async with Runtime.open(path, models=registry, tools=tools) as rt:
            holds = Holds(rt.store)
            async with GoalEngine.running(rt, timer_interval=1.0) as engine:
                print(
                    f"{args.goals} goals x {args.rounds} rounds ({args.concurrent} at a time), window {args.window}"
                    f" tokens (bytes/4), {args.output} B per tool output, retention keeps {args.keep_events} events"
                )
                print(f"{'wave':>4} {'db+wal MiB':>10} {'bytes/round':>12} {'compactions':>11} {'s':>7}")
                for wave in range(waves):
                    first = wave * args.concurrent
                    count = min(args.concurrent, args.goals - first)
                    size0 = retention.file_bytes(path)
                    await run_wave(rt, engine, first, count, args.rounds, workdir)
                    grown = retention.file_bytes(path) - size0
                    report = await run_retention(rt.store, policy, now=datetime.now(UTC))
                    _, held = await rt.store.maintain(retention.checkpoint)
                    report.hold(held, "checkpoint")
                    total_retention.longest_hold_seconds = max(
                        total_retention.longest_hold_seconds, report.longest_hold_seconds
                    )
                    total_retention.steps += report.steps
                    print(
                        f"{wave + 1:>4} {retention.file_bytes(path) / 2**20:>10.2f}"
                        f" {max(grown, 0) / (count * args.rounds):>12,.0f} {holds.count:>11}"
                        f" {time.perf_counter() - started:>7.1f}"
                    )
    rounds = args.goals * args.rounds
    print(f"compactions: {holds.count} in {rounds} rounds = {holds.count * 200 / rounds:.1f} per 200 rounds")
    print(
        f"prefix repeated from the previous request: {prefixes.repeated / max(prefixes.total, 1):.1%} of"
        f" {prefixes.total / 4 / 1e6:.2f} M input tokens ({prefixes.requests} requests)"
    )
    print(
        f"longest writer hold: one compaction {holds.longest * 1000:.2f} ms;"
        f" one retention step {total_retention.longest_hold_seconds * 1000:.2f} ms ({total_retention.steps} steps)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--goals", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--concurrent", type=int, default=2, help="goals running at once (one wave)")
    parser.add_argument("--window", type=int, default=4000, help="context window, tokens (bytes / 4)")
    parser.add_argument("--output", type=int, default=2500, help="bytes of each tool output")
    parser.add_argument("--keep-events", type=int, default=20)
    parser.add_argument("--full", action="store_true", help="the issue's soak: 100 goals x 500 rounds, 10 at a time")
    args = parser.parse_args()
    if args.full:
        args.goals, args.rounds, args.concurrent = 100, 500, 10
    asyncio.run(bench(args))


if __name__ == "__main__":
    main()
