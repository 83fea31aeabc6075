"""What a goal on a repository's checkpoints cost: one per round, on a work directory of N files.

A checkpoint reads every file of the work directory as data (a model may change a file and keep
its size and time, so nothing is skipped by its stat), hashes it and stores what is new. This makes
a tree of ``--files`` files (default 2,000, 4 KiB each, in 40 directories), takes the start and
``--rounds`` round checkpoints (default 20), one file changed per round, and prints per checkpoint
the wall and CPU time, the bytes read, and what the store grew by; then one diff of the last round
and one of the whole goal. Run: ``python benchmarks/bench_checkpoints.py [--files N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from goals.snapshots import Snapshots


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work, store = Path(tmp) / "work", Path(tmp) / "snapshots"
        for i in range(args.files):
            d = work / f"pkg{i % 40}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"mod{i}.py").write_text((f"# module {i}\n" + "x = 1\n" * 680)[:4096])
        snaps = Snapshots(store)
        t0, c0 = time.perf_counter(), time.process_time()
        base = snaps.take("g", "base", work)
        first = (time.perf_counter() - t0, time.process_time() - c0, _size(store))
        walls, cpus, grown = [], [], []
        for r in range(1, args.rounds + 1):
            target = work / f"pkg{r % 40}" / f"mod{r}.py"
            target.write_text(target.read_text() + f"y{r} = {r}\n")
            before = _size(store)
            t0, c0 = time.perf_counter(), time.process_time()
            snaps.take("g", f"round-{r}", work)
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
            grown.append(_size(store) - before)
        read = sum(os.path.getsize(p) for p in work.rglob("*.py"))
        last = snaps.manifest("g", f"round-{args.rounds}")
        prev = snaps.manifest("g", f"round-{args.rounds - 1}")
        assert last is not None and prev is not None
        t0 = time.perf_counter()
        one = snaps.diff("g", prev, last)
        diff_round = time.perf_counter() - t0
        t0 = time.perf_counter()
        whole = snaps.diff("g", base, last)
        diff_whole = time.perf_counter() - t0
        print(f"work directory: {args.files:,} files, {read / 1e6:.1f} MB")
        print(
            f"start checkpoint: {first[0] * 1e3:.0f} ms wall, {first[1] * 1e3:.0f} ms CPU,"
            f" store {first[2] / 1e6:.2f} MB"
        )
        print(
            f"round checkpoints ({args.rounds}): median {statistics.median(walls) * 1e3:.0f} ms wall"
            f" (max {max(walls) * 1e3:.0f}), {statistics.median(cpus) * 1e3:.0f} ms CPU;"
            f" {read / statistics.median(walls) / 1e6:.0f} MB/s read; store grew {statistics.median(grown):,.0f} B"
            f" per round (a manifest and one changed file)"
        )
        print(
            f"diff of one round: {len(one)} file, {diff_round * 1e3:.1f} ms;"
            f" of the whole goal: {len(whole)} files, {diff_whole * 1e3:.1f} ms"
        )


if __name__ == "__main__":
    main()
