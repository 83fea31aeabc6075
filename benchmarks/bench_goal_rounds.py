"""Goal rounds: idle → next continuation admitted, and what each round costs the database.

One goal on an instant scripted model (a text answer per round) runs N rounds (default 1,000).

Pass 1 (timing, default settings): for each round it measures the time from the committed
``status: idle`` event to the next continuation's ``message/admitted`` event, and it counts, with
``set_trace_callback``, the SQL statements the engine issues from the idle to its committed
decision (BEGIN/COMMIT excluded; the trace stops at the goal's UPDATE) and the bytes those writes
carry beyond the continuation's text (the expanded SQL of each INSERT and UPDATE: an estimate).

Pass 2 (bytes actually written, on a fresh file): WAL auto-checkpointing is switched off on the
store's connection, so the WAL file only grows and its growth is exactly what SQLite wrote: one
frame (a page plus a 24-byte header) per page a transaction changed. It measures the growth
across the engine's decision (from the idle event to the event of the continuation it queued:
nothing else writes in between, since the session is idle and the next turn starts only once
that event is delivered) and across the whole round (idle to idle: the turn, its events, the
idle and the decision). Checkpointing is off only in this pass, so pass 1's timings include the
checkpoints a real daemon pays for.

Run: ``python benchmarks/bench_goal_rounds.py [--rounds N] [--wal-rounds N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from loguru import logger

from agent import Event, EventType, ModelRegistry, Reply, Runtime, ScriptedModel, ToolRegistry
from goals import Budgets, Decision, GoalEngine, GoalSpec, PolicyInput, StopRules, tools_for_goal_sessions

WAL_FRAME_HEADER = 24


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Figures:
    """What one pass measured, per round."""

    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    statements: list[int] = field(default_factory=list)
    sql_bytes: list[int] = field(default_factory=list)
    decision_wal: list[int] = field(default_factory=list)
    round_wal: list[int] = field(default_factory=list)
    text_bytes: list[int] = field(default_factory=list)
    page_size: int = 0


async def run(rounds: int, *, measure_wal: bool) -> Figures:
    model = ScriptedModel(lambda request: Reply.say("working on it"), name="instant", record=False)
    registry = ModelRegistry({model.spec: model}, default=model.spec)
    out = Figures()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "goald.db"
        wal = Path(f"{db}-wal")
        async with Runtime.open(
            db, models=registry, tools=lambda row: ToolRegistry(tools_for_goal_sessions(row.config))
        ) as rt:
            async with GoalEngine.running(rt) as engine:
                if measure_wal:
                    out.page_size = await rt.store.read(lambda conn: conn.execute("PRAGMA page_size").fetchone()[0])
                    await rt.store.read(lambda conn: conn.execute("PRAGMA wal_autocheckpoint=0"))
                statements: list[str] = []
                counting = False
                idle_at: float | None = None
                wal_at_idle: int | None = None
                done = asyncio.Event()
                goal_session: list[str] = []

                def trace(sql: str) -> None:
                    # The decision's transaction ends with its UPDATE of the goal row; what follows
                    # (the driver opening the next turn) is not the engine's work.
                    if counting and not (statements and statements[-1].startswith("UPDATE goals")):
                        statements.append(sql)

                if not measure_wal:
                    await rt.store.trace(trace)

                def on_event(event: Event) -> None:
                    nonlocal counting, idle_at, wal_at_idle
                    if not goal_session or event.session_id != goal_session[0]:
                        return
                    if event.type == EventType.STATUS and event.data["status"] == "idle":
                        idle_at = time.perf_counter()
                        statements.clear()
                        counting = True
                        if measure_wal:
                            size = wal.stat().st_size
                            if wal_at_idle is not None:
                                out.round_wal.append(size - wal_at_idle)
                            wal_at_idle = size
                    elif (
                        measure_wal
                        and event.type == EventType.MESSAGE_QUEUED
                        and event.data["source"].get("kind") == "goal"
                        and wal_at_idle is not None
                    ):
                        # Delivered right after the decision's COMMIT, before anything it wakes runs.
                        out.decision_wal.append(wal.stat().st_size - wal_at_idle)
                    elif (
                        event.type == EventType.MESSAGE_ADMITTED
                        and event.data["source"].get("kind") == "goal"
                        and idle_at is not None
                    ):
                        out.latencies.append(time.perf_counter() - idle_at)
                        idle_at = None

                def on_decision(inp: PolicyInput, decision: Decision) -> None:
                    nonlocal counting
                    if not counting:
                        return
                    counting = False
                    text = decision.continuation or ""
                    out.text_bytes.append(len(text.encode()))
                    if not measure_wal:
                        real = [
                            s for s in statements if s.split(None, 1)[0].upper() not in ("BEGIN", "COMMIT", "ROLLBACK")
                        ]
                        writes = [s for s in real if s.split(None, 1)[0].upper() in ("INSERT", "UPDATE")]
                        out.statements.append(len(real))
                        if len(real) > 6 and "--show" in sys.argv:
                            print("\n".join(s[:100] for s in real), file=sys.stderr)
                        # The continuation's text appears in the inbox INSERT as JSON content.
                        out.sql_bytes.append(sum(len(s.encode()) for s in writes) - len(text.encode()))
                    if decision.kind != "continue":
                        done.set()

                rt.store.hub.add_listener(on_event)
                engine.add_decision_listener(on_decision)
                goal = await engine.create(
                    GoalSpec(
                        objective="Benchmark: keep going.",
                        budgets=Budgets(max_rounds=rounds + 1),
                        rules=StopRules(stall_rounds=10**6),
                    )
                )
                goal_session.append(goal.session_id)
                t0 = time.perf_counter()
                await asyncio.wait_for(done.wait(), timeout=600)
                out.seconds = time.perf_counter() - t0
                if not measure_wal:
                    await rt.store.trace(None)
    return out


def median_max(values: list[int] | list[float]) -> str:
    return f"median {statistics.median(values):.0f}, max {max(values)}"


def report(timing: Figures, bytes_: Figures) -> None:
    n = len(timing.latencies)
    print(f"{n} rounds in {timing.seconds:.2f} s ({n / timing.seconds:.0f} rounds/s), instant scripted model, "
          "default durability")  # fmt: skip
    print(
        f"  idle -> next continuation admitted: median {statistics.median(timing.latencies) * 1e3:.3f} ms, "
        f"p99 {pct(timing.latencies, 0.99) * 1e3:.3f} ms"
    )
    stmts = timing.statements[:-1] or timing.statements
    print(f"  engine SQL statements per round (BEGIN/COMMIT excluded): {median_max(stmts)}")
    sizes = timing.sql_bytes[:-1] or timing.sql_bytes
    print(f"  estimate: bytes the engine's writes carry beyond the continuation text (expanded SQL): "
          f"{median_max(sizes)} B")  # fmt: skip

    frame = bytes_.page_size + WAL_FRAME_HEADER
    decision = bytes_.decision_wal
    rounds = bytes_.round_wal
    text = statistics.median(bytes_.text_bytes[:-1] or bytes_.text_bytes)
    print(f"measured: WAL bytes written ({len(decision)} rounds, a fresh file, auto-checkpoint off, "
          f"page {bytes_.page_size} B, frame {frame} B)")  # fmt: skip
    print(
        f"  the engine's decision (goal row, continuation, its event): {median_max(decision)} B "
        f"= median {statistics.median(decision) / frame:.1f} pages; continuation text {text:.0f} B, "
        f"so {statistics.median(decision) - text:.0f} B beyond it"
    )
    print(
        f"  the whole round (admission, turn, answer, idle, decision): {median_max(rounds)} B "
        f"= median {statistics.median(rounds) / frame:.1f} pages"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--wal-rounds", type=int, default=300, help="rounds of the bytes-written pass")
    parser.add_argument("--show", action="store_true", help="print the statements of rounds over 6")
    args = parser.parse_args()
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    timing = asyncio.run(run(args.rounds, measure_wal=False))
    written = asyncio.run(run(args.wal_rounds, measure_wal=True))
    report(timing, written)


if __name__ == "__main__":
    main()
