"""Limits by cgroup: each command in a child group of our own, v2 (delegated) or v1.

The layout and the files written are those of :mod:`agent.limits` (the package docstring says why
cgroups). Group names carry the PID of the daemon that made them (``goald-PID-N``), so a daemon
started after a killed one removes what that one left (:func:`clean_stale`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import shlex
from pathlib import Path

from loguru import logger

from agent.limits.base import CommandLimits, Group, Limiter, LimitsUnavailable, Mechanism

PREFIX = "goald-"
#: The leaf a delegated v2 group's own processes move into (see :mod:`agent.limits.detect`).
LEAF = "goald-daemon"
_STALE = re.compile(r"^goald-(\d+)-\d+$")


_seq = itertools.count(1)


def write(path: Path, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


def _read_counts(path: Path) -> dict[str, int]:
    """``key value`` lines (``pids.events``, ``memory.events``, ``memory.oom_control``)."""
    counts: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            with contextlib.suppress(ValueError):
                counts[key] = int(value)
    return counts


async def _rmdir(path: Path) -> None:
    """Remove an emptied cgroup. The kernel may take a moment to let go of exited processes, so a
    busy group is tried again for up to about a second; a group still busy then is left, logged."""
    for attempt in range(50):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if attempt == 49:
                logger.warning("cgroup {} not removed: {}", path, exc.strerror)
                return
        await asyncio.sleep(0.02)


def clean_stale(parent: Path) -> None:
    """Remove the command groups of daemons that no longer run."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(parent):
            m = _STALE.match(entry.name)
            if m is None or not entry.is_dir(follow_symlinks=False) or _alive(int(m.group(1))):
                continue
            with contextlib.suppress(OSError):
                os.rmdir(entry.path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _CgroupGroup(Group):
    def __init__(self, limits: CommandLimits, dirs: dict[str, Path], version: int) -> None:
        self.limits = limits
        self.dirs = dirs  # controller -> this command's group
        self.version = version

    def enter(self, pid: int) -> None:
        for path in dict.fromkeys(self.dirs.values()):
            try:
                write(path / "cgroup.procs", str(pid))
            except OSError as exc:
                raise LimitsUnavailable(f"cannot put the command into cgroup {path}: {exc.strerror}") from None

    def entry_script(self) -> str:
        return "".join(
            f'printf "%d\\n" "$$" > {shlex.quote(str(path / "cgroup.procs"))} || exit 70\n'
            for path in dict.fromkeys(self.dirs.values())
        )

    def verdict(self) -> str | None:
        found: list[str] = []
        pids = self.dirs.get("pids")
        if pids is not None and _read_counts(pids / "pids.events").get("max", 0) > 0:
            found.append(f"process limit ({self.limits.max_processes}) reached: new processes were refused")
        memory = self.dirs.get("memory")
        if memory is not None:
            if self.version == 2:
                killed = _read_counts(memory / "memory.events").get("oom_kill", 0)
            else:
                killed = _read_counts(memory / "memory.oom_control").get("oom_kill", 0)
            if killed > 0:
                found.append(
                    f"memory limit ({self.limits.memory_text()}) exceeded: the kernel killed "
                    f"{killed} process{'es' if killed > 1 else ''} of the command"
                )
        return "; ".join(found) or None

    async def remove(self) -> None:
        for path in dict.fromkeys(self.dirs.values()):
            await _rmdir(path)


class V1Limiter(Limiter):
    mechanism = Mechanism.CGROUP_V1

    def __init__(self, bases: dict[str, Path]) -> None:
        self.bases = bases

    def describe(self) -> str:
        return "cgroup v1 (" + ", ".join(f"{c} under {p}" for c, p in self.bases.items()) + ")"

    def group(self, limits: CommandLimits) -> Group:
        name = f"{PREFIX}{os.getpid()}-{next(_seq)}"
        dirs: dict[str, Path] = {}
        try:
            if limits.max_processes is not None:
                dirs["pids"] = self.bases["pids"] / name
                dirs["pids"].mkdir()
                write(dirs["pids"] / "pids.max", str(limits.max_processes))
            if limits.max_memory_bytes is not None:
                dirs["memory"] = path = self.bases["memory"] / name
                path.mkdir()
                write(path / "memory.limit_in_bytes", str(limits.max_memory_bytes))
                if (path / "memory.memsw.limit_in_bytes").exists():
                    write(path / "memory.memsw.limit_in_bytes", str(limits.max_memory_bytes))
        except OSError as exc:
            for path in dirs.values():
                with contextlib.suppress(OSError):
                    path.rmdir()
            raise LimitsUnavailable(f"cannot set up the command's cgroup: {exc}") from None
        return _CgroupGroup(limits, dirs, 1)


class V2Limiter(Limiter):
    mechanism = Mechanism.CGROUP_V2

    def __init__(self, base: Path) -> None:
        self.base = base

    def describe(self) -> str:
        return f"cgroup v2 (delegated: {self.base})"

    def group(self, limits: CommandLimits) -> Group:
        path = self.base / f"{PREFIX}{os.getpid()}-{next(_seq)}"
        try:
            path.mkdir()
            if limits.max_processes is not None:
                write(path / "pids.max", str(limits.max_processes))
            if limits.max_memory_bytes is not None:
                write(path / "memory.max", str(limits.max_memory_bytes))
                if (path / "memory.swap.max").exists():
                    write(path / "memory.swap.max", "0")
        except OSError as exc:
            with contextlib.suppress(OSError):
                path.rmdir()
            raise LimitsUnavailable(f"cannot set up the command's cgroup: {exc}") from None
        return _CgroupGroup(limits, {"pids": path, "memory": path}, 2)
