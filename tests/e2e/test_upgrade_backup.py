"""Upgrades and backups with real daemon processes.

The "previous version" store is generated here, not shipped: every package's migrations but its
newest (``migrations[:-1]`` of each entry of :data:`daemon.backup.SCHEMAS`) applied to a fresh file,
with a few rows written the way that schema holds them. A real ``goald serve`` then upgrades it:
a copy named after the old versions is taken into ``<state_dir>/backups`` first, the rows survive,
and every package reaches its newest version. A step forced to fail (a broken migration appended to
``SCHEMAS`` in the child process, after the real pending steps) leaves the database file byte for
byte as it was and the daemon refuses to start, exit 78, with one line that names the step.

``goald store backup PATH`` is shown online (the daemon serving, through ``store/backup``) and
offline (no daemon: the CLI copies under the state lock); an existing PATH is refused, unchanged.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

from harness import Daemon, child_env, rpc, toml_text

from agent.migrate import apply_migrations, stored_versions
from daemon.backup import SCHEMAS

SESSION = "ses_01JZZZZZZZZZZZZZZZZZZZZZZZ"


def newest() -> dict[str, int]:
    return {package: max(m.version for m in migrations) for package, migrations in SCHEMAS}


def previous() -> dict[str, int]:
    return {p: max((m.version for m in migs[:-1]), default=0) for p, migs in SCHEMAS if len(migs) > 1}


def write_previous_version(db: Path) -> None:
    """A store as the previous goald left it: each package one migration behind, with a session
    and its events, closed cleanly (WAL checkpointed into the file)."""
    conn = sqlite3.connect(str(db), isolation_level=None)
    conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("BEGIN IMMEDIATE")
    for package, migrations in SCHEMAS:
        if len(migrations) > 1:
            apply_migrations(conn, package, migrations[:-1])
    conn.execute("INSERT INTO sessions(id, created_at) VALUES (?, '2026-01-01T00:00:00+00:00')", (SESSION,))
    for seq, (kind, data) in enumerate(
        [("status", {"status": "idle"}), ("note", {"text": "written by the previous version"})], start=1
    ):
        conn.execute(
            "INSERT INTO events(session_id, seq, type, data, at) VALUES (?,?,?,?, '2026-01-01T00:00:00+00:00')",
            (SESSION, seq, kind, json.dumps(data)),
        )
    conn.execute("COMMIT")
    conn.close()
    assert not db.with_name(db.name + "-wal").exists()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_fixture_is_one_version_behind(tmp_path: Path) -> None:
    db = tmp_path / "goald.db"
    write_previous_version(db)
    with sqlite3.connect(db) as conn:
        assert stored_versions(conn) == previous()
    assert previous() != {k: v for k, v in newest().items() if k in previous()}, "no package has a step to apply"


async def test_a_previous_version_store_is_copied_then_upgraded_by_the_daemon(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    db = state / "goald.db"
    write_previous_version(db)
    before = digest(db)
    daemon = Daemon(state)
    try:
        daemon.start()
        backups = list((state / "backups").iterdir())
        assert len(backups) == 1, backups
        copy = backups[0]
        # Named after the versions it holds, and it holds exactly the old store.
        held = ".".join(f"{p}-{v}" for p, v in sorted(previous().items()))
        assert copy.name.startswith(f"goald.db.{held}.") and copy.name.endswith(".bak"), copy.name
        assert copy.stat().st_mode & 0o077 == 0
        with sqlite3.connect(copy) as conn:
            assert stored_versions(conn) == previous()
            assert conn.execute("SELECT COUNT(*) FROM events WHERE session_id=?", (SESSION,)).fetchone()[0] == 2
        page = await rpc(daemon.socket_path, "session/events", {"sessionId": SESSION, "afterSeq": 0})
        assert [e["data"].get("text") for e in page["events"]][-1] == "written by the previous version"
        assert daemon.terminate() == 0
    finally:
        daemon.close()
    assert digest(db) != before
    with sqlite3.connect(db) as conn:
        assert stored_versions(conn) == newest()
    # Up to date now: the next start takes no copy.
    again = Daemon(state)
    try:
        again.start()
        assert again.terminate() == 0
    finally:
        again.close()
    assert len(list((state / "backups").iterdir())) == 1


#: Runs ``goald serve`` with one more, broken, migration after every real one (a package of its own,
#: so the real pending steps come first in the one transaction and must be rolled back too).
BROKEN_CHILD = """
import sys
from agent.schema import Migration
from daemon import backup
backup.SCHEMAS.append(("broken", [Migration(version=1, summary="a step that fails half way",
    sql="CREATE TABLE half_done (x INTEGER); INSERT INTO no_such_table VALUES (1);")]))
from daemon.cli.main import main
sys.exit(main(["--config", sys.argv[1], "serve"]))
"""


def test_a_failed_migration_leaves_the_file_byte_identical_and_the_daemon_refuses_to_start(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    db = state / "goald.db"
    write_previous_version(db)
    before = digest(db)
    config = state / "goald.toml"
    config.write_text(toml_text({"state_dir": str(state), "log_level": "WARNING"}))
    done = subprocess.run(
        [sys.executable, "-c", BROKEN_CHILD, str(config)],
        env=child_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 78, done.stderr
    line = [ln for ln in done.stderr.splitlines() if ln.startswith("goald:")]
    assert len(line) == 1, done.stderr
    assert "refusing to start" in line[0] and "broken version 1" in line[0] and "no_such_table" in line[0]
    assert "nothing was changed" in line[0]
    assert digest(db) == before
    with sqlite3.connect(db) as conn:
        assert stored_versions(conn) == previous()
        assert conn.execute("SELECT name FROM sqlite_master WHERE name='half_done'").fetchone() is None
    (copy,) = (state / "backups").iterdir()
    assert str(copy) in line[0]
    assert not (state / "goald.sock").exists()


def test_store_backup_online_and_offline(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path / "state")
    try:
        daemon.start()
        added = daemon.cli_json("goal", "add", "keep the copy", "--max-rounds", "1")
        online = tmp_path / "online.db"
        done = daemon.cli("store", "backup", str(online))
        assert done.returncode == 0, done.stderr
        assert "online" in done.stdout
        with sqlite3.connect(online) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            assert stored_versions(conn) == newest()
        assert added["goalId"] in online.read_bytes().decode("latin-1")
        # A backup never overwrites: refused with the reason, the file untouched.
        kept = digest(online)
        refused = daemon.cli("store", "backup", str(online))
        assert refused.returncode != 0 and "exists" in refused.stderr
        assert digest(online) == kept
        assert daemon.terminate() == 0
        offline = tmp_path / "offline.db"
        done = daemon.cli("store", "backup", str(offline))
        assert done.returncode == 0, done.stderr
        assert "offline" in done.stdout
        with sqlite3.connect(offline) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert added["goalId"] in offline.read_bytes().decode("latin-1")
        missing_dir = daemon.cli("store", "backup", str(tmp_path / "no" / "such" / "dir.db"))
        assert missing_dir.returncode != 0 and "not a directory" in missing_dir.stderr
    finally:
        daemon.close()
