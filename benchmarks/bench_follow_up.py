"""A cluster: how long a follow-up sent through one node takes to be admitted by the node that drives
the session, with real daemons.

Three real ``goald serve`` processes (the end-to-end harness of ``tests/``, the ``test:chat``
scripted model) share a private PostgreSQL that the benchmark starts in a temporary directory
(``tests/pgkit.py``: fsync off, as the tests run it). Node b drives a chat session; the benchmark
sends N follow-ups through node a's socket, each while b's session is idle and the next only once
the last was admitted and b is idle again, and measures from the ``session/prompt`` call to the
moment the ``inbox`` row reads ``admitted`` (polled every 2 ms on one connection). The path is
a's commit, its ``NOTIFY``, b's listener, b's relay of the ``message/queued`` event and b's driver
admitting it; b's slow poll (every few seconds) would be far slower. The test
``tests/e2e/test_cluster.py::test_a_follow_up_through_another_node_is_admitted_at_once`` pins the
mechanism by counting; this prints the figure. The 1-minute load average is printed with it.

Run: ``python benchmarks/bench_follow_up.py [--count N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

# The tests' harness and PostgreSQL kit, loaded by path as the cluster benchmark loads them.
sys.path.insert(0, str(Path(__file__).parent))
from cluster_kit import TEST_MODELS, Daemon
from pg_measures import PgServer, rpc

ADMITTED = "SELECT 1 FROM inbox WHERE id = %s AND fate = 'admitted'"


async def until(check: Any, what: str, limit: float = 30.0, step: float = 0.002) -> None:
    end = time.monotonic() + limit
    while not check():
        if time.monotonic() > end:
            raise TimeoutError(f"{what}: not within {limit:.0f} s")
        await asyncio.sleep(step)


async def measure(root: Path, dsn: str, count: int) -> list[float]:
    nodes = []
    for name in ("a", "b", "c"):
        config = {
            **TEST_MODELS,
            "log_level": "WARNING",
            "store": dsn,
            "workdir_roots": [str(root / "work")],
            "cluster": {"node_name": name},
        }
        nodes.append(Daemon(root / name, config=config))
    try:
        for d in nodes:
            d.start(timeout=60)
        a, b, _ = nodes
        sid = (await rpc(b.socket_path, "session/new", {"model": "test:chat"}))["sessionId"]
        await rpc(b.socket_path, "session/prompt", {"sessionId": sid, "text": "hello"})
        with psycopg.connect(dsn, autocommit=True) as db:

            def idle() -> bool:
                sql = "SELECT type, data::jsonb->>'status' FROM events WHERE session_id = %s ORDER BY seq DESC LIMIT 1"
                return db.execute(sql, (sid,)).fetchone() == ("status", "idle")

            latencies = []
            await until(idle, "b's session idle")
            for i in range(count):
                sent = time.monotonic()
                got = await rpc(a.socket_path, "session/prompt", {"sessionId": sid, "text": f"ping {i}"})
                mid = got["messageId"]
                await until(lambda mid=mid: db.execute(ADMITTED, (mid,)).fetchone() is not None, f"ping {i} admitted")
                latencies.append(time.monotonic() - sent)
                await until(idle, "b's session idle")
        return latencies
    finally:
        for d in nodes:
            d.close()


async def run(count: int) -> None:
    server = PgServer.start()
    try:
        load = os.getloadavg()[0]
        with tempfile.TemporaryDirectory(prefix="bench-follow-up-") as tmp:
            latencies = await measure(Path(tmp), server.create_database(), count)
    finally:
        server.stop()
    ordered = sorted(latencies)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    print(f"follow-up through another node -> admitted by the holder ({count} follow-ups, load {load:.2f}):")
    print(
        f"  median {statistics.median(latencies) * 1000:.1f} ms  p90 {p90 * 1000:.1f} ms"
        f"  max {ordered[-1] * 1000:.1f} ms  (the call to a's socket included)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100, help="follow-ups sent")
    asyncio.run(run(parser.parse_args().count))


if __name__ == "__main__":
    main()
