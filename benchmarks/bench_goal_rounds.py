"""Goal rounds: idle → next continuation admitted.

One goal on an instant scripted model (a text answer per round) runs N rounds (default 1,000).
For each round it measures the time from the committed ``status: idle`` event to the next
continuation's ``message/admitted`` event, and it counts, with ``set_trace_callback``, the SQL
statements the engine issues from the idle to its committed decision (BEGIN/COMMIT excluded; the
trace stops at the goal's UPDATE) and the bytes those writes carry beyond the continuation's text
(the expanded SQL of each INSERT and UPDATE, an upper bound of the row bytes).

Run: ``python benchmarks/bench_goal_rounds.py [--rounds N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from loguru import logger

from agent import Event, EventType, ModelRegistry, Reply, Runtime, ScriptedModel, ToolRegistry
from goals import Budgets, GoalEngine, GoalSpec, StopRules, tools_for_goal_sessions


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(rounds: int) -> None:
    model = ScriptedModel(lambda request: Reply.say("working on it"), name="instant", record=False)
    registry = ModelRegistry({model.spec: model}, default=model.spec)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "goald.db"
        async with Runtime.open(
            db, models=registry, tools=lambda row: ToolRegistry(tools_for_goal_sessions(row.config))
        ) as rt:
            async with GoalEngine.running(rt) as engine:
                statements: list[str] = []
                counting = False
                idle_at: float | None = None
                latencies: list[float] = []
                per_round_statements: list[int] = []
                per_round_bytes: list[int] = []
                done = asyncio.Event()
                goal_session: list[str] = []

                def trace(sql: str) -> None:
                    # The decision's transaction ends with its UPDATE of the goal row; what follows
                    # (the driver opening the next turn) is not the engine's work.
                    if counting and not (statements and statements[-1].startswith("UPDATE goals")):
                        statements.append(sql)

                await rt.store.trace(trace)

                def on_event(event: Event) -> None:
                    nonlocal counting, idle_at
                    if not goal_session or event.session_id != goal_session[0]:
                        return
                    if event.type == EventType.STATUS and event.data["status"] == "idle":
                        idle_at = time.perf_counter()
                        statements.clear()
                        counting = True
                    elif (
                        event.type == EventType.MESSAGE_ADMITTED
                        and event.data["source"].get("kind") == "goal"
                        and idle_at is not None
                    ):
                        latencies.append(time.perf_counter() - idle_at)
                        idle_at = None

                def on_decision(inp: object, decision: object) -> None:
                    nonlocal counting
                    if not counting:
                        return
                    counting = False
                    real = [s for s in statements if s.split(None, 1)[0].upper() not in ("BEGIN", "COMMIT", "ROLLBACK")]
                    text = getattr(decision, "continuation", None) or ""
                    writes = [s for s in real if s.split(None, 1)[0].upper() in ("INSERT", "UPDATE")]
                    # The continuation's text appears in the inbox INSERT as JSON content.
                    per_round_statements.append(len(real))
                    if len(real) > 6 and "--show" in sys.argv:
                        print("\n".join(s[:100] for s in real), file=sys.stderr)
                    per_round_bytes.append(sum(len(s.encode()) for s in writes) - len(text.encode()))
                    if getattr(decision, "kind", None) != "continue":
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
                total = time.perf_counter() - t0
                await rt.store.trace(None)
    n = len(latencies)
    print(f"{n} rounds in {total:.2f} s ({n / total:.0f} rounds/s), instant scripted model, default durability")
    print(
        f"  idle -> next continuation admitted: median {statistics.median(latencies) * 1e3:.3f} ms, "
        f"p99 {pct(latencies, 0.99) * 1e3:.3f} ms"
    )
    stmts = per_round_statements[:-1] or per_round_statements
    print(
        f"  engine SQL statements per round (BEGIN/COMMIT excluded): median {statistics.median(stmts):.0f}, "
        f"max {max(stmts)}"
    )
    sizes = per_round_bytes[:-1] or per_round_bytes
    print(
        f"  bytes written per round beyond the continuation text (expanded SQL of writes): "
        f"median {statistics.median(sizes):.0f} B, max {max(sizes)} B"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--show", action="store_true", help="print the statements of rounds over 6")
    args = parser.parse_args()
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    asyncio.run(run(args.rounds))


if __name__ == "__main__":
    main()
