"""``goald store restore``: a live daemon's backup restored into a new state directory, with real
daemon processes.

A daemon with a schedule, a completed goal, a goal held in a model call mid-round and notifications
waiting in the outbox (its sink's port is closed) is backed up online, then stopped. The backup is
restored into a new state directory: refused while a daemon holds it (exit 75) and over an existing
database without ``--replace``; ``PRAGMA integrity_check`` answers ``ok``; every table of the
restored file holds exactly the backup's rows (goals, schedules, their counters, the outbox). A
daemon started on it shows the same goals and schedules, and the goal that was active at the
backup continues to completion.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

from harness import TEST_MODELS, Daemon, toml_text, wait_goal

LIMIT = 60.0
SINK = '[[notify.sinks]]\ntype = "webhook"\nname = "ops"\nurl = "http://127.0.0.1:9/ops"\n'


def make(tmp_path: Path, name: str) -> Daemon:
    """A daemon on ``tmp_path / name`` (not started): the test models, one work root for both
    state directories (a restored goal keeps its work directory), a sink nobody answers."""
    d = Daemon(tmp_path / name)
    config = {
        "state_dir": str(d.state_dir),
        "log_level": "DEBUG",
        "shutdown_grace_seconds": 0.5,
        "workdir_roots": [str(tmp_path / "work")],
        **TEST_MODELS,
        "notify": {"retry_first_seconds": 3600, "retry_max_seconds": 3600, "max_attempts": 10_000},
    }
    d.config_path.write_text(toml_text(config) + SINK)
    return d


def rows(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every table's rows, in rowid order (read-only)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: conn.execute(f'SELECT * FROM "{t}" ORDER BY rowid').fetchall() for t in tables}
    finally:
        conn.close()


def at_rest(goals: list[dict[str, Any]]) -> dict[str, tuple[Any, ...]]:
    return {g["id"]: (g["status"], g["rounds"], g["tokens"], g["cost"]) for g in goals}


async def test_a_backup_of_a_live_daemon_restored_into_a_new_state_directory(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    old, new = make(tmp_path, "old"), make(tmp_path, "new")
    try:
        old.start()
        schedule = await old.acli_json("schedule", "add", "nightly [rounds=1]", "--every", "86400", "--key", "nightly")
        done = await old.acli_json("goal", "add", "one round [rounds=1]", "--model", "test:worker")
        await wait_goal(old.socket_path, done["goalId"], {"completed"}, LIMIT)
        add = ["goal", "add", "Write three rounds [rounds=3 delay=0.05 hold_round=2 hold=60]", "--model", "test:worker"]
        live = await old.acli_json(*add, "--verify", "test -f round3.txt")
        # Round 2's first model call takes a minute: the backup is taken with the goal mid-round.
        await asyncio.to_thread(old.calls.wait, "worker round=2 step=0", LIMIT)
        backup = tmp_path / "backup.db"
        code, out, err = await old.acli("store", "backup", str(backup))
        assert code == 0 and "online" in out, err
        goals_then = at_rest(await old.acli_json("goal", "list"))
        schedules_then = await old.acli_json("schedule", "list")
        assert goals_then[live["goalId"]][0] == "active"
        assert await asyncio.to_thread(old.terminate) == 0

        saved = rows(backup)
        assert saved["outbox"] and saved["outbox_deliveries"], "notifications were waiting at the backup"

        # Refused while a daemon holds the state directory it would restore into.
        old.start()
        code, _, err = await old.acli("store", "restore", str(backup))
        assert code == 75 and "stop the daemon first" in err
        assert await asyncio.to_thread(old.terminate) == 0

        code, out, err = await new.acli("store", "restore", str(backup))
        assert code == 0, err
        assert "integrity_check: ok" in out
        database = new.state_dir / "goald.db"
        with sqlite3.connect(database) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert rows(database) == saved
        # Over an existing database only with --replace, which sets the old file aside.
        code, _, err = await new.acli("store", "restore", str(backup))
        assert code == 1 and "--replace" in err
        assert rows(database) == saved

        new.start()
        goals_now = at_rest(await new.acli_json("goal", "list"))
        assert goals_now[done["goalId"]] == goals_then[done["goalId"]]
        assert set(goals_now) == set(goals_then)
        restored_schedules = await new.acli_json("schedule", "list")
        assert [s["id"] for s in restored_schedules] == [s["id"] for s in schedules_then] == [schedule["id"]]
        # The goal active at the backup continues, in the new state directory's daemon.
        final = await wait_goal(new.socket_path, live["goalId"], {"completed", "failed", "paused", "exhausted"}, LIMIT)
        assert (final["status"], final["statusReason"]) == ("completed", "verified"), json.dumps(final)
        assert final["rounds"] == 3
    finally:
        old.close()
        new.close()
