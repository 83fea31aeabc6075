"""Telling a storage failure apart from every other database error, and keeping the files private.

A storage failure (the disk full, an I/O error, a read-only file system, a file that cannot be
opened) is no fault of the statement: the same write succeeds once the condition clears. It is
reported as :class:`~agent.errors.StorageUnavailable` with a hint of what to do (so a caller can
wait and retry, and an operator knows what to fix); any other SQLite error is a bug or bad input
and stays what it is.

A disk filled by something else (a goal's command writing into a work directory on the same file
system) would leave the store unable to record even that: :class:`StoreReserve` is a file of real
blocks beside the database that the store gives back when a write meets a full disk
(:func:`is_disk_full`), then tries the write once more; the daemon makes it again once space is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

from loguru import logger

from agent.errors import StorageUnavailable
from agent.tx import utcnow


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


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's "database or disk is full" (``SQLITE_FULL``)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.Error) and code is not None and code & 0xFF == 13


class StoreReserve:
    """A file of ``size`` bytes of real blocks at ``path``, given back to the file system when the
    store meets a full disk (:meth:`release`), made again when there is room (:meth:`make`).

    Thread-safe enough for its use: the store thread releases it, the daemon's watcher makes it, and
    both are single system calls on the path (a rename puts a made reserve in place whole).
    """

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size

    def present(self) -> bool:
        """Whether the reserve is in place."""
        return self.path.is_file()

    def make(self) -> bool:
        """Allocate the reserve (real blocks: ``posix_fallocate``); ``False`` if the disk has no room."""
        tmp = self.path.with_name(self.path.name + ".new")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.size)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            logger.debug("the store's reserve {} cannot be made now: {}", self.path, exc.strerror)
            return False
        return True

    def release_for(self, exc: BaseException, location: str) -> bool:
        """Whether ``exc`` is the store's disk full and the reserve's blocks were given back (logged),
        so that the write that met it is tried once more: whatever filled the disk, that write (a
        command's result, the failure itself) is recorded. Made again when there is room."""
        if not is_disk_full(exc) or not self.release():
            return False
        logger.warning(
            "the disk of the store is full ({}): its reserve ({}) was released for this write;"
            " free space on it (goald makes the reserve again when there is room)",
            location,
            self.path,
        )
        return True

    def release(self) -> bool:
        """Give the reserve's blocks back; ``True`` if there was one to give."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        except OSError as exc:
            logger.error("the store's reserve {} cannot be released: {}", self.path, exc.strerror)
            return False
        return True


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


class StorageHealth:
    """Whether the store writes, as its writes and reads find it: the failure that stops them (with
    when it began) or none. Changed on the store's thread; :meth:`wait_writable` waits on the loop.

    An outage is expected and handled (writes wait, new input is refused, it clears by itself): one
    warning when it begins, one info line when it ends, no traceback.
    """

    def __init__(self, location: str) -> None:
        self.location = location
        #: The storage failure that stopped the last write (``None``: writable), and when it began.
        self.failure: StorageUnavailable | None = None
        self.since: str | None = None
        self._loop = asyncio.get_running_loop()
        self._writable = asyncio.Event()
        self._writable.set()
        self._lock = threading.Lock()  # a PostgreSQL store's threads report at once

    def failed(self, failure: StorageUnavailable) -> None:
        """A write (or, on PostgreSQL, a read) met ``failure`` (on a store thread)."""
        with self._lock:
            self._failed(failure)

    def _failed(self, failure: StorageUnavailable) -> None:
        if self.failure is None:
            logger.warning("the store cannot write: {} ({}); {}", failure.message, self.location, failure.hint)
        elif self.failure.message != failure.message:
            logger.debug("the store still cannot write: {}", failure.message)
        if self.failure is None:
            self.since = utcnow()
            self._loop.call_soon_threadsafe(self._writable.clear)
        self.failure = failure

    def recovered(self) -> None:
        """A write committed (or the database answered) after a failure (on a store thread)."""
        with self._lock:
            if self.failure is None:
                return  # another of the store's threads saw it first
            self._recovered()

    def _recovered(self) -> None:
        logger.info("the store writes again (it could not since {}: {})", self.since, self.failure)
        self.failure, self.since = None, None
        self._loop.call_soon_threadsafe(self._writable.set)

    def report(self) -> dict[str, Any]:
        """``{"ok": True}``, or the failure that stops writes: ``error``, ``hint`` and ``since``."""
        failure, since = self.failure, self.since
        if failure is None:
            return {"ok": True}
        return {"ok": False, "error": failure.message, "hint": failure.hint, "since": since}

    async def wait_writable(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for a write to succeed after a storage failure; ``True`` if the
        store writes (again)."""
        if self._writable.is_set():
            await asyncio.sleep(0)
            return True
        try:
            async with asyncio.timeout(seconds):
                await self._writable.wait()
        except TimeoutError:
            return False
        return True
