"""Control socket under load: ``daemon/health`` latency while idle and half-written connections pile up.

Starts ``goald serve`` as a process (soft descriptor limit 1,024 at start; the daemon raises it),
with a connection cap (default 256). Measures the latency of ``daemon/health`` on a fresh
connection (connect, call, answer) with no load, then opens I idle connections (default 2,000) and
P connections that each send 100 kB of a frame and stop (default 200), and measures it again K
times (default 50) while they are held, counting the daemon's open descriptors
(``/proc/PID/fd``). The frame timeout is 10 s (the default), so the half-written frames are
still held (or made room for by the cap) while the second series runs.

Run: ``python benchmarks/bench_socket_load.py [--idle I] [--partial P] [--cap C] [--calls K]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from daemon.client import Connection as Client
from daemon.rpc.server import raise_nofile_limit

HALF_FRAME = b'{"jsonrpc":"2.0","id":1,"method":"daemon/health","params":{"pad":"' + b"x" * 100_000


def start(state: Path, cap: int) -> subprocess.Popen[bytes]:
    config = state / "goald.toml"
    config.write_text(f'state_dir = "{state}"\nmax_connections = {cap}\nlog_level = "WARNING"\nsandbox = "none"\n')
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "daemon", "--config", str(config), "serve"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(state / "stderr.log", "wb"),  # noqa: SIM115 - the child keeps it
        )
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return proc


async def health_latency(path: Path) -> float:
    began = time.perf_counter()
    async with await Client.connect(path) as client:
        await client.call("daemon/health")
    return time.perf_counter() - began


async def series(path: Path, calls: int) -> list[float]:
    return [await asyncio.wait_for(health_latency(path), 30) for _ in range(calls)]


def show(label: str, values: list[float]) -> None:
    ms = sorted(v * 1000 for v in values)
    p95 = ms[min(len(ms) - 1, int(len(ms) * 0.95))]
    print(f"{label}: median {statistics.median(ms):.2f} ms, p95 {p95:.2f} ms, max {ms[-1]:.2f} ms ({len(ms)} calls)")


async def main(idle: int, partial: int, cap: int, calls: int) -> None:
    raise_nofile_limit()
    state = Path(tempfile.mkdtemp(prefix="goald-bench-socket-"))
    proc = start(state, cap)
    path = state / "goald.sock"
    socks: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 60
        while True:  # the benchmark's own start-up wait; tests wait on READY=1 instead
            try:
                await health_latency(path)
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError((state / "stderr.log").read_text()) from None
                await asyncio.sleep(0.05)
        show("no load", await series(path, calls))
        peak = 0
        began = time.monotonic()
        for i in range(idle + partial):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(path))
            if i >= idle:
                sock.sendall(HALF_FRAME)
            socks.append(sock)
            if i % 20 == 0:
                peak = max(peak, len(os.listdir(f"/proc/{proc.pid}/fd")))
        opened = time.monotonic() - began
        show(f"{idle} idle + {partial} half-written connections, cap {cap}", await series(path, calls))
        fds = len(os.listdir(f"/proc/{proc.pid}/fd"))
        print(f"opened them in {opened:.2f} s; daemon descriptors: peak {peak} while opening, {fds} after")
        log = (state / "stderr.log").read_text(errors="replace").splitlines()
        print(f"daemon log: {len(log)} line(s)")
    finally:
        for sock in socks:
            sock.close()
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=int, default=2000)
    parser.add_argument("--partial", type=int, default=200)
    parser.add_argument("--cap", type=int, default=256)
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    asyncio.run(main(args.idle, args.partial, args.cap, args.calls))
