"""Telling a storage failure apart from every other database error, and keeping the files private.

A storage failure (the disk full, an I/O error, a read-only file system, a file that cannot be
opened) is no fault of the statement: the same write succeeds once the condition clears. It is
reported as :class:`~agent.errors.StorageUnavailable` with a hint of what to do (so a caller can
wait and retry, and an operator knows what to fix); any other SQLite error is a bug or bad input
and stays what it is.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from loguru import logger

from agent.errors import StorageUnavailable


def owner_only(path: Path) -> None:
    """Make the database files readable by their owner only (or say so, if they are not ours)."""
    for name in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            if name.stat().st_mode & 0o077:
                name.chmod(0o600)
        except FileNotFoundError:
            pass
        except PermissionError:
            logger.warning("{} is readable by others and not ours to change (chmod 600 it)", name)


#: SQLite's primary result codes that mean the storage, not the statement, failed.
_STORAGE_CODES = {
    13: "the disk is full",  # SQLITE_FULL
    10: "an I/O error",  # SQLITE_IOERR
    8: "the database is read-only",  # SQLITE_READONLY
    14: "a database file cannot be opened",  # SQLITE_CANTOPEN
}


def storage_failure(exc: BaseException, path: Path) -> StorageUnavailable | None:
    """``exc`` as a :class:`StorageUnavailable` if it is a storage failure of the store at ``path``."""
    if isinstance(exc, StorageUnavailable):
        return exc
    if not isinstance(exc, sqlite3.Error):
        return None
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None or (code & 0xFF) not in _STORAGE_CODES:
        return None
    where = path.parent
    match code & 0xFF:
        case 13:
            hint = f"free space on the file system of {where}; goald continues by itself"
        case 8:
            hint = f"make {where} and the database files writable by goald; goald continues by itself"
        case _:
            hint = f"check the disk and file system of {where} (dmesg); goald retries by itself"
    return StorageUnavailable(str(exc), hint)
