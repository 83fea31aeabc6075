"""The work-directory fingerprint is bounded in bytes and time, and a stop ends it at once (issue 24,
"the daemon's own reads are bounded").

* Unit (real files in ``tmp_path``): 1,000 sparse 64 MiB files (62.5 GiB apparent, nothing on
  disk) cost their allocated blocks, not their size: the walk reads not a byte of them; content
  past the byte budget counts by size and times, decided from metadata alone, so an unchanged tree
  keeps its digest walk after walk, cached or not; reading stops at the time bound (the walk says
  it is incomplete, and the next walks go on from the digest cache until one is complete); a stop
  ends a walk between chunks (counted: at most the chunk in flight is read after it), and
  :class:`Fingerprinter` does not wait even for a walk stuck in a system call.
* Engine (a real runtime and goal engine on SQLite): with the 1,000 sparse files in its work
  directory, a goal decides on a whole fingerprint (no bound applied); a bounded walk says so in a
  ``goal/fingerprint`` event; stopping the engine while a walk hangs returns while it still hangs,
  and decides nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import goals.workdir_fingerprint as fingerprinting
from agent import ModelRegistry, Reply, Runtime, ScriptedModel, ToolRegistry
from goals import (
    GOAL_FINGERPRINT,
    Decision,
    FingerprintLimits,
    GoalEngine,
    GoalSpec,
    PolicyInput,
    tools_for_goal_sessions,
)
from goals.fingerprint_limits import WalkStats, WalkStopped
from goals.measure import Fingerprinter
from goals.workdir_fingerprint import fingerprint

MIB = 1024 * 1024
SPARSE_FILES = 1000


def sparse_tree(work: Path, count: int = SPARSE_FILES, size: int = 64 * MIB) -> None:
    """``count`` files of ``size`` bytes each that hold nothing on disk (``truncate``)."""
    work.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        with open(work / f"sparse{i:04d}.bin", "wb") as fh:
            os.truncate(fh.fileno(), size)


def dense(path: Path, size: int, byte: bytes = b"d") -> None:
    path.write_bytes(byte * size)


def walk(workdir: Path, **kw: Any) -> tuple[str | None, WalkStats]:
    stats = WalkStats()
    return fingerprint(workdir, stats=stats, **kw), stats


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    fingerprinting._CACHE.clear()
    yield
    fingerprinting._CACHE.clear()


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file as if written long ago: its digest is cached at once (no "racy" window)."""
    monkeypatch.setattr(fingerprinting, "_RACY_NS", 0)


def test_a_thousand_sparse_files_cost_their_blocks_not_their_size(tmp_path: Path, settled: None) -> None:
    work = tmp_path / "work"
    sparse_tree(work)
    assert sum(p.stat().st_size for p in work.iterdir()) == SPARSE_FILES * 64 * MIB  # 62.5 GiB apparent

    # Cheap by count, not by a clock: no byte read (the time bound is put off, so that a loaded
    # machine cannot cut the walk and make it look bounded).
    first, stats = walk(work, max_seconds=600)
    assert first is not None and stats.complete and not stats.bounded
    # Counted by content (a sparse file is no bigger than what it holds), and nothing was read.
    assert stats.files == SPARSE_FILES and stats.files_by_time == 0
    assert stats.bytes_read == 0 and stats.file_bytes == 0
    assert walk(work)[0] == first

    # One byte written in the middle of one file: a change, found by reading that block only.
    with open(work / "sparse0500.bin", "r+b") as fh:
        fh.seek(32 * MIB)
        fh.write(b"x")
    changed, stats = walk(work)
    assert changed != first and stats.files_read == 1
    assert 0 < stats.bytes_read <= 1 * MIB


def test_content_past_the_byte_budget_counts_by_size_and_times_and_the_digest_is_stable(
    tmp_path: Path, settled: None
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    for i in range(8):
        dense(work / f"f{i}.bin", 64 * 1024, bytes([ord("a") + i]))
    limits = {"max_bytes": 200 * 1024}  # three 64 KiB files fit, five do not

    first, stats = walk(work, **limits)
    assert stats.complete and stats.bounded
    assert (stats.files, stats.files_by_time) == (8, 5)
    assert stats.content_bytes == 3 * 64 * 1024 and stats.file_bytes == 8 * 64 * 1024
    assert stats.bytes_read <= limits["max_bytes"]
    assert stats.summary().startswith("fingerprint bounded: 5 file(s) counted by size and time")
    assert "content hashed for 192 KiB of 512 KiB" in stats.summary()

    # The same choice at every walk, cached or not: the digest of an unchanged tree stays.
    again, stats = walk(work, **limits)
    assert again == first and stats.files_read == 0
    fingerprinting._CACHE.clear()
    assert walk(work, **limits)[0] == first

    # Within the budget a file counts by content (the same bytes rewritten: no change); past it,
    # by size and times (the same bytes rewritten: a new inode and times, a change).
    def rewrite(name: str) -> None:
        path = work / name
        tmp = path.with_name(name + ".tmp")
        tmp.write_bytes(path.read_bytes())
        os.replace(tmp, path)

    rewrite("f1.bin")
    assert walk(work, **limits)[0] == first
    rewrite("f6.bin")
    assert walk(work, **limits)[0] != first


def test_reading_stops_at_the_time_bound_and_the_next_walks_go_on_from_the_cache(tmp_path: Path, settled: None) -> None:
    work = tmp_path / "work"
    work.mkdir()
    for i in range(4):
        dense(work / f"f{i}.bin", 4096, bytes([ord("a") + i]))
    whole = fingerprint(work)
    fingerprinting._CACHE.clear()

    # A deadline that has always passed: each walk reads one file (at least one, so walks that
    # keep being cut still progress), says it was cut, and caches what it read.
    cut = []
    while True:
        digest, stats = walk(work, max_seconds=1e-9)
        if stats.complete:
            break
        cut.append(stats)
        assert stats.cut == "time" and not stats.complete and stats.files_read == 1
        assert "not judged for progress" in stats.summary()
    assert len(cut) == 3  # the fourth walk read the last file and was complete
    assert digest == whole


def test_a_file_system_that_reports_no_holes_stops_at_the_byte_budget(
    tmp_path: Path, settled: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "work"
    sparse_tree(work, count=8, size=1 * MIB)
    # As if SEEK_DATA were not supported: every byte of every file is "data", zeros read and hashed.
    monkeypatch.setattr(fingerprinting, "_data_extents", lambda fd, size: iter([(0, size)]))
    _, stats = walk(work, max_bytes=3 * MIB)
    assert stats.cut == "bytes" and stats.bytes_read <= 3 * MIB
    assert "reading stopped at 3 MiB" in stats.summary()


def _slow_reads(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Make reading slow (16-byte chunks); the returned event is set once reading has begun."""
    begun = threading.Event()
    real = fingerprinting._data_extents

    def extents(fd: int, size: int) -> Iterator[tuple[int, int]]:
        begun.set()
        yield from real(fd, size)

    monkeypatch.setattr(fingerprinting, "_CHUNK", 16)
    monkeypatch.setattr(fingerprinting, "_data_extents", extents)
    return begun


def _walk_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("goald-fingerprint")]


async def test_a_stop_ends_a_walk_between_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    dense(work / "big.bin", 16 * MIB)  # a million 16-byte reads: seconds, unless stopped
    begun = _slow_reads(monkeypatch)
    reads = [0]
    pread = os.pread

    def counted(fd: int, length: int, offset: int) -> bytes:
        got = pread(fd, length, offset)
        reads[0] += 1
        return got

    monkeypatch.setattr(os, "pread", counted)
    walker = Fingerprinter(FingerprintLimits(max_seconds=600))
    task = asyncio.create_task(walker.walk(work))
    assert await asyncio.to_thread(begun.wait, 10)
    walker.stop()
    read_by_the_stop = reads[0]
    # The walk's caller is answered at once (the time limit is only a guard against a hang) ...
    with pytest.raises(WalkStopped):
        async with asyncio.timeout(10):
            await task
    # ... and the thread ends too, between chunks (the flag is checked before each), not at the end
    # of the file: at most the chunk in flight when the flag was set is read after it. Counted.
    for thread in _walk_threads():
        await asyncio.to_thread(thread.join, 30)
    assert not _walk_threads()
    assert reads[0] - read_by_the_stop <= 1, (read_by_the_stop, reads[0])
    assert reads[0] < 16 * MIB // 16
    monkeypatch.setattr(fingerprinting, "_CHUNK", 1024 * 1024)
    assert (await walker.walk(work)).known is not None  # a walk asked for after the stop runs


async def test_a_walk_stuck_in_a_system_call_does_not_hold_the_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    dense(work / "f.bin", 4096)
    entered, release = threading.Event(), threading.Event()

    def hung(fd: int, size: int) -> Iterator[tuple[int, int]]:
        entered.set()
        release.wait(30)  # a hung network file system, say
        yield 0, size

    monkeypatch.setattr(fingerprinting, "_data_extents", hung)
    walker = Fingerprinter()
    task = asyncio.create_task(walker.walk(work))
    try:
        assert await asyncio.to_thread(entered.wait, 10)
        walker.stop()
        # The walk is stuck until released (30 s): the stop answers while it still is.
        with pytest.raises(WalkStopped):
            async with asyncio.timeout(10):
                await task
        assert not release.is_set() and _walk_threads()  # it still hangs, not waited for
        assert all(t.daemon for t in _walk_threads())  # never waited for at the process's exit
    finally:
        release.set()
    for thread in _walk_threads():
        await asyncio.to_thread(thread.join, 5)


# -- the engine ------------------------------------------------------------------------------------


def _engine_runtime(db_path: Path, *, delay: float = 0.0, **engine_kw: Any) -> Any:
    """A runtime and a running engine; the goals' model answers in words (after ``delay`` seconds)."""
    model = ScriptedModel(lambda request: Reply.say("working on it", delay=delay), name="w")
    registry = ModelRegistry({model.spec: model}, default=model.spec)

    @contextlib.asynccontextmanager
    async def rig() -> Any:
        async with Runtime.open(
            db_path, models=registry, tools=lambda row: ToolRegistry(tools_for_goal_sessions(row.config))
        ) as rt:
            engine = GoalEngine(rt, timer_interval=0.05, **engine_kw)
            await engine.start()
            try:
                yield rt, engine
            finally:
                await engine.stop()

    return rig()


async def test_a_goal_over_a_thousand_sparse_files_decides_on_a_whole_fingerprint(
    db_path: Path, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    sparse_tree(work)
    decided = asyncio.Event()
    seen: list[tuple[PolicyInput, Decision]] = []

    def on_decision(inp: PolicyInput, decision: Decision) -> None:
        seen.append((inp, decision))
        decided.set()

    # The time bound is put off so that a loaded machine cannot cut the walk; the byte bound (256
    # MiB, 0.4 % of the apparent size) stays: the files are cheap by count (no bound applied, so no
    # ``goal/fingerprint`` event), not by a clock. The time limit is only a guard against a hang;
    # the time taken is printed.
    limits = FingerprintLimits(max_seconds=600)
    async with _engine_runtime(db_path, fingerprint_limits=limits) as (rt, engine):
        engine.add_decision_listener(on_decision)
        started = time.monotonic()
        async with asyncio.timeout(60):
            goal = await engine.create(GoalSpec(objective="Tidy the files.", workdir=str(work)))
            await decided.wait()
        took = time.monotonic() - started
        events = await rt.store.events_after(goal.session_id, 0, limit=1000)
    inp, decision = seen[0]
    assert inp.fingerprint is not None and inp.fingerprint == goal.memory.fingerprint  # walked whole, unchanged
    assert decision.round == 2, decision
    assert not [e for e in events if e.type == GOAL_FINGERPRINT]  # no bound applied: nothing to say
    print(f"created and decided over {SPARSE_FILES} sparse 64 MiB files in {took:.3f}s")


async def test_a_bounded_walk_says_so_in_the_goals_events(db_path: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    for i in range(6):
        dense(work / f"f{i}.bin", 64 * 1024, bytes([ord("a") + i]))
    decided = asyncio.Event()
    limits = FingerprintLimits(max_bytes=128 * 1024)
    async with _engine_runtime(db_path, fingerprint_limits=limits) as (rt, engine):
        engine.add_decision_listener(lambda inp, decision: decided.set())
        goal = await engine.create(GoalSpec(objective="Tidy the files.", workdir=str(work)))
        async with asyncio.timeout(10):
            await decided.wait()
        events = await rt.store.events_after(goal.session_id, 0, limit=1000)
    said = [e for e in events if e.type == GOAL_FINGERPRINT]
    assert len(said) == 1, [e.type for e in events]
    data = said[0].data
    assert data["goalId"] == goal.id and data["filesByTime"] == 4 and data["files"] == 6
    assert data["contentBytes"] == 128 * 1024 and data["cut"] is None
    assert data["diskBytes"] >= 6 * 64 * 1024
    assert data["text"].startswith("fingerprint bounded: 4 file(s) counted by size and time")
    assert said[0].payload.type == GOAL_FINGERPRINT  # read through its typed payload


async def test_stopping_the_engine_does_not_wait_for_a_walk_and_decides_nothing(
    db_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    dense(work / "f.bin", 4096)
    hold, entered, release = threading.Event(), threading.Event(), threading.Event()
    real = fingerprinting._data_extents

    def extents(fd: int, size: int) -> Iterator[tuple[int, int]]:
        if hold.is_set():
            entered.set()
            release.wait(30)
        yield from real(fd, size)

    monkeypatch.setattr(fingerprinting, "_data_extents", extents)
    decisions: list[Decision] = []
    try:
        async with _engine_runtime(db_path, delay=0.5) as (_rt, engine):
            engine.add_decision_listener(lambda inp, decision: decisions.append(decision))
            goal = await engine.create(GoalSpec(objective="Tidy the files.", workdir=str(work)))
            # The creation's walk has read the file; the walk at round 1's idle (the model answers
            # after 0.5 s) reads it again (written moments ago, it was not cached) and hangs there.
            hold.set()
            assert await asyncio.to_thread(entered.wait, 10)
            # The walk hangs until released (30 s): the stop returns while it still hangs (the time
            # limit, well inside the hang, is the proof that it did not wait; not a speed check).
            async with asyncio.timeout(10):
                await engine.stop()
            still_hung = bool(_walk_threads())
            after = await engine.get(goal.id)
    finally:
        release.set()
    assert still_hung
    assert decisions == [] and after.evaluated_seq == goal.evaluated_seq and after.rounds == 0
