"""The daemon's own reads of a work directory, end to end: a real ``goald serve`` process (issue 24,
"the daemon's own reads are bounded").

* A goal whose work directory holds 1,000 sparse 64 MiB files (62.5 GiB apparent, nothing on disk:
  the attack of the issue) is decided at its first idle on a whole fingerprint: its round 2
  continuation is queued and no bound applied (reading the apparent size would hit the 256 MiB byte
  bound and say so in a ``goal/fingerprint`` event; the time bound is put off so that load cannot
  cut the walk). Counted, not timed: the time from the idle to the decision is printed.
* SIGTERM while a walk of the work directory runs: the daemon exits 0 without waiting for the walk,
  and the walk's idle decides nothing (no round 2 continuation: a walk left to finish would have
  let the stopping engine decide it; that is the proof, and the exit's time is only printed). To
  be sure a walk runs when the signal comes, the test makes one long on purpose (1 GiB of real
  content written during round 1, the byte and time bounds raised) and waits until the daemon
  holds one of those files open.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from harness import TEST_MODELS, Daemon, rpc, wait_events

MIB = 1024 * 1024


def sparse_tree(work: Path, count: int = 1000, size: int = 64 * MIB) -> None:
    work.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        with open(work / f"sparse{i:04d}.bin", "wb") as fh:
            os.truncate(fh.fileno(), size)


def dense_files(work: Path, count: int, size: int = 64 * MIB) -> None:
    """``count`` files of ``size`` bytes of real content."""
    block = b"d" * MIB
    for i in range(count):
        with open(work / f"dense{i:02d}.bin", "wb") as fh:
            for _ in range(size // MIB):
                fh.write(block)


def _at(event: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(event["at"])


def _idle_after_a_turn(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    ended = next((e["seq"] for e in events if e["type"] == "turn/end"), None)
    if ended is None:
        return None
    return next(
        (e for e in events if e["seq"] > ended and e["type"] == "status" and e["data"]["status"] == "idle"), None
    )


def _round_queued(events: list[dict[str, Any]], goal_id: str, round_no: int) -> dict[str, Any] | None:
    ref = f"{goal_id}#{round_no}"
    return next(
        (e for e in events if e["type"] == "message/queued" and (e["data"].get("source") or {}).get("ref") == ref),
        None,
    )


async def test_a_goal_over_a_thousand_sparse_files_decides_on_a_whole_fingerprint(tmp_path: Path) -> None:
    state = tmp_path / "state"
    work = state / "work" / "sparse"
    sparse_tree(work)
    d = Daemon(state, config={**TEST_MODELS, "fingerprint_max_seconds": 600.0})
    try:
        d.start()
        goal = await rpc(
            d.socket_path,
            "goal/create",
            {"objective": "Write rounds. [rounds=3]", "model": "test:worker", "workdir": str(work)},
        )
        gid, sid = goal["goalId"], goal["sessionId"]
        events = await wait_events(d, sid, lambda ev: _round_queued(ev, gid, 2) is not None, limit=30)
    finally:
        d.close()
    queued = _round_queued(events, gid, 2)
    assert queued is not None
    idle = max((e for e in events if e["seq"] < queued["seq"] and e["type"] == "status"), key=lambda e: e["seq"])
    assert idle["data"]["status"] == "idle"
    assert not [e for e in events if e["type"] == "goal/fingerprint"]  # no bound applied
    took = (_at(queued) - _at(idle)).total_seconds()
    print(f"decided {took:.3f}s after round 1's idle")


def _holds_open(pid: int, directory: Path) -> bool:
    """Whether process ``pid`` has a file under ``directory`` open (the fingerprint reading it)."""
    fds = Path(f"/proc/{pid}/fd")
    try:
        names = os.listdir(fds)
    except OSError:
        return False
    for name in names:
        try:
            if os.readlink(fds / name).startswith(str(directory) + "/dense"):
                return True
        except OSError:
            continue
    return False


async def test_sigterm_while_a_walk_runs_exits_without_waiting_for_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    work = state / "work" / "big"
    sparse_tree(work)
    # Bounds raised so that the walk at round 1's idle surely runs for seconds (1 GiB to hash).
    config = {**TEST_MODELS, "fingerprint_max_bytes": 64 * 1024 * MIB, "fingerprint_max_seconds": 600.0}
    d = Daemon(state, config=config)
    try:
        d.start()
        assert d.proc is not None
        pid = d.proc.pid
        goal = await rpc(
            d.socket_path,
            "goal/create",
            {
                "objective": "Write rounds. [rounds=3 hold_round=1 hold=4]",
                "model": "test:worker",
                "workdir": str(work),
            },
        )
        gid, sid = goal["goalId"], goal["sessionId"]
        # Round 1's first model call holds 4 s: meanwhile 1 GiB of real content lands in the work
        # directory, new to the walk at the round's idle (the creation's walk did not see it).
        await asyncio.to_thread(d.calls.wait, "worker round=1 step=0", 30)
        await asyncio.to_thread(dense_files, work, 16)
        await wait_events(d, sid, lambda ev: _idle_after_a_turn(ev) is not None, limit=60)
        deadline = time.monotonic() + 30
        while not _holds_open(pid, work):
            assert time.monotonic() < deadline, "the daemon never read the work directory's content"
            await asyncio.sleep(0.01)
        signalled = time.monotonic()
        d.proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(d.proc.wait, 30)
        took = time.monotonic() - signalled
    finally:
        d.close()
    assert code == 0, d.stderr()
    print(f"exited {took:.3f}s after SIGTERM during a walk")
    # The walk's idle decided nothing: no round 2 (the next start decides it).
    with sqlite3.connect(state / "goald.db") as db:
        refs = [r[0] for r in db.execute("SELECT source_ref FROM inbox WHERE session_id=?", (sid,))]
    assert f"{gid}#1" in refs and f"{gid}#2" not in refs, refs
