"""A small file system for the tests of a full disk: a tmpfs mounted in ``tmp_path`` and a filler.

Mounting needs root; without it (or where ``mount`` is refused) the test skips with the reason.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def mounted_tmpfs(where: Path, size_mb: int, mode: str = "0700") -> Iterator[Path]:
    """Mount a ``size_mb`` MiB tmpfs at ``where`` (made here) for the ``with`` block; unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode={mode}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(path: Path) -> int:
    """Write ``path`` until its file system is full, the last pages as small as it takes; returns the bytes written."""
    written = 0
    block = b"\0" * 65536
    with open(path, "wb", buffering=0) as fh:
        for size in (65536, 4096, 512, 1):
            while True:
                try:
                    written += fh.write(block[:size])
                except OSError:
                    break
    return written
