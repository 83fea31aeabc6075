"""Notifications: latency from the committing change to the webhook's receipt, and what the outbox costs a goal.

Part 1 (latency): a real store on a temporary file, the real sender, a webhook sink posting to a local
HTTP server on 127.0.0.1 in the same process. Each notification is written by :func:`agent.outbox.put`
in a transaction of its own; the clock starts on the store thread right after that transaction's
``COMMIT`` (``Tx.on_commit``) and stops when the server has the request whole (one process, one clock).
Two runs of N (default 1,000): *one at a time* (the next change commits after the previous receipt:
the latency of a quiet daemon) and *a burst* (N changes committed back to back: latency under a
backlog).

Part 2 (cost to a goal): a goal on an instant scripted model runs R rounds (default 200) to its
``max_rounds`` and ends ``exhausted``, with every SQL statement traced: the statements that touch the
outbox are counted per ordinary round and for the ending round. Then P pause/resume cycles (default
500) time ``GoalEngine.pause`` (a status change that writes a notification) with the outbox write on
and with it stubbed out: the difference is what the outbox adds to such a transaction.

Run: ``python benchmarks/bench_notify.py [--n N] [--rounds R] [--cycles P]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

from loguru import logger

import goals.store
from agent import ModelRegistry, Reply, Runtime, ScriptedModel, ToolRegistry
from agent.outbox import put
from agent.store import Store
from agent.tx import Tx
from daemon.alerts import NotifySettings
from daemon.alerts.sender import Sender
from daemon.alerts.sinks import HttpClient, build_sinks
from goals import Budgets, GoalEngine, GoalSpec, StopRules, tools_for_goal_sessions

# The tests' local webhook server, loaded by its path (``tests/`` on sys.path would shadow the packages
# with its test folders of the same names).
_path = Path(__file__).parents[1] / "tests" / "webhook_server.py"
_spec = importlib.util.spec_from_file_location("webhook_server", _path)
assert _spec is not None and _spec.loader is not None
_webhook = importlib.util.module_from_spec(_spec)
sys.modules["webhook_server"] = _webhook
_spec.loader.exec_module(_webhook)
Received, WebhookServer = _webhook.Received, _webhook.WebhookServer


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1000:.2f} ms, p99 {pct(values, 0.99) * 1000:.2f} ms"


async def latency(n: int, burst: bool) -> list[float]:
    committed: dict[str, float] = {}
    received: dict[str, float] = {}
    arrived = asyncio.Event()
    with tempfile.TemporaryDirectory() as tmp:
        store = await Store.open(Path(tmp) / "goald.db")
        async with WebhookServer() as hook:

            def on_request(r: Received) -> None:
                received.setdefault(r.notification_id, time.perf_counter())
                arrived.set()

            hook.before_answer = on_request
            conf = NotifySettings.model_validate({"sinks": [{"type": "webhook", "name": "b", "url": f"{hook.url}/b"}]})
            http = HttpClient()
            sender = Sender(store, conf, build_sinks(conf, http, lambda wd, pol: None))  # type: ignore[arg-type,return-value]
            task = asyncio.create_task(sender.run())
            try:

                def change(tx: Tx) -> str:
                    nid = put(tx, "goal_completed", {"summary": "bench", "status": "completed"})
                    tx.on_commit(lambda: committed.__setitem__(nid, time.perf_counter()))
                    return nid

                for _ in range(n):
                    arrived.clear()
                    nid = await store.transact(change)
                    if not burst:
                        while nid not in received:
                            arrived.clear()
                            await arrived.wait()
                async with asyncio.timeout(120):
                    while len(received) < n:
                        arrived.clear()
                        await arrived.wait()
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                await http.aclose()
                await store.close()
    return [received[i] - committed[i] for i in committed]


async def goal_cost(rounds: int, cycles: int) -> None:
    model = ScriptedModel(lambda request: Reply.say("working on it"), name="instant", record=False)
    registry = ModelRegistry({model.spec: model}, default=model.spec)
    with tempfile.TemporaryDirectory() as tmp:
        async with Runtime.open(
            Path(tmp) / "goald.db",
            models=registry,
            tools=lambda row: ToolRegistry(tools_for_goal_sessions(row.config)),
        ) as rt:
            async with GoalEngine.running(rt) as engine:
                outbox_statements: list[int] = []
                done = asyncio.Event()

                def trace(sql: str) -> None:
                    if "outbox" in sql:
                        outbox_statements.append(1)

                await rt.store.trace(trace)
                no_stall = StopRules(stall_rounds=10**6)
                goal = await engine.create(GoalSpec(objective="go", budgets=Budgets(max_rounds=rounds), rules=no_stall))

                def on_change(event: object) -> None:
                    if getattr(event, "type", "") == "goal/changed" and event.data["status"] != "active":  # type: ignore[attr-defined]
                        done.set()

                remove = rt.store.hub.add_listener(on_change)
                async with asyncio.timeout(600):
                    await done.wait()
                remove()
                await rt.store.trace(None)
                ended = await engine.get(goal.id)
                n = len(outbox_statements)
                print(f"goal of {ended.rounds} rounds -> {ended.status.value}: {n} outbox statement(s) in all")
                print(f"  {n - 1} in its {ended.rounds - 1} ordinary rounds; 1 INSERT in the transaction that ended it")

                parked = await engine.create(
                    GoalSpec(objective="parked [no rounds]", budgets=Budgets(max_rounds=10**6))
                )
                await engine.pause(parked.id)

                async def pauses(label: str) -> list[float]:
                    times = []
                    for _ in range(cycles):
                        await engine.resume(parked.id)
                        started = time.perf_counter()
                        await engine.pause(parked.id)
                        times.append(time.perf_counter() - started)
                    return times

                real = goals.store.notify_status
                with_outbox = await pauses("with")
                goals.store.notify_status = lambda tx, before, goal: None  # type: ignore[assignment,return-value]
                try:
                    without = await pauses("without")
                finally:
                    goals.store.notify_status = real
                delta = statistics.median(with_outbox) - statistics.median(without)
                print(f"goal pause with the outbox row:    {ms(with_outbox)}")
                print(f"goal pause without the outbox row: {ms(without)}")
                print(f"the outbox adds {delta * 1e6:.0f} µs (median) and 1 INSERT to a status-changing transaction")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--cycles", type=int, default=500)
    args = parser.parse_args()
    logger.remove()
    logger.add(sys.stderr, level="ERROR")
    quiet = await latency(args.n, burst=False)
    print(f"commit -> webhook receipt, one at a time, {args.n} notifications: {ms(quiet)}")
    loaded = await latency(args.n, burst=True)
    print(f"commit -> webhook receipt, burst of {args.n} committed back to back: {ms(loaded)}")
    await goal_cost(args.rounds, args.cycles)


if __name__ == "__main__":
    asyncio.run(main())
