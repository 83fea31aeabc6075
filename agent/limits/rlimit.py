"""Limits by rlimits per process: the fallback where no cgroup is writable.

Weaker than a cgroup (see :mod:`agent.limits`): ``RLIMIT_AS`` caps each process, not the command,
and ``RLIMIT_NPROC`` counts every process of the daemon's user and does not bind root, so it is set
only when not root, to that count plus the cap. Nothing binds a goal's commands together: a goal's
caps are set on each of its commands, as when goald limited commands one by one (the warning at
start says so). A hit limit is not explained (no verdict).
"""

from __future__ import annotations

import contextlib
import os
import resource

from agent.limits.base import CommandLimits, Group, Limiter, LimitsUnavailable, Mechanism


class RlimitLimiter(Limiter):
    """Sets each command's rlimits (the fallback :func:`agent.limits.limiter` logs once)."""

    mechanism = Mechanism.RLIMIT
    per_goal = False

    def describe(self) -> str:
        return "rlimits per process (RLIMIT_AS; RLIMIT_NPROC only when not root), set per command, not per goal"

    def group(self, limits: CommandLimits, *, goal: str | None = None) -> Group:
        return _RlimitGroup(limits)  # per command, goal or not: rlimits cannot bind a goal as a whole


class _RlimitGroup(Group):
    def __init__(self, limits: CommandLimits) -> None:
        self.limits = limits

    def enter(self, pid: int) -> None:
        try:
            if self.limits.max_memory_bytes is not None:
                cap = self.limits.max_memory_bytes
                resource.prlimit(pid, resource.RLIMIT_AS, (cap, cap))
            if self.limits.max_processes is not None and os.geteuid() != 0:
                cap = _own_processes() + self.limits.max_processes
                resource.prlimit(pid, resource.RLIMIT_NPROC, (cap, cap))
        except OSError as exc:
            raise LimitsUnavailable(f"cannot set the command's rlimits: {exc.strerror}") from None

    def entry_script(self) -> str:
        lines = []
        if self.limits.max_memory_bytes is not None:
            lines.append(f"ulimit -v {self.limits.max_memory_bytes // 1024} || exit 70\n")
        if self.limits.max_processes is not None and os.geteuid() != 0:
            lines.append(f"ulimit -u {_own_processes() + self.limits.max_processes} || exit 70\n")
        return "".join(lines)


def _own_processes() -> int:
    uid = os.getuid()
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                count += os.stat(f"/proc/{entry}").st_uid == uid
    return count
