"""The benchmarks' CPU quotas (``benchmarks/cpu_caps.py``): a group capped as asked, a process in it
accounted, and nothing left behind. Skipped where quotas cannot be set (not root, no cgroup cpu
controller that may be delegated)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import cpu_caps

WHY = cpu_caps.available()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"CPU quotas cannot be set here: {WHY}")

BURN = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\nprint('done', flush=True)"


def test_a_capped_group_holds_its_process_accounts_its_cpu_and_is_removed() -> None:
    group = cpu_caps.Group("test", 0.25)
    try:
        if cpu_caps._v2():
            assert (group.dirs[0] / "cpu.max").read_text().split() == ["25000", "100000"]
        else:
            assert (group.dirs[0] / "cpu.cfs_quota_us").read_text().strip() == "25000"
            assert (group.dirs[0] / "cpu.cfs_period_us").read_text().strip() == "100000"
        with subprocess.Popen(
            [sys.executable, "-c", f"import sys\nsys.stdin.readline()\n{BURN}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        ) as proc:
            assert proc.stdin is not None and proc.stdout is not None
            try:
                group.add(proc.pid)
                for d in group.dirs:
                    assert str(proc.pid) in (d / "cgroup.procs").read_text().split()
                group.mark()
                proc.stdin.write("go\n")
                proc.stdin.flush()
                assert proc.stdout.readline().strip() == "done"  # it burnt 0.3 s of CPU inside the group
                assert group.used() - group._used0 >= 0.25
            finally:
                proc.kill()
    finally:
        group.close()
    assert not any(d.exists() for d in group.dirs)
