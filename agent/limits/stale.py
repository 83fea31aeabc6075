"""What a killed daemon left in the cgroup hierarchies: its goals' and commands' groups, and any
process still in them (a bwrap whose daemon was killed before its ``--die-with-parent`` was armed,
and what it started). A daemon removes them at start (:mod:`agent.limits.detect`); a group is a
dead daemon's when the PID in its name (:mod:`agent.limits.cgroup`) no longer runs.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from pathlib import Path

from loguru import logger

from agent.limits.cgroup import PREFIX

#: A group of ours (:data:`~agent.limits.cgroup.PREFIX`): a command's (``goald-PID-N``) or a goal's
#: (``goald-PID-N-KEY``).
_STALE = re.compile(rf"^{re.escape(PREFIX)}(\d+)-\d+(?:-[A-Za-z0-9_-]*)?$")


def clean_stale(parent: Path) -> None:
    """Remove the groups (goals' and commands') of daemons that no longer run, a goal's command
    groups before the goal's. A process still in one (a bwrap whose daemon was killed before its
    ``--die-with-parent`` was armed, and what it started) is killed first, and logged."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(parent):
            m = _STALE.match(entry.name)
            if m is None or not entry.is_dir(follow_symlinks=False) or _alive(int(m.group(1))):
                continue
            with contextlib.suppress(OSError):
                for child in os.scandir(entry.path):
                    if child.is_dir(follow_symlinks=False):
                        _empty(Path(child.path))
                        with contextlib.suppress(OSError):
                            os.rmdir(child.path)
            _empty(Path(entry.path))
            with contextlib.suppress(OSError):
                os.rmdir(entry.path)


def _members(group: Path) -> list[int]:
    try:
        return [int(line) for line in (group / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _empty(group: Path, wait: float = 2.0) -> None:
    """SIGKILL every process left in a dead daemon's ``group`` and wait (at most ``wait`` seconds)
    until the kernel has taken them out. Each is held by a pidfd and checked to still be a member
    before the signal, so a PID reused meanwhile is never hit."""
    killed: list[int] = []
    deadline = time.monotonic() + wait
    while members := _members(group):
        for pid in members:
            if pid in killed:
                continue
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                continue
            try:
                if pid in _members(group):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    killed.append(pid)
            except OSError:
                pass
            finally:
                os.close(pidfd)
        if time.monotonic() >= deadline:
            logger.warning("cgroup {} of a daemon that no longer runs still holds {} after SIGKILL", group, members)
            break
        time.sleep(0.01)
    if killed:
        logger.warning(
            "killed {} process(es) left in cgroup {} by a daemon that no longer runs: {}", len(killed), group, killed
        )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
