"""Restart: how long the daemon takes from process start to ``READY=1``, on a small store and a big one.

A store holds N goals whose sessions hold E events in all: the goals run a couple of real rounds
in an embedded host that is then stopped mid-flight (some turns cut, continuations queued,
decisions pending), and each session's history is padded with older events so the store holds E
events. Then ``goald serve`` starts as a process with a real ``NOTIFY_SOCKET``, and the time from
spawning it to ``READY=1`` is measured; the daemon sends that once the socket serves, and loads
the live goals and makes their pending decisions right after. Each figure is the median of its runs.
Next to the wall time, the CPU time the daemon had used by then (user + system, from ``/proc``) is
printed: on a shared machine it varies far less than the wall time.

Two stores are measured: a small one (default 10 goals, 10,000 events, 20 restarts) and a big
one (default 10,000 goals, 10,000,000 events, 3 restarts). Building the big one takes minutes and
gigabytes, so it is built once into a cache directory under ``/tmp`` (``--cache``; reused while
it exists, delete it to rebuild) and copied for each measurement, so every run starts from the
same store.

Run: ``python benchmarks/bench_restart.py [--goals N] [--events E] [--runs K] [--small-runs K]
[--skip-large]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
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


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a running process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def time_to_ready(state: Path) -> tuple[float, float, str]:
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
                cpu = cpu_seconds(proc.pid)
                status = next((line for line in msg.split("\n") if line.startswith("STATUS=")), "")
                break
        proc.terminate()
        t1 = time.perf_counter()
        proc.wait(120)
        return elapsed, cpu, f"{status}; SIGTERM -> exit in {time.perf_counter() - t1:.2f} s"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)
        errors.close()
        sock.close()
        path.unlink(missing_ok=True)
        notify_dir.rmdir()


def build_store(state: Path, goals: int, events: int) -> str:
    """Build a store of ``goals`` goals and about ``events`` events in ``state``; returns a summary."""
    t0 = time.perf_counter()
    asyncio.run(build(state, goals))
    total = pad(state / "goald.db", events)
    size = (state / "goald.db").stat().st_size / 2**20
    return f"{goals:,} goals, {total:,} events, {size:,.0f} MiB (built in {time.perf_counter() - t0:.1f} s)"


def measure(state: Path, runs: int) -> float:
    """Restart ``runs`` times; prints each run and returns the median seconds to READY=1."""
    times, cpus = [], []
    for i in range(runs):
        elapsed, cpu, status = time_to_ready(state)
        times.append(elapsed)
        cpus.append(cpu)
        print(f"  run {i + 1}: process start -> READY=1 in {elapsed:.3f} s, {cpu:.2f} s CPU ({status})")
    median = statistics.median(times)
    print(f"  median {median:.3f} s over {runs} restart(s); median CPU by READY=1 {statistics.median(cpus):.3f} s")
    return median


def cached_store(cache: Path, goals: int, events: int) -> str:
    """The big store, built into ``cache`` unless it is there already; returns a summary."""
    summary_file = cache / "summary.txt"
    if (cache / "goald.db").exists() and summary_file.exists():
        return summary_file.read_text().strip() + f" (cached in {cache})"
    building = Path(tempfile.mkdtemp(prefix="building-", dir=cache.parent))
    summary = build_store(building, goals, events)
    (building / "summary.txt").write_text(summary)
    shutil.rmtree(cache, ignore_errors=True)
    building.rename(cache)
    return summary + f" (built into {cache})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--goals", type=int, default=10_000, help="goals in the big store")
    parser.add_argument("--events", type=int, default=10_000_000, help="events in the big store")
    parser.add_argument("--runs", type=int, default=3, help="restarts of the big store")
    parser.add_argument("--small-goals", type=int, default=10)
    parser.add_argument("--small-events", type=int, default=10_000)
    parser.add_argument("--small-runs", type=int, default=20)
    parser.add_argument("--skip-large", action="store_true", help="measure the small store only")
    parser.add_argument("--cache", type=Path, help="where the big store is kept between runs")
    args = parser.parse_args()
    logger.remove()
    logger.add(sys.stderr, level="ERROR")
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "small"
        state.mkdir()
        print(f"small store: {build_store(state, args.small_goals, args.small_events)}")
        small = measure(state, args.small_runs)
    if args.skip_large:
        return
    cache = args.cache or Path(f"/tmp/goald-bench-restart-{args.goals}g-{args.events}e")
    print(f"big store: {cached_store(cache, args.goals, args.events)}")
    with tempfile.TemporaryDirectory(dir=cache.parent) as tmp:
        state = Path(tmp)
        shutil.copy2(cache / "goald.db", state / "goald.db")
        large = measure(state, args.runs)
    print(f"READY=1 median: small store {small:.3f} s, big store {large:.3f} s")


if __name__ == "__main__":
    main()
