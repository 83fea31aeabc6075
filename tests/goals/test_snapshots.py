"""Checkpoints read a work directory as data: symlinks are recorded, never followed; special files
are skipped; the top-level ``.git`` is left out; the walk's bounds are said; diffs look like git's."""

from __future__ import annotations

import os
from pathlib import Path

from goals.snapshots import Snapshots


def test_a_checkpoint_reads_the_tree_as_data_and_diffs_it(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "src").mkdir(parents=True)
    (work / "src" / "a.py").write_text("x = 1\ny = 2\n")
    (work / ".git").write_text("gitdir: /elsewhere\n")
    (work / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(work / "run.sh", 0o755)
    snaps = Snapshots(tmp_path / "snaps")
    base = snaps.take("g", "base", work)
    assert set(base.files) == {"src/a.py", "run.sh"} and base.files["run.sh"][1] == 0o100755
    secret = tmp_path / "secret.txt"
    secret.write_text("not the goal's\n")
    os.symlink(secret, work / "link")
    os.mkfifo(work / "pipe")
    (work / "src" / "a.py").write_text("x = 1\ny = 3\n")
    one = snaps.take("g", "round-1", work)
    assert snaps.blob("g", one.files["link"][0]) == str(secret).encode()  # the target's name, not its content
    assert "pipe" not in one.files and one.truncated is None
    diff = {f.path: f for f in snaps.diff("g", base, one)}
    assert set(diff) == {"src/a.py", "link"}
    assert (diff["src/a.py"].added, diff["src/a.py"].removed) == (1, 1)
    assert "-y = 2\n+y = 3\n" in diff["src/a.py"].text and diff["link"].text.startswith(
        "diff --git a/link b/link\nnew file mode 120000\n"
    )
    assert snaps.names("g") == ["base", "round-1"]
    assert snaps.manifest("g", "round-1") is not None and snaps.manifest("g", "round-2") is None


def test_the_walk_is_bounded_and_says_so(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    for i in range(5):
        (work / f"f{i}").write_text("data\n" * 10)
    few = Snapshots(tmp_path / "a", max_files=3).take("g", "base", work)
    assert len(few.files) == 3 and few.truncated is not None and "more than 3 files" in few.truncated
    small = Snapshots(tmp_path / "b", max_bytes=120).take("g", "base", work)
    assert small.truncated is not None and "over the bytes it may read" in small.truncated and len(small.files) == 2
    bounded = Snapshots(tmp_path / "c").take("g", "base", work, max_bytes=60)
    assert bounded.truncated is not None and len(bounded.files) == 1
