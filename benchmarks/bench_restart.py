"""Restart: how long the daemon takes from process start to ``READY=1`` on a big store.

Builds a store with N goals (default 1,000) whose sessions hold E events in all (default
1,000,000): the goals run a couple of real rounds in an embedded host that is then stopped
mid-flight (some turns cut, continuations queued, decisions pending), and each session's history
is padded with older events so the store holds E events. Then it starts ``goald serve`` as a
process with a real ``NOTIFY_SOCKET`` and measures the time from spawning it to ``READY=1``, which
the daemon sends only once the socket serves and every active goal's pending decision is made.
Run a few times; prints each and the median.

Run: ``python benchmarks/bench_restart.py [--goals N] [--events E] [--runs K]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from loguru import logger

from daemon.host import Host
from daemon.settings import load_settings
from goals import Budgets, GoalSpec, StopRules


async def build(state: Path, goals: int) -> None:
    settings = load_settings(None, state_dir=state, log_level="WARNING", shutdown_grace_seconds=0.5)
    host = Host(settings)

    server = asyncio.get_running_loop().create_task(host.run())
    await asyncio.wait_for(host.ready.wait(), 60)
    assert host.engine is not None and host.rt is not None
    admitted = 0
    enough = asyncio.Event()

    def on_event(event: object) -> None:
        nonlocal admitted
        data = getattr(event, "data", {})
        if getattr(event, "type", "") == "message/admitted" and data.get("source", {}).get("kind") == "goal":
            admitted += 1
            if admitted >= goals * 2:
                enough.set()

    host.rt.store.hub.add_listener(on_event)
    for _ in range(goals):
        await host.engine.create(
            GoalSpec(
                objective="Restart benchmark goal.",
                model="scripted:echo",
                budgets=Budgets(max_rounds=1000),
                rules=StopRules(stall_rounds=10**6),
            )
        )
    await asyncio.wait_for(enough.wait(), 600)
    host.request_stop()
    await server


def pad(db: Path, total_events: int) -> int:
    """Give every session older history so that the store holds ``total_events`` events."""
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=WAL")
    sessions = [r[0] for r in conn.execute("SELECT id FROM sessions")]
    have = conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    per = max(0, (total_events - have) // max(len(sessions), 1))
    filler = json.dumps(
        {
            "turnId": "turn_old",
            "content": [{"type": "text", "text": "an older answer " * 12}],
            "finishReason": "end_turn",
            "model": "scripted:old",
            "usage": {"input_tokens": 900, "output_tokens": 60},
        }
    )
    with conn:
        for sid in sessions:
            conn.execute("UPDATE events SET seq = -seq WHERE session_id=?", (sid,))
            conn.execute("UPDATE events SET seq = -seq + ? WHERE session_id=?", (per, sid))
            conn.execute(
                "UPDATE turns SET start_seq = start_seq + ?, end_seq = end_seq + ? WHERE session_id=?", (per, per, sid)
            )
            conn.execute("UPDATE inbox SET queued_seq = queued_seq + ? WHERE session_id=?", (per, sid))
            conn.execute("UPDATE goals SET evaluated_seq = evaluated_seq + ? WHERE session_id=?", (per, sid))
            conn.executemany(
                "INSERT INTO events(session_id, seq, type, data, at) VALUES (?,?,?,?,?)",
                ((sid, i, "assistant/message", filler, "2026-01-01T00:00:00+00:00") for i in range(1, per + 1)),
            )
    total = conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return int(total)


def time_to_ready(state: Path) -> tuple[float, str]:
    notify_dir = Path(tempfile.mkdtemp(prefix="gr-", dir="/tmp"))
    path = notify_dir / "n.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(30)
    config = state / "bench.toml"
    config.write_text(f'state_dir = "{state}"\nlog_level = "WARNING"\nshutdown_grace_seconds = 0.5\n')
    env = {**os.environ, "NOTIFY_SOCKET": str(path)}
    t0 = time.perf_counter()
    errors = open(state / "bench-stderr.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "daemon", "--config", str(config), "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=errors,
    )
    try:
        while True:
            try:
                msg = sock.recv(65536).decode()
            except TimeoutError:
                said = (state / "bench-stderr.log").read_text()[-3000:]
                raise SystemExit(f"no READY=1; the daemon said:\n{said}") from None
            if "READY=1" in msg.split("\n"):
                elapsed = time.perf_counter() - t0
                status = next((line for line in msg.split("\n") if line.startswith("STATUS=")), "")
                break
        proc.terminate()
        t1 = time.perf_counter()
        proc.wait(120)
        return elapsed, f"{status}; SIGTERM -> exit in {time.perf_counter() - t1:.2f} s"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)
        errors.close()
        sock.close()
        path.unlink(missing_ok=True)
        notify_dir.rmdir()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--goals", type=int, default=1000)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    logger.remove()
    logger.add(sys.stderr, level="ERROR")
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        t0 = time.perf_counter()
        asyncio.run(build(state, args.goals))
        total = pad(state / "goald.db", args.events)
        size = (state / "goald.db").stat().st_size / 2**20
        print(
            f"store: {args.goals} goals, {total:,} events, {size:.0f} MiB (built in {time.perf_counter() - t0:.1f} s)"
        )
        times = []
        for i in range(args.runs):
            elapsed, status = time_to_ready(state)
            times.append(elapsed)
            print(f"  run {i + 1}: process start -> READY=1 in {elapsed:.3f} s ({status})")
        print(f"  median {statistics.median(times):.3f} s")


if __name__ == "__main__":
    main()
