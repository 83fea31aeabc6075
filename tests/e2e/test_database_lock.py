"""One daemon per database, wherever the database lies (real processes).

Two daemons with two state directories and one database (a ``database`` configured outside the
first's state directory, or the second naming the first's default database): the second ``goald
serve`` exits 75 at once with one line naming the holder's PID and the database, writes no event
(the first daemon's session, mid-turn, is not "repaired"), and makes no database, socket or
work directory of its own; the first keeps serving; after ``kill -9`` of the first, the second
starts on the shared database.
"""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from harness import TEST_MODELS, Daemon, child_env, goald_argv, rpc

LIMIT = 60.0
AT_ONCE = 10.0


def store_facts(db: Path) -> tuple[int, int, int]:
    """(events, highest event rowid, turns ended ``interrupted``) in the database."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        count, top = conn.execute("SELECT COUNT(*), COALESCE(MAX(rowid), 0) FROM events").fetchone()
        (interrupted,) = conn.execute(
            "SELECT COUNT(*) FROM events WHERE type='turn/end' AND data LIKE '%interrupted%'"
        ).fetchone()
        (check,) = conn.execute("PRAGMA integrity_check").fetchone()
    assert check == "ok"
    return int(count), int(top), int(interrupted)


def serve_to_exit(config: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    """``goald --config CONFIG serve`` to its exit, and how long it took."""
    began = time.monotonic()
    done = subprocess.run(
        [*goald_argv(), "--config", str(config), "serve"],
        env=child_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=LIMIT,
    )
    return done, time.monotonic() - began


@pytest.mark.parametrize("where", ["outside both state directories", "the first's default database"])
async def test_two_state_directories_on_one_database_the_second_exits_75(tmp_path: Path, where: str) -> None:
    if where == "outside both state directories":
        db = tmp_path / "shared" / "goald.db"
        first = Daemon(tmp_path / "a", config={**TEST_MODELS, "database": str(db)})
    else:
        db = tmp_path / "a" / "goald.db"
        first = Daemon(tmp_path / "a", config=dict(TEST_MODELS))
    second = Daemon(tmp_path / "b", config={**TEST_MODELS, "database": str(db)})
    try:
        first.start()
        assert first.proc is not None
        # A goal mid-turn: crash repair by a second daemon would end its open turn "interrupted".
        goal = first.cli_json("goal", "add", "--model", "test:worker", "Work [rounds=3 delay=0 hold_round=2 hold=60]")
        first.calls.wait("worker round=2 step=0", LIMIT)
        before = store_facts(db)

        done, took = serve_to_exit(second.config_path)

        assert done.returncode == 75, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and f"pid {first.proc.pid}" in lines[0] and str(db) in lines[0], done.stderr
        assert took < AT_ONCE
        assert store_facts(db) == before and before[2] == 0  # nothing written, nothing "repaired"
        made = {p.name for p in second.state_dir.iterdir()}
        assert not made & {"goald.db", "goald.db-wal", "goald.sock", "work"}, made
        assert first.proc.poll() is None
        assert (await rpc(first.socket_path, "daemon/health"))["status"] == "serving"
        got = await rpc(first.socket_path, "goal/get", {"goalId": goal["goalId"]})
        assert (await rpc(first.socket_path, "agent/status", {"sessionId": got["sessionId"]}))["status"] == "running"

        # kill -9 of the holder: the kernel releases both of its locks; the second now starts.
        first.kill()
        second.start()
        assert (await rpc(second.socket_path, "daemon/health"))["status"] == "serving"
        assert db.with_name(db.name + ".lock").read_text().strip() == str(second.proc.pid if second.proc else None)
    finally:
        second.close()
        first.close()
