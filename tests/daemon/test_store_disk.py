"""The disk holding the store (issue 24, "Disk"): the watermark in plain words, the reserve made
only with room for it above the watermark (and given back before the store opens on a disk with
less free than it), and ``goald config check`` warning when work directories share the state
directory's file system."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

import daemon.disk as disk
from daemon.config_check import config_findings
from daemon.disk import StoreDisk
from daemon.settings import StorageSettings, load_settings

MIB = 1024 * 1024


def fake_space(monkeypatch: pytest.MonkeyPatch, free: int, total: int = 1024 * MIB) -> None:
    def statvfs(path: object) -> SimpleNamespace:
        return SimpleNamespace(f_bavail=free // 4096, f_frsize=4096, f_blocks=total // 4096)

    monkeypatch.setattr(disk.os, "statvfs", statvfs)


@pytest.mark.parametrize(
    ("free_mb", "settings", "said"),
    [
        (120, StorageSettings(), "has 120 MiB free, under the 256 MiB watermark"),
        (300, StorageSettings(), None),
        (300, StorageSettings(min_free_percent=50), "has 300 MiB free, under the 512 MiB watermark"),
        (1, StorageSettings(min_free_mb=0), None),  # no watermark
    ],
)
def test_the_watermark_in_plain_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, free_mb: int, settings: StorageSettings, said: str | None
) -> None:
    fake_space(monkeypatch, free_mb * MIB)
    why = StoreDisk(tmp_path, settings).low()
    if said is None:
        assert why is None
    else:
        assert why == f"the disk holding goald's store ({tmp_path}) {said}"


def test_the_reserve_is_made_only_with_room_above_the_watermark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = StorageSettings(min_free_mb=8, reserve_mb=4)
    store_disk = StoreDisk(tmp_path, settings)
    assert store_disk.reserve is not None
    fake_space(monkeypatch, 10 * MIB)  # 8 + 4 needed
    store_disk.keep_reserve()
    assert not store_disk.reserve.present()
    fake_space(monkeypatch, 12 * MIB)
    store_disk.keep_reserve()
    assert store_disk.reserve.present() and (tmp_path / "store.reserve").stat().st_blocks * 512 >= 4 * MIB
    fake_space(monkeypatch, 1 * MIB)  # a disk with less free than the reserve: given back to open the store
    store_disk.before_open()
    assert not store_disk.reserve.present()
    assert StoreDisk(tmp_path, StorageSettings(reserve_mb=0)).reserve is None
    assert StoreDisk(tmp_path, settings, reserve=False).reserve is None  # PostgreSQL: none


def test_config_check_warns_when_work_directories_share_the_state_directorys_disk(tmp_path: Path) -> None:
    state, work = tmp_path / "state", tmp_path / "work"
    state.mkdir()
    work.mkdir()
    shared = load_settings(state_dir=str(state), workdir_roots=[str(work)])
    found = [f for f in config_findings(shared) if "file system of the state directory" in f.message]
    assert len(found) == 1 and found[0].key == "workdir_roots"
    assert "put workdir_roots on another file system" in found[0].message
    # The default root (<state>/work) once it exists.
    (state / "work").mkdir()
    assert [f for f in config_findings(load_settings(state_dir=str(state))) if "state directory" in f.message]
    # A root on another file system: nothing to say.
    other = Path("/dev/shm")
    if not other.is_dir() or os.stat(other).st_dev == os.stat(state).st_dev:
        pytest.skip("no second file system at /dev/shm here")
    apart = load_settings(state_dir=str(state), workdir_roots=[str(other)])
    assert not [f for f in config_findings(apart) if "file system of the state directory" in f.message]
