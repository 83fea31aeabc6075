"""Backups of the store, and upgrades that cannot lose it.

**Backups** are ``VACUUM INTO`` copies (:func:`agent.store.backup_into`): one consistent snapshot,
taken while the daemon goes on writing (readers do not block the WAL writer), written under a
temporary name and renamed, so a backup file is either whole or absent. ``goald store backup PATH``
asks the daemon that holds the store (``store/backup``); with no daemon running it takes the state
directory's lock (:mod:`daemon.lock`) and copies the file itself, so no daemon can start and
migrate the database half way through. ``goald store restore BACKUP`` is the way back: offline
only (refused while a daemon holds the state directory), it copies the file into place and runs
``PRAGMA integrity_check`` on the result (:func:`restore_offline`).

**Upgrades**: before the store is opened, :func:`upgrade_store` compares every package's schema
version in the database with the migrations this goald ships (:data:`SCHEMAS`). If any step is
pending, a copy is taken first into ``<state_dir>/backups/`` (named after the versions it holds,
e.g. ``goald.db.agent-2.goals-4.schedules-1.20260102T030405Z.bak``), then all pending steps of all
packages run in **one** transaction. A step that fails rolls every step back: the database file
is byte for byte what it was (nothing committed reaches it, not even through the WAL), and the
daemon refuses to start with one line naming the step, the error and the copy (exit 78, which the
unit does not restart in a loop). Why one transaction rather than "restore the copy on failure":
SQLite's DDL is transactional, so the rollback is exact and needs no second file operation that
could itself fail; the copy is for the case the upgrade *succeeds* and the new version misbehaves.

A package that adds tables appends its ``(name, migrations)`` to :data:`SCHEMAS` so that its steps
are part of the one upgrade transaction (a package left out still migrates when it starts, in a
transaction of its own, but after the copy and outside the all-or-nothing step).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path

from agent.migrate import Upgrade, backup_into, upgrade
from agent.schema import MIGRATIONS as AGENT_MIGRATIONS
from agent.schema import Migration
from daemon.schedule.store import MIGRATIONS as SCHEDULE_MIGRATIONS
from daemon.settings import Settings
from goals.store import MIGRATIONS as GOAL_MIGRATIONS

#: Every package's migrations, in the order they apply (a package's tables may refer to those before).
SCHEMAS: list[tuple[str, Sequence[Migration]]] = [
    ("agent", AGENT_MIGRATIONS),
    ("goals", GOAL_MIGRATIONS),
    ("schedules", SCHEDULE_MIGRATIONS),
]


def backups_dir(settings: Settings) -> Path:
    """Where the copies taken before an upgrade go: ``<state_dir>/backups``."""
    return settings.state_dir.expanduser() / "backups"


async def upgrade_store(settings: Settings) -> Upgrade | None:
    """Upgrade the database's schema before it is opened (see the module docstring).

    Raises:
        MigrationFailed: a step failed; the database is unchanged.
        SchemaTooNew: a newer goald wrote the database; nothing was changed.
    """
    if settings.store is not None:
        # PostgreSQL: each package's steps run as the store opens, under the cluster-wide writer lock
        # (agent.backends); the copy before is the operator's pg_dump, not a file goald writes.
        return None
    return await asyncio.to_thread(upgrade, settings.database_path, SCHEMAS, backups_dir(settings))


def backup_offline(database: Path, dest: Path) -> int:
    """Copy ``database`` to ``dest`` with no daemon running (the caller holds the state lock);
    returns the copy's size in bytes.

    Raises:
        FileNotFoundError: there is no database (or ``dest``'s directory does not exist).
        FileExistsError: ``dest`` exists.
    """
    if not database.is_file():
        raise FileNotFoundError(f"no database at {database}")
    # Read-write, not ``mode=ro``: a WAL database left by a stopped daemon may need its WAL read back.
    conn = sqlite3.connect(str(database), isolation_level=None)
    try:
        conn.execute("PRAGMA busy_timeout=5000")
        backup_into(conn, dest)
    finally:
        conn.close()
    return dest.stat().st_size


def restore_offline(backup: Path, database: Path, *, replace: bool = False) -> str:
    """Copy the backup file ``backup`` to ``database`` with no daemon running (the caller holds the
    state lock), then run ``PRAGMA integrity_check`` on the restored file; returns its answer
    (``"ok"`` when whole).

    The copy is made with SQLite's online backup API into a temporary file beside ``database`` and
    renamed into place, so ``database`` is either the old file or the whole copy. An existing
    database is refused unless ``replace``; then it is renamed aside first
    (``<database>.before-restore``, with its WAL checkpointed into it), never deleted.

    Raises:
        FileNotFoundError: no backup file, or ``database``'s directory is missing.
        FileExistsError: ``database`` exists and ``replace`` is false (or the aside name is taken).
        sqlite3.DatabaseError: ``backup`` is not a SQLite database.
    """
    if not backup.is_file():
        raise FileNotFoundError(f"no backup file at {backup}")
    if database.exists() and not replace:
        raise FileExistsError(f"{database} exists; give --replace to set it aside and restore over it")
    database.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = database.with_name(f".{database.name}.restoring")
    partial.unlink(missing_ok=True)
    src = sqlite3.connect(f"file:{backup}?mode=ro", uri=True)
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)  # owner-only: the copy holds every prompt
        dst = sqlite3.connect(str(partial))
        try:
            src.backup(dst)
        finally:
            dst.close()
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        src.close()
    if database.exists():
        aside = database.with_name(database.name + ".before-restore")
        if aside.exists():
            partial.unlink(missing_ok=True)
            raise FileExistsError(f"{aside} exists (an earlier restore's); move it away first")
        old = sqlite3.connect(str(database), isolation_level=None)
        try:
            old.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            old.close()
        os.replace(database, aside)
    for suffix in ("-wal", "-shm", "-journal"):
        database.with_name(database.name + suffix).unlink(missing_ok=True)
    os.replace(partial, database)
    conn = sqlite3.connect(str(database))
    try:
        rows = [str(r[0]) for r in conn.execute("PRAGMA integrity_check")]
    finally:
        conn.close()
    return "; ".join(rows)
