"""A full disk under the state directory, end to end: the real daemon process on a small tmpfs.

The test mounts a tmpfs of a few MiB as the state directory (it needs root; it skips cleanly
otherwise), runs a goal whose rounds keep writing events, and fills the file system with a filler
file mid-goal. Pins: the daemon stays up; ``daemon/health`` names the storage error and what to
do; a ``session/prompt`` while full is refused with -32006 (storage unavailable) and changes
nothing; the database passes ``PRAGMA integrity_check``; once the filler is deleted the goal
advances again by itself (no command) and the health clears.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from clusterkit import until
from diskkit import fill, mounted_tmpfs
from harness import TEST_MODELS, Daemon, rpc

from daemon.client import RpcError

LIMIT = 60.0


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs mounted for the test (skips unless root and mount works); unmounted after."""
    with mounted_tmpfs(tmp_path / "small", 4, "0700") as mount:
        yield mount


async def test_a_full_disk_holds_the_goal_refuses_input_and_clears_by_itself(small_tmpfs: Path, tmp_path: Path) -> None:
    state = small_tmpfs / "state"
    work = tmp_path / "work"
    # The store's own behaviour on a full disk: without the watermark (the 4 MiB disk is always under
    # the default) and the reserve, which test_disk_attack.py pins.
    storage = {"min_free_mb": 0, "reserve_mb": 0}
    d = Daemon(state, config={**TEST_MODELS, "workdir_roots": [str(work)], "storage": storage})
    d.stderr_path = tmp_path / "stderr.log"  # the log must not share the full file system
    filler = small_tmpfs / "filler"
    try:
        d.start()
        sock = d.socket_path
        goal = await rpc(
            sock, "goal/create", {"objective": "Write rounds. [rounds=100000 delay=0.02]", "model": "test:worker"}
        )
        gid = goal["goalId"]

        async def rounds() -> int:
            return int((await rpc(sock, "goal/get", {"goalId": gid}))["rounds"])

        await until(lambda: _at_least(rounds, 3), "three rounds")
        fill(filler)

        async def storage_error() -> dict[str, Any] | None:
            storage = (await rpc(sock, "daemon/health"))["storage"]
            return None if storage["ok"] else storage

        storage = await until(storage_error, "the storage error in daemon/health")
        assert "full" in storage["error"]
        assert "free space" in storage["hint"] and "continues by itself" in storage["hint"]
        assert d.proc is not None and d.proc.poll() is None  # the daemon is up

        # New input while full is refused, clearly, and changes nothing.
        before = await rpc(sock, "agent/status", {"sessionId": goal["sessionId"]})
        with pytest.raises(RpcError) as refused:
            await rpc(sock, "session/prompt", {"sessionId": goal["sessionId"], "text": "a person's follow-up"})
        assert refused.value.code == -32006
        assert "storage unavailable" in refused.value.message and "full" in refused.value.message
        after = await rpc(sock, "agent/status", {"sessionId": goal["sessionId"]})
        assert after["lastSeq"] == before["lastSeq"]
        # The goal holds while full.
        held = await rounds()

        with contextlib.closing(sqlite3.connect(f"file:{state / 'goald.db'}?mode=ro", uri=True)) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]

        filler.unlink()
        await until(lambda: _at_least(rounds, held + 2), "the goal advancing again by itself")
        assert (await rpc(sock, "daemon/health"))["storage"] == {"ok": True}
        assert d.proc.poll() is None
        log = d.stderr()
        assert log.count("the store cannot write") == 1, log
        assert "the store writes again" in log
    finally:
        d.close()


async def _at_least(count: Callable[[], Awaitable[int]], n: int) -> bool:
    return await count() >= n
