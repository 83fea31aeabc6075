"""The store's reserve (issue 24, "Disk"): a write that meets a full disk releases the reserve's blocks
and is tried once more, so it is recorded; with no reserve left the store reports the full disk as
before (StorageUnavailable). On a real tmpfs of a few MiB (needs root to mount; skips otherwise)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from diskkit import fill, mounted_tmpfs

from agent import StorageUnavailable, Tx
from agent.storage import StoreReserve, is_disk_full
from agent.store import Store

MIB = 1024 * 1024


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs (skips unless root and mount works)."""
    with mounted_tmpfs(tmp_path / "small", 8, "0700") as mount:
        yield mount


def insert(blob: bytes) -> Callable[[Tx], None]:
    def run(tx: Tx) -> None:
        tx.execute("CREATE TABLE IF NOT EXISTS blobs(data BLOB)")
        tx.execute("INSERT INTO blobs VALUES (?)", (blob,))

    return run


def test_a_reserve_is_real_blocks_and_released_once(tmp_path: Path) -> None:
    reserve = StoreReserve(tmp_path / "store.reserve", 2 * MIB)
    assert not reserve.present() and not reserve.release()
    assert reserve.make() and reserve.present()
    assert reserve.path.stat().st_blocks * 512 >= 2 * MIB  # allocated, not a sparse promise
    assert oct(reserve.path.stat().st_mode & 0o777) == "0o600"
    assert reserve.release() and not reserve.present() and not reserve.release()


async def test_a_write_that_meets_a_full_disk_is_recorded_with_the_reserve(small_tmpfs: Path) -> None:
    store = await Store.open(small_tmpfs / "goald.db")
    try:
        store.reserve = StoreReserve(small_tmpfs / "store.reserve", 2 * MIB)
        assert store.reserve.make()
        await store.transact(insert(b"first"))
        fill(small_tmpfs / "filler")

        await store.transact(insert(os.urandom(256 * 1024)))  # needs new pages: the reserve pays
        assert not store.reserve.present()
        assert store.storage_health() == {"ok": True}  # nothing failed, as far as anyone can tell

        fill(small_tmpfs / "filler2")  # and again, with no reserve left: the full disk, as before
        with pytest.raises(StorageUnavailable, match="full"):
            await store.transact(insert(os.urandom(1024 * 1024)))
        assert store.storage_health()["ok"] is False
        count = await store.read(lambda conn: conn.execute("SELECT count(*) FROM blobs").fetchone()[0])
        assert count == 2
    finally:
        await store.close()


def test_only_sqlites_full_error_counts_as_a_full_disk() -> None:
    import sqlite3

    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorcode = 13  # type: ignore[attr-defined]
    other = sqlite3.OperationalError("disk I/O error")
    other.sqlite_errorcode = 10  # type: ignore[attr-defined]
    assert is_disk_full(full) and not is_disk_full(other) and not is_disk_full(OSError(28, "No space"))
