"""Schema versions and migrations, backups with ``VACUUM INTO``, and the all-or-nothing upgrade.

Every package's tables are a list of :class:`~agent.schema.Migration` steps; ``schema_versions``
holds how far each package's steps went. :func:`apply_migrations` applies one package's pending
steps inside a transaction its caller opened (:meth:`agent.store.Store.migrate` opens one per
package); :func:`upgrade` is what a daemon runs before it opens the store: a ``VACUUM INTO`` copy
first, then every package's pending steps in **one** transaction, so a step that fails leaves the
file exactly as it was (SQLite's DDL is transactional, and in WAL mode nothing uncommitted ever
reaches the database file).
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from loguru import logger

from agent.errors import SchemaTooNew
from agent.schema import Migration, MigrationFailed


def utcnow() -> str:
    """Now, in UTC, as an ISO 8601 string with microseconds (as the store writes times)."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


_SCHEMA_VERSIONS = (
    "CREATE TABLE IF NOT EXISTS schema_versions (package TEXT NOT NULL, version INTEGER NOT NULL,"
    " summary TEXT NOT NULL, applied_at TEXT NOT NULL, PRIMARY KEY (package, version))"
)


def stored_versions(conn: sqlite3.Connection) -> dict[str, int]:
    """Each package's schema version in the database (empty for a database without any)."""
    exists = conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='schema_versions'").fetchone()
    if exists is None:
        return {}
    rows = conn.execute("SELECT package, MAX(version) FROM schema_versions GROUP BY package").fetchall()
    return {str(r[0]): int(r[1]) for r in rows}


def _known(package: str, migrations: Sequence[Migration], current: int) -> int:
    known = max((m.version for m in migrations), default=0)
    if current > known:
        raise SchemaTooNew(f"the database has {package} schema version {current}; this goald knows up to {known}")
    return known


def apply_migrations(conn: sqlite3.Connection, package: str, migrations: Sequence[Migration]) -> int:
    """Apply ``package``'s steps newer than the stored version inside the caller's open transaction;
    returns the version reached. A step that raises leaves it to the caller to roll back."""
    conn.execute(_SCHEMA_VERSIONS)
    row = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_versions WHERE package=?", (package,)).fetchone()
    current = int(row[0])
    _known(package, migrations, current)
    for m in sorted(migrations, key=lambda m: m.version):
        if m.version > current:
            _apply_one(conn, package, m)
            current = m.version
    return current


def _apply_one(conn: sqlite3.Connection, package: str, m: Migration) -> None:
    for statement in _split_sql(m.sql):
        conn.execute(statement)
    conn.execute(
        "INSERT INTO schema_versions(package, version, summary, applied_at) VALUES (?,?,?,?)",
        (package, m.version, m.summary, utcnow()),
    )
    logger.debug("migrated the {} schema to version {}: {}", package, m.version, m.summary)


def backup_into(conn: sqlite3.Connection, dest: Path) -> None:
    """Write a consistent copy of ``conn``'s database to ``dest`` with ``VACUUM INTO`` (outside any
    transaction; other connections keep writing meanwhile, the copy is of one snapshot).

    The copy is written beside ``dest`` under a temporary name and renamed into place, so ``dest``
    is either absent or whole; it is the owner's only (it holds every prompt). An existing ``dest``
    is refused (:class:`FileExistsError`): a backup never overwrites anything.
    """
    dest = Path(dest)
    if dest.exists():
        raise FileExistsError(f"{dest} exists; a backup does not overwrite a file")
    if not dest.parent.is_dir():
        raise FileNotFoundError(f"{dest.parent} is not a directory")
    partial = dest.with_name(f".{dest.name}.partial")
    partial.unlink(missing_ok=True)
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)  # created owner-only first: SQLite keeps the mode of a file it writes into
        conn.execute("VACUUM INTO ?", (str(partial),))
        os.replace(partial, dest)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


@dataclasses.dataclass(frozen=True)
class Upgrade:
    """What :func:`upgrade` did: the versions before and after, and where the copy taken first is."""

    before: dict[str, int]
    after: dict[str, int]
    backup: Path


def backup_name(path: Path, versions: dict[str, int], when: datetime | None = None) -> str:
    """The file name of the copy taken before an upgrade: the database's name, the versions it had
    and the time, e.g. ``goald.db.agent-2.goals-4.schedules-1.20260102T030405Z.bak``."""
    stamp = (when or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    held = ".".join(f"{p}-{v}" for p, v in sorted(versions.items())) or "empty"
    return f"{path.name}.{held}.{stamp}.bak"


def _order(plan: Sequence[tuple[str, Sequence[Migration]]], package: str) -> int:
    return next(i for i, (p, _) in enumerate(plan) if p == package)


def upgrade(path: Path, plan: Sequence[tuple[str, Sequence[Migration]]], backup_dir: Path) -> Upgrade | None:
    """Bring an existing database up to every package's newest schema, safely (before it is opened).

    When any step is pending: a copy is taken first with ``VACUUM INTO`` into ``backup_dir`` (named
    by :func:`backup_name` after the versions it holds), then every package's pending steps run in
    **one** transaction, so a step that fails rolls all of them back and the database file is left
    as it was. Returns ``None`` when there was nothing to do (no database yet, or up to date).

    Raises:
        SchemaTooNew: a newer goald wrote the database (nothing was changed, no copy taken).
        MigrationFailed: a step failed; the database is unchanged, the copy is named in it.
    """
    if not path.exists() or path.stat().st_size == 0:
        return None  # a new database: created at the newest schema, nothing to keep
    conn = sqlite3.connect(str(path), isolation_level=None)
    try:
        conn.execute("PRAGMA busy_timeout=5000")
        before = stored_versions(conn)
        pending = []
        for package, migrations in plan:
            current = before.get(package, 0)
            _known(package, migrations, current)
            pending += [(package, m) for m in migrations if m.version > current]
        if not pending:
            return None
        backup_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        backup = backup_dir / backup_name(path, before)
        backup_into(conn, backup)
        logger.info("copied {} to {} before upgrading its schema", path, backup)
        step = pending[0]
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(_SCHEMA_VERSIONS)
            for step in sorted(pending, key=lambda pm: (_order(plan, pm[0]), pm[1].version)):
                _apply_one(conn, *step)
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            conn.execute("ROLLBACK")
            package, m = step
            raise MigrationFailed(
                f"upgrading the database schema failed at {package} version {m.version} ({m.summary}): {exc};"
                f" nothing was changed (a copy taken before is at {backup})",
                package=package,
                version=m.version,
                backup=str(backup),
            ) from exc
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return Upgrade(before=before, after=stored_versions(conn), backup=backup)
    finally:
        conn.close()


def _split_sql(script: str) -> list[str]:
    # Split only where a statement is complete: a trigger body or a string literal holds ';' too.
    statements, pending = [], ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \t\r\n;"):
                statements.append(pending.strip())
            pending = ""
    if pending.strip(" \t\r\n;"):
        statements.append(pending.strip())
    return statements
