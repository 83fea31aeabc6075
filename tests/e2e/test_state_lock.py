"""One daemon per state directory, and the modes of what the daemon creates, with real processes.

A live daemon is caught mid-turn (a model call of ``test:worker`` in flight, so its session has an
open turn that crash repair would end "interrupted"); a second ``goald serve`` on the same state
directory, with the same or another socket path, must exit 75 at once naming the holder's PID and
write nothing: no event, no socket, the first daemon still serving, the database intact. After
``kill -9`` of the holder the lock is the kernel's to release, so the next start succeeds although
the lock file still names the dead PID. ``goald run`` and ``goald demo`` take the same lock.

The daemon runs under the test's umask (typically 022) and must still create its database, WAL,
SHM, lock and socket 0600, and its work directories 0700 (it sets umask 077 itself).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from harness import Daemon, child_env, goald_argv, rpc, wait_goal

LIMIT = 60.0
#: A start refused by the lock does nothing else: it must not take long even on a loaded machine.
AT_ONCE = 10.0


def read_only(db: Path) -> sqlite3.Connection:
    """A read-only connection to a live daemon's database."""
    return sqlite3.connect(f"file:{db}?mode=ro", uri=True)


def store_facts(db: Path) -> tuple[int, int, int]:
    """(events, highest event rowid, turns ended ``interrupted``) in the database."""
    with contextlib.closing(read_only(db)) as conn:
        count, top = conn.execute("SELECT COUNT(*), COALESCE(MAX(rowid), 0) FROM events").fetchone()
        (interrupted,) = conn.execute(
            "SELECT COUNT(*) FROM events WHERE type='turn/end' AND data LIKE '%interrupted%'"
        ).fetchone()
    return int(count), int(top), int(interrupted)


def integrity(db: Path) -> str:
    with contextlib.closing(read_only(db)) as conn:
        (result,) = conn.execute("PRAGMA integrity_check").fetchone()
    return str(result)


def mid_turn(d: Daemon) -> str:
    """A goal whose round 2 model call is in flight (for a minute): its session has an open turn."""
    goal = d.cli_json("goal", "add", "--model", "test:worker", "Mid-turn work [rounds=3 delay=0 hold_round=2 hold=60]")
    d.calls.wait("worker round=2 step=0", LIMIT)
    return str(goal["goalId"])


def goald(config: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """``goald --config CONFIG ARGS`` to completion, and how long it took."""
    began = time.monotonic()
    done = subprocess.run(
        [*goald_argv(), "--config", str(config), *args],
        env=child_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=LIMIT,
    )
    return done, time.monotonic() - began


@pytest.mark.parametrize("socket_path", ["same", "other"])
async def test_a_second_serve_on_one_state_directory_exits_75_naming_the_holder_and_writes_nothing(
    start_daemon: Callable[..., Daemon], tmp_path: Path, socket_path: str
) -> None:
    d = start_daemon()
    assert d.proc is not None
    goal_id = mid_turn(d)
    db = d.state_dir / "goald.db"
    config = d.config_path
    other = tmp_path / "other.sock"
    if socket_path == "other":
        config = tmp_path / "other.toml"
        config.write_text(d.config_path.read_text().replace("[providers", f'socket = "{other}"\n[providers', 1))
    before = store_facts(db)
    listing = sorted(p.name for p in d.state_dir.iterdir())

    done, took = goald(config, "serve")

    assert done.returncode == 75, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"pid {d.proc.pid}" in lines[0] and str(d.state_dir) in lines[0], done.stderr
    assert done.stdout == ""
    assert took < AT_ONCE
    assert store_facts(db) == before  # no event written: no crash repair of the live session
    assert before[2] == 0
    assert sorted(p.name for p in d.state_dir.iterdir()) == listing
    assert not other.exists()
    assert integrity(db) == "ok"
    # The first daemon keeps serving, and its goal is still mid-round with its turn open.
    assert d.proc.poll() is None
    health = await rpc(d.socket_path, "daemon/health")
    assert health["status"] == "serving"
    goal = await rpc(d.socket_path, "goal/get", {"goalId": goal_id})
    assert goal["status"] == "active"
    assert (await rpc(d.socket_path, "agent/status", {"sessionId": goal["sessionId"]}))["status"] == "running"

    # kill -9 of the holder: the kernel releases its lock; the file still names the dead PID.
    dead = d.proc.pid
    d.kill()
    assert (d.state_dir / "goald.lock").read_text().strip() == str(dead)
    d.start()  # READY=1 or raise
    assert d.proc.pid != dead
    assert (d.state_dir / "goald.lock").read_text().strip() == str(d.proc.pid)
    assert (await rpc(d.socket_path, "daemon/health"))["status"] == "serving"
    assert integrity(db) == "ok"


async def test_goald_run_and_goald_demo_take_the_same_lock(start_daemon: Callable[..., Daemon]) -> None:
    d = start_daemon()
    assert d.proc is not None
    before = store_facts(d.state_dir / "goald.db")
    for args in (["run", "--state-dir", str(d.state_dir), "--model", "scripted:echo", "hi"],
                 ["demo", "--state-dir", str(d.state_dir), "--plain"]):  # fmt: skip
        done, took = goald(d.config_path, *args)
        assert done.returncode == 75, (args, done.stderr)
        assert f"pid {d.proc.pid}" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert took < AT_ONCE
    assert store_facts(d.state_dir / "goald.db") == before
    assert (await rpc(d.socket_path, "daemon/health"))["status"] == "serving"


def test_the_lock_descriptor_is_not_inherited_by_children(start_daemon: Callable[..., Daemon]) -> None:
    d = start_daemon()
    assert d.proc is not None
    fds = Path(f"/proc/{d.proc.pid}/fd")
    (lock_fd,) = [fd.name for fd in fds.iterdir() if os.readlink(fd) == str(d.state_dir / "goald.lock")]
    flags = next(
        line.split()[1] for line in Path(f"/proc/{d.proc.pid}/fdinfo/{lock_fd}").read_text().splitlines()
        if line.startswith("flags:")
    )  # fmt: skip
    assert int(flags, 8) & os.O_CLOEXEC


async def test_the_daemon_creates_its_files_0600_and_work_directories_0700(
    start_daemon: Callable[..., Daemon],
) -> None:
    old = os.umask(0o022)  # what a shell outside systemd gives; the daemon must not depend on it
    try:
        d = start_daemon()
    finally:
        os.umask(old)
    goal = d.cli_json("goal", "add", "--model", "test:worker", "Write files [rounds=1 delay=0]")
    await wait_goal(d.socket_path, goal["goalId"], {"completed"}, LIMIT)
    modes = created_modes(d.state_dir)
    assert modes["files"] == dict.fromkeys(modes["files"], "0o600")
    # A root daemon's work-directory root lets its sandbox user through (0710, that user's group)
    # and nobody else; everything else is 0700.
    passage = {str(d.state_dir / "work")} if os.geteuid() == 0 else set()
    assert modes["dirs"] == {p: "0o710" if p in passage else "0o700" for p in modes["dirs"]}
    assert modes["written"] and all(int(m, 8) & 0o077 == 0 for m in modes["written"].values()), modes


def created_modes(state_dir: Path) -> dict[str, dict[str, str]]:
    """The modes of what the daemon made: its files, its work directories, what the model wrote."""

    def mode(path: Path) -> str:
        return oct(stat.S_IMODE(path.lstat().st_mode))

    names = ("goald.db", "goald.db-wal", "goald.db-shm", "goald.lock", "goald.db.lock", "goald.sock")
    files = [state_dir / name for name in names]
    work = state_dir / "work"
    dirs = [work, *(p for p in work.iterdir() if p.is_dir())]
    assert len(dirs) == 2, dirs  # the root and the goal's work directory
    return {
        "files": {p.name: mode(p) for p in files},
        "dirs": {str(p): mode(p) for p in dirs},
        "written": {p.name: mode(p) for p in dirs[1].iterdir()},
    }
