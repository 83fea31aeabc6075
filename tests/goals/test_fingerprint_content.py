"""The work-directory fingerprint follows content, not modification times.

* Unit (real files in ``tmp_path``): rewriting a file with the same bytes (replaced by rename, as
  ``write_file`` does: a new inode and new times) or touching it leaves the fingerprint as it was;
  a change of content, a rename, a new empty directory change it. An unchanged tree costs no reads
  (the digest cache); a file changed moments before the walk is read again (the racy case); a file
  over the size bound counts by size and time; a FIFO is never opened; the cache is bounded.
* End to end (a real daemon, bubblewrap, scripted models): a model that rewrites the same file
  with identical bytes each round and notes progress in new words is paused ``stalled`` within
  2N+1 rounds; one that writes new bytes each round makes progress every round.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import Daemon, rpc, wait_goal

import goals.workdir_fingerprint as fingerprinting
from goals.fingerprint_limits import WalkStats
from goals.workdir_fingerprint import fingerprint


def replace_with(path: Path, data: bytes) -> None:
    """Write ``data`` to a new file and rename it over ``path`` (a new inode, new times)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def reads(workdir: Path, **kw: Any) -> tuple[str | None, int]:
    stats = WalkStats()
    fp = fingerprint(workdir, stats=stats, **kw)
    return fp, stats.files_read


def test_same_bytes_rewritten_or_touched_is_no_change_and_new_content_is(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "src").mkdir(parents=True)
    target = work / "src" / "notes.txt"
    target.write_bytes(b"the same draft\n")
    (work / "README").write_text("hello\n")
    before = fingerprint(work)
    ino = target.stat().st_ino

    replace_with(target, b"the same draft\n")
    assert target.stat().st_ino != ino
    st = target.stat()
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    assert fingerprint(work) == before

    seen = {"before": before}
    replace_with(target, b"the same draft, longer\n")
    seen["content changed"] = fingerprint(work)
    replace_with(target, b"the same draft, LONGER\n")
    seen["same size, other bytes"] = fingerprint(work)
    (work / "src" / "notes.txt").rename(work / "src" / "notes.md")
    seen["renamed"] = fingerprint(work)
    (work / "empty").mkdir()
    seen["a new empty directory"] = fingerprint(work)
    os.symlink("/etc/passwd", work / "link")
    seen["a link"] = fingerprint(work)
    assert len(set(seen.values())) == len(seen), seen


def test_an_unchanged_tree_costs_no_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    (work / "a" / "b").mkdir(parents=True)
    for i in range(50):
        (work / "a" / f"f{i}").write_bytes(b"x" * i)
        (work / "a" / "b" / f"g{i}").write_bytes(b"y" * i)
    # A file changed moments before the walk is read again next time (it could change again
    # within the same clock tick, its key unchanged): with the default window, all of them.
    first, n = reads(work)
    assert n == 100
    assert reads(work) == (first, 100)

    monkeypatch.setattr(fingerprinting, "_RACY_NS", 0)  # as if every file had been written long ago
    assert reads(work) == (first, 100)
    assert reads(work) == (first, 0)
    replace_with(work / "a" / "f3", b"xxx")  # same bytes, new inode: read once, same digest
    assert reads(work) == (first, 1)
    (work / "a" / "b" / "g7").write_bytes(b"z" * 7)  # in place, same size: the key's times differ
    changed, n = reads(work)
    assert n == 1 and changed != first
    assert reads(work) == (changed, 0)


def test_a_file_over_the_bound_counts_by_size_and_time(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    big = work / "big.bin"
    big.write_bytes(b"b" * 100)
    before, n = reads(work, max_file_bytes=64)
    assert n == 0
    assert reads(work, max_file_bytes=64) == (before, 0)
    st = big.stat()
    os.utime(big, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert reads(work, max_file_bytes=64)[0] != before


def test_a_fifo_is_never_opened(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    os.mkfifo(work / "notes.txt")  # opening it for reading without O_NONBLOCK would block
    fp, n = reads(work)
    assert fp is not None and n == 0
    (work / "notes.txt").unlink()
    (work / "notes.txt").write_text("")
    assert fingerprint(work) != fp  # a file is not a FIFO of the same name


def test_the_digest_cache_is_bounded() -> None:
    cache = fingerprinting._DigestCache(limit=5)
    key = (0, 0, 0, 0, 0)
    cache.put(b"/w1", {b"a": (key, b"1"), b"b": (key, b"2")})
    cache.put(b"/w2", {b"a": (key, b"1"), b"b": (key, b"2")})
    cache.put(b"/w3", {b"a": (key, b"1"), b"b": (key, b"2")})  # over: the least recent goes
    assert len(cache) == 4 and cache.take(b"/w1") == {}
    cache.put(b"/huge", {bytes([i]): (key, b"x") for i in range(6)})  # larger than the bound: kept nowhere
    assert len(cache) == 4 and cache.take(b"/huge") == {}


N = 2
CONFIG: dict[str, Any] = {"providers": {"gs": {"kind": "scripted", "script": "goal_scripts:models"}}}
ENDED = {"completed", "paused", "failed", "exhausted", "cancelled"}


@pytest.fixture
def var_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="goald-content-", dir="/var/tmp"))
    path.chmod(0o711)  # a root daemon's sandbox user passes through to the work directories here
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.needs_bwrap
async def test_rewriting_a_file_with_the_same_bytes_is_stalled_and_new_bytes_are_progress(var_tmp: Path) -> None:
    rounds = 2 * N + 1
    same = var_tmp / "state" / "work" / "same"  # under the default work-directory root
    same.mkdir(parents=True)
    (same / "notes.txt").write_text("the same draft\n")  # round 1 rewrites it as it is
    d = Daemon(var_tmp / "state", config=CONFIG)
    try:
        d.start()
        busy = await rpc(
            d.socket_path,
            "goal/create",
            {
                "objective": "Refine the notes.",
                "model": "gs:rewriter",
                "workdir": str(same),
                "stallRounds": N,
                "budgets": {"maxRounds": 20},
            },
        )
        working = await rpc(
            d.socket_path,
            "goal/create",
            {
                "objective": "Refine the notes. [change]",
                "model": "gs:rewriter",
                "stallRounds": N,
                "budgets": {"maxRounds": rounds},
            },
        )
        stalled = await wait_goal(d.socket_path, busy["goalId"], ENDED, 90)
        kept = await wait_goal(d.socket_path, working["goalId"], ENDED, 90)
    finally:
        d.close()

    assert stalled["status"] == "paused" and stalled["statusReason"] == "stalled", stalled
    assert stalled["rounds"] <= 2 * N + 1
    assert len(stalled["notes"]) == stalled["rounds"]  # a new note and a rewrite every round
    assert (same / "notes.txt").read_text() == "the same draft\n"
    assert (kept["status"], kept["statusReason"]) == ("exhausted", "round_limit"), kept["lastError"]
    assert kept["rounds"] == rounds and kept["stallStreak"] == 0
    workdir = Path(kept["workdir"])
    assert (workdir / "notes.txt").read_text() == f"draft {rounds}\n"
