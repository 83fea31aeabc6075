"""The status page's cost: page response times on a big store, and the event-loop lag that open
live pages add to a fleet run.

One in-process daemon host (the ``Host`` that ``goald serve`` runs) with ``[web]`` on, and an
instant scripted model. Fixtures:

- 1,000 goals (``--goals``), each run for one round (they end ``exhausted``): the goals table.
- one goal with 10,000 rounds (``--rounds``) of history, built by a bulk fixture that writes each
  round's events (continuation queued and admitted, turn, three model answers with usage, two tool
  results, turn end, idle) through the store's own transaction API, not by running them.

Then a client in a child process (so that its work does not count against the daemon's loop)
times the goals table, that goal's page (first response: describe + first timeline page), an
older timeline page, the burn-down chart (cold, then cached) and the daemon page: p50 and max
of ``--repeat`` requests each. Last, a fleet of ``--fleet`` goals x 5 rounds runs twice, without and
with 20 live pages open on its goals (each a server-sent-events stream read by the child), and
the event loop's lag (a 10 ms ticker) is compared.

Run: ``python benchmarks/bench_web.py [--goals N] [--rounds R] [--fleet F] [--repeat K]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from loguru import logger

from agent import AgentStatus, Reply, ScriptedModel, Tx
from daemon.host import Host
from daemon.settings import load_settings
from daemon.web.tokens import TokenFile
from goals import Budgets, GoalSpec, StopRules

CLIENT = textwrap.dedent(
    """
    import json, sys, time, urllib.request
    base, token, paths, repeat = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
    out = {}
    for name, path in paths:
        times = []
        for i in range(repeat):
            req = urllib.request.Request(base + path, headers={"Authorization": "Bearer " + token})
            t0 = time.perf_counter()
            with urllib.request.urlopen(req) as resp:
                resp.read(1)
                first = time.perf_counter() - t0
                body = resp.read()
            times.append(first)
        out[name] = {"times": times, "bytes": len(body) + 1}
    print(json.dumps(out))
    """
)

LISTENER = textwrap.dedent(
    """
    import socket, sys, selectors
    port, token, paths = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    sel = selectors.DefaultSelector()
    for p in paths:
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(f"GET {p} HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\nAuthorization: Bearer {token}\\r\\n\\r\\n".encode())
        sel.register(s, selectors.EVENT_READ)
    print("open", flush=True)
    got = 0
    while True:
        for key, _ in sel.select(timeout=1):
            data = key.fileobj.recv(65536)
            if not data:
                sel.unregister(key.fileobj)
            got += len(data)
        if not sel.get_map():
            break
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def ticker(lags: list[float], stop: asyncio.Event, period: float = 0.01) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        t0 = loop.time()
        await asyncio.sleep(period)
        lags.append(loop.time() - t0 - period)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bulk_rounds(session_id: str, goal_id: str, first_round: int, count: int, model: str) -> Any:
    """One transaction writing ``count`` rounds of a goal's history, as the driver would have."""

    def write(tx: Tx) -> None:
        for n in range(first_round, first_round + count):
            mid, turn = f"msg_bulk{n:08d}", f"turn_bulk{n:08d}"
            source = {"kind": "goal", "ref": f"{goal_id}#{n}"}
            tx.emit(session_id, "message/queued", {"messageId": mid, "delivery": "followup", "source": source})
            tx.set_status(session_id, AgentStatus.RUNNING)
            content = [{"type": "text", "text": f"[goal {goal_id}] round {n}: keep going"}]
            tx.emit(
                session_id, "message/admitted", {"messageId": mid, "turnId": turn, "source": source, "content": content}
            )
            tx.emit(session_id, "turn/start", {"turnId": turn})
            for step in range(3):
                usage = {"input": 900 + step, "output": 60}
                answer: list[dict[str, Any]] = [{"type": "text", "text": f"Round {n} step {step}."}]
                if step < 2:
                    answer.append(
                        {
                            "type": "tool_use",
                            "id": f"tu{n}_{step}",
                            "name": "write_file",
                            "input": {"path": f"r{n}.txt"},
                        }
                    )
                tx.emit(
                    session_id,
                    "assistant/message",
                    {"turnId": turn, "content": answer, "model": model, "usage": usage, "cost": 0.0001},
                )
                if step < 2:
                    tx.emit(
                        session_id,
                        "tool/result",
                        {"turnId": turn, "tool_use_id": f"tu{n}_{step}", "name": "write_file", "content": "ok"},
                    )
            tx.emit(session_id, "turn/end", {"turnId": turn, "reason": "end_turn", "steps": 3})
            tx.set_status(session_id, AgentStatus.IDLE)

    return write


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        settings = load_settings(
            None,
            state_dir=Path(tmp),
            log_level="WARNING",
            web={"enabled": True, "listen": f"127.0.0.1:{port}"},
            max_concurrent_turns=16,
        )
        token = TokenFile(settings.web.tokens_path(settings.state_dir)).add("bench")
        host = Host(settings)
        host.models.add(ScriptedModel(lambda r: Reply.say("working"), name="fleet", record=False), "scripted:fleet")
        server = asyncio.get_running_loop().create_task(host.run())
        await asyncio.wait_for(host.ready.wait(), 60)
        assert host.rt is not None and host.engine is not None
        rt, engine = host.rt, host.engine
        ended = 0
        all_ended = asyncio.Event()
        want = args.goals

        def on_event(event: Any) -> None:
            nonlocal ended
            if event.type == "goal/changed" and event.data.get("status") not in ("active", "paused"):
                ended += 1
                if ended >= want:
                    all_ended.set()

        remove = rt.store.hub.add_listener(on_event)
        t0 = time.perf_counter()
        for i in range(args.goals):
            await engine.create(
                GoalSpec(
                    objective=f"Table goal {i}.",
                    title=f"table goal {i}",
                    model="scripted:fleet",
                    budgets=Budgets(max_rounds=1),
                )
            )
        await asyncio.wait_for(all_ended.wait(), 3600)
        remove()
        print(f"fixture: {args.goals} goals run for one round each in {time.perf_counter() - t0:.1f} s")

        big = await engine.create(
            GoalSpec(
                objective="The long one.",
                title="ten thousand rounds",
                model="scripted:fleet",
                budgets=Budgets(max_rounds=10**6),
            )
        )
        await engine.pause(big.id)
        agent = await rt.agent(big.session_id)
        await agent.when_idle()
        t0 = time.perf_counter()
        for start in range(1, args.rounds + 1, 500):
            await rt.store.transact(
                bulk_rounds(big.session_id, big.id, start, min(500, args.rounds + 1 - start), "scripted:fleet")
            )
        st = await rt.store.session_state(big.session_id)
        print(
            f"fixture: {args.rounds} rounds ({st.last_seq} events) written in bulk in {time.perf_counter() - t0:.1f} s"
        )

        base = f"http://127.0.0.1:{port}"
        paths = [
            ("goals table (1,000+ goals)", "/"),
            ("one goal, 10,000 rounds: first response", f"/goals/{big.id}"),
            ("an older timeline page", f"/goals/{big.id}/timeline?before={st.last_seq // 2}"),
            (
                "a band's conversation",
                f"/goals/{big.id}/conversation?after={st.last_seq // 2}&upto={st.last_seq // 2 + 15}",
            ),
            ("burn-down chart (first: reads all charges)", f"/goals/{big.id}/burn.svg"),
            ("daemon page", "/daemon"),
        ]
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CLIENT, base, token, json.dumps(paths), str(args.repeat), stdout=subprocess.PIPE
        )
        out, _ = await proc.communicate()
        timings = json.loads(out)
        print(f"page response times (time to first byte, {args.repeat} requests each, client in a child process):")
        for name, t in timings.items():
            times = t["times"]
            extra = f", first {times[0] * 1e3:.0f} ms then cached" if name.startswith("burn") else ""
            print(
                f"  {name:45s} p50 {statistics.median(times) * 1e3:7.1f} ms  max {max(times) * 1e3:7.1f} ms"
                f"  ({t['bytes'] / 1024:.0f} KiB{extra})"
            )

        async def fleet(live_pages: int) -> tuple[list[float], float]:
            done = 0
            finished = asyncio.Event()

            def on_done(event: Any) -> None:
                nonlocal done
                if event.type == "goal/changed" and event.data.get("status") not in ("active", "paused"):
                    done += 1
                    if done >= args.fleet:
                        finished.set()

            gone = rt.store.hub.add_listener(on_done)
            created = []
            for i in range(args.fleet):
                created.append(
                    await engine.create(
                        GoalSpec(
                            objective=f"Fleet goal {i}.",
                            model="scripted:fleet",
                            budgets=Budgets(max_rounds=5),
                            rules=StopRules(stall_rounds=10**6),
                        )
                    )
                )
            listener = None
            if live_pages:
                pages = [f"/goals/{g.id}/live?after=0" for g in created[:live_pages]]
                listener = await asyncio.create_subprocess_exec(
                    sys.executable, "-c", LISTENER, str(port), token, *pages, stdout=subprocess.PIPE
                )
                assert listener.stdout is not None
                await listener.stdout.readline()
            lags: list[float] = []
            stop = asyncio.Event()
            tick = asyncio.get_running_loop().create_task(ticker(lags, stop))
            t0 = time.perf_counter()
            await asyncio.wait_for(finished.wait(), 3600)
            took = time.perf_counter() - t0
            stop.set()
            await tick
            gone()
            if listener is not None:
                listener.kill()
                await listener.wait()
            return lags, took

        for live in (0, 20):
            lags, took = await fleet(live)
            print(
                f"fleet of {args.fleet} goals x 5 rounds with {live:2d} live pages open: {took:.1f} s; event-loop lag"
                f" p50 {statistics.median(lags) * 1e3:.1f} ms, p99 {pct(lags, 0.99) * 1e3:.1f} ms,"
                f" max {max(lags) * 1e3:.1f} ms ({len(lags)} ticks)"
            )
        host.request_stop()
        await server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--goals", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=10_000)
    parser.add_argument("--fleet", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
