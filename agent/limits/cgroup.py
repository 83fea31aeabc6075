"""Limits by cgroup, v2 (delegated) or v1: a group per goal, and each command in a child group of it.

The layout and the files written are those of :mod:`agent.limits` (the package docstring says why
cgroups, and why per goal). Under our own group (the base):

* ``goald-PID-N-KEY``: a goal's group (``KEY`` its id, or a session's, cut to safe characters),
  with the goal's caps; on v2 it enables ``pids`` and ``memory`` for its children and holds no
  process itself (a v2 group with children that use controllers may not).
* ``goald-PID-N-KEY/goald-PID-M``: one command of that goal, without caps of its own: the goal's
  bind it, and its counters tell which command a limit hit.
* ``goald-PID-N``: a command of no goal (an MCP server, a notification command), with its own caps.

A goal's group is made by its first command (or :meth:`Limiter.hold`) and removed after its last
one, so it holds nothing while none of its commands runs, and is gone when the goal ends, its
session is dropped or the daemon stops. Names carry the PID of the daemon that made them, so a
daemon started after a killed one removes what that one left (:func:`agent.limits.stale.clean_stale`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import shlex
import threading
from pathlib import Path

from loguru import logger

from agent.limits.base import CommandLimits, GoalGroup, Group, Limiter, LimitsUnavailable, Mechanism

PREFIX = "goald-"
#: The leaf a delegated v2 group's own processes move into (see :mod:`agent.limits.detect`).
LEAF = "goald-daemon"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


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


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


#: The waits between tries of a busy group's removal: short first (the kernel usually lets go of
#: exited processes within a millisecond or two, and a command's result waits for its group), then
#: 20 ms apart, about a second in all.
_RMDIR_WAITS = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, *([0.02] * 48))


async def _rmdir(path: Path) -> None:
    """Remove an emptied cgroup. The kernel may take a moment to let go of exited processes, so a
    busy group is tried again for up to about a second; a group still busy then is left, logged."""
    for wait in (*_RMDIR_WAITS, None):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if wait is None:
                logger.warning("cgroup {} not removed: {}", path, exc.strerror)
                return
        await asyncio.sleep(wait)


def _memory_hits(dirs: dict[str, Path], version: int) -> int:
    """How often a group's memory limit refused a charge: v2's ``memory.events`` ``max``, v1's
    ``memory.failcnt``."""
    memory = dirs.get("memory")
    if memory is None:
        return 0
    if version == 2:
        return _read_counts(memory / "memory.events").get("max", 0)
    return _read_int(memory / "memory.failcnt") or 0


def _plural(n: int) -> str:
    return f"{n} process{'es' if n > 1 else ''}"


class _Goal(GoalGroup):
    """One goal's group (see the module docstring), shared by its commands' groups."""

    def __init__(
        self, owner: _CgroupLimiter, key: str, limits: CommandLimits, dirs: dict[str, Path], version: int
    ) -> None:
        super().__init__(key, limits)
        self.owner = owner
        self.dirs = dirs  # controller -> the goal's group
        self.version = version
        self.holds = 1
        # Its commands' groups while they live, and the kills counted in those already removed: the
        # goal's OOM kills so far, since v1 counts a kill only in the victim's group.
        self.commands: set[_CgroupGroup] = set()
        self.kills_done = 0

    def peak_memory(self) -> int | None:
        memory = self.dirs.get("memory")
        if memory is None:
            return None
        return _read_int(memory / ("memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"))

    def processes(self) -> int | None:
        pids = self.dirs.get("pids")
        return None if pids is None else _read_int(pids / "pids.current")

    def peak_processes(self) -> int | None:
        pids = self.dirs.get("pids")
        return None if pids is None else _read_int(pids / "pids.peak")

    def memory_hits(self) -> int:
        """How often the goal's memory cap was met so far (a rise: it was reached meanwhile): the
        charges it refused, where the kernel counts them, and the kernel's kills in its commands."""
        with self.owner.lock:
            commands = list(self.commands)
            done = self.kills_done
        return _memory_hits(self.dirs, self.version) + done + sum(c.killed() for c in commands)

    def limit_hits(self) -> int:
        """How often the goal's process limit refused a fork (v2 counts it in the goal's group)."""
        pids = self.dirs.get("pids")
        return 0 if pids is None else _read_counts(pids / "pids.events").get("max", 0)

    def unhold(self) -> bool:
        """Give up one hold; whether it was the last (the group is then no longer live)."""
        with self.owner.lock:
            self.holds -= 1
            last = self.holds == 0
            if last and self.owner.live.get(self.key) is self:
                del self.owner.live[self.key]
        return last

    async def release(self) -> None:
        if self.unhold():
            for path in dict.fromkeys(self.dirs.values()):
                await _rmdir(path)


class _CgroupGroup(Group):
    def __init__(self, limits: CommandLimits, dirs: dict[str, Path], version: int, goal: _Goal | None = None) -> None:
        self.limits = limits
        self.dirs = dirs  # controller -> this command's group
        self.version = version
        self.goal = goal
        # On v2 a fork refused by the goal's limit may be counted in the goal's group only (the
        # kernel's semantics since 6.12): a rise while this command ran is its verdict too.
        self._goal_hits = goal.limit_hits() if goal is not None and version == 2 else 0
        self._memory_hits = self._capping_memory_hits()
        if goal is not None:
            with goal.owner.lock:
                goal.commands.add(self)

    def _capping_memory_hits(self) -> int:
        """The charges refused so far by the group that holds the memory cap (the goal's, or the
        command's own)."""
        return self.goal.memory_hits() if self.goal is not None else _memory_hits(self.dirs, self.version)

    def enter(self, pid: int) -> None:
        for path in dict.fromkeys(self.dirs.values()):
            try:
                write(path / "cgroup.procs", str(pid))
            except OSError as exc:
                raise LimitsUnavailable(f"cannot put the command into cgroup {path}: {exc.strerror}") from None

    def entry_files(self) -> list[Path]:
        # Itself (0), through ``tasks``: no threadgroup lock (the Limiter's enters_itself).
        return [path / "tasks" for path in dict.fromkeys(self.dirs.values())] if self.version == 1 else []

    def entry_script(self) -> str:
        if self.version == 1:
            return "".join(f"echo 0 > {shlex.quote(str(path))} || exit 70\n" for path in self.entry_files())
        return "".join(
            f'printf "%d\\n" "$$" > {shlex.quote(str(path / "cgroup.procs"))} || exit 70\n'
            for path in dict.fromkeys(self.dirs.values())
        )

    def _refused(self) -> bool:
        pids = self.dirs.get("pids")
        if pids is None:
            return False
        if _read_counts(pids / "pids.events").get("max", 0) > 0:  # v1, and v2 before 6.12: where the fork failed
            return True
        return self.goal is not None and self.version == 2 and self.goal.limit_hits() > self._goal_hits

    def killed(self) -> int:
        """How many of this command's processes the kernel killed at the memory cap."""
        memory = self.dirs.get("memory")
        if memory is None:
            return 0
        if self.version == 2:
            return _read_counts(memory / "memory.events").get("oom_kill", 0)
        return _read_counts(memory / "memory.oom_control").get("oom_kill", 0)

    def verdict(self, *, failed: bool = False) -> str | None:
        found: list[str] = []
        limits = self.limits if self.goal is None else self.goal.limits
        whose = "" if self.goal is None else " of the goal"
        together = "" if self.goal is None else ", all its commands together"
        if self._refused():
            found.append(f"process limit{whose} ({limits.max_processes}{together}) reached: new processes were refused")
        killed = self.killed()
        if killed > 0:
            found.append(
                f"memory limit{whose} ({limits.memory_text()}{together}) exceeded: the kernel killed "
                f"{_plural(killed)} of {'this' if self.goal is not None else 'the'} command"
            )
        elif failed and self._capping_memory_hits() > self._memory_hits:
            # Nothing of it was killed, but the cap was reached while it ran: a system call of it
            # may have been refused memory (bwrap's "Creating new namespace failed: Cannot allocate
            # memory", a fork, Python's MemoryError), which says nothing of the cap by itself.
            found.append(
                f"memory limit{whose} ({limits.memory_text()}{together}) reached while "
                f"{'this' if self.goal is not None else 'the'} command ran: it may have been refused memory"
            )
        return "; ".join(found) or None

    async def remove(self) -> None:
        if self.goal is not None:
            killed = self.killed()
            with self.goal.owner.lock:
                if self in self.goal.commands:
                    self.goal.commands.discard(self)
                    self.goal.kills_done += killed
        try:
            for path in dict.fromkeys(self.dirs.values()):
                await _rmdir(path)
        finally:
            if self.goal is not None:
                await self.goal.release()


class _CgroupLimiter(Limiter):
    """What v1 and v2 share: the live goal groups, held and released."""

    version: int

    def __init__(self) -> None:
        self.live: dict[str, _Goal] = {}
        self.lock = threading.Lock()

    def goals(self) -> dict[str, GoalGroup]:
        with self.lock:
            return dict(self.live)

    def hold(self, goal: str, limits: CommandLimits) -> GoalGroup:
        return self._hold(goal, limits)

    def _hold(self, key: str, limits: CommandLimits) -> _Goal:
        with self.lock:
            found = self.live.get(key)
            if found is not None:
                found.holds += 1
                if found.limits != limits:
                    self._recap(found, limits)
                return found
            name = f"{PREFIX}{os.getpid()}-{next(_seq)}-{_UNSAFE.sub('_', key)[:48]}"
            made = _Goal(self, key, limits, self._make_goal(name, limits), self.version)
            self.live[key] = made
            return made

    def _recap(self, goal: _Goal, limits: CommandLimits) -> None:
        """New caps for a live goal group (its policy changed), where its controllers allow; else
        it keeps its caps until none of its commands runs (logged)."""
        needed = {"pids"} if limits.max_processes is not None else set()
        needed |= {"memory"} if limits.max_memory_bytes is not None else set()
        try:
            if not needed <= goal.dirs.keys():
                raise OSError(f"its group has no {', '.join(sorted(needed - goal.dirs.keys()))} controller")
            self._write_caps(goal.dirs, limits)
        except OSError as exc:
            logger.warning("the caps of goal {} stay {} (not changed to {}): {}", goal.key, goal.limits, limits, exc)
            return
        goal.limits = limits

    def group(self, limits: CommandLimits, *, goal: str | None = None) -> Group:
        name = f"{PREFIX}{os.getpid()}-{next(_seq)}"
        if goal is None:
            return _CgroupGroup(limits, self._make_command(name, limits), self.version)
        held = self._hold(goal, limits)
        dirs: dict[str, Path] = {}
        try:
            for controller, parent in held.dirs.items():
                dirs[controller] = parent / name
            for path in dict.fromkeys(dirs.values()):
                path.mkdir()
        except OSError as exc:
            for path in dict.fromkeys(dirs.values()):
                with contextlib.suppress(OSError):
                    path.rmdir()
            if held.unhold():  # nothing ever ran in it
                for path in dict.fromkeys(held.dirs.values()):
                    with contextlib.suppress(OSError):
                        path.rmdir()
            raise LimitsUnavailable(f"cannot set up the command's cgroup in its goal's: {exc}") from None
        return _CgroupGroup(limits, dirs, self.version, held)

    def _make_goal(self, name: str, limits: CommandLimits) -> dict[str, Path]:
        raise NotImplementedError

    def _make_command(self, name: str, limits: CommandLimits) -> dict[str, Path]:
        raise NotImplementedError

    def _write_caps(self, dirs: dict[str, Path], limits: CommandLimits) -> None:
        raise NotImplementedError


class V1Limiter(_CgroupLimiter):
    mechanism = Mechanism.CGROUP_V1
    version = 1
    enters_itself = True

    def __init__(self, bases: dict[str, Path]) -> None:
        super().__init__()
        self.bases = bases

    def describe(self) -> str:
        where = ", ".join(f"{c} under {p}" for c, p in self.bases.items())
        return f"cgroup v1 ({where}): a group per goal, each command in a group of its own inside it"

    def _dirs(self, name: str, limits: CommandLimits) -> dict[str, Path]:
        """A group named ``name`` in each hierarchy whose controller has a cap (made, no cap written)."""
        dirs: dict[str, Path] = {}
        try:
            if limits.max_processes is not None:
                dirs["pids"] = self.bases["pids"] / name
                dirs["pids"].mkdir()
            if limits.max_memory_bytes is not None:
                dirs["memory"] = self.bases["memory"] / name
                dirs["memory"].mkdir()
            self._write_caps(dirs, limits)
        except OSError as exc:
            for path in dirs.values():
                with contextlib.suppress(OSError):
                    path.rmdir()
            raise LimitsUnavailable(f"cannot set up the cgroup {name}: {exc}") from None
        return dirs

    _make_goal = _make_command = _dirs

    def _write_caps(self, dirs: dict[str, Path], limits: CommandLimits) -> None:
        if "pids" in dirs:
            write(dirs["pids"] / "pids.max", str(limits.max_processes or "max"))
        memory = dirs.get("memory")
        if memory is not None:
            value = str(limits.max_memory_bytes or -1)
            files = [memory / "memory.limit_in_bytes"]
            if (memory / "memory.memsw.limit_in_bytes").exists():
                files.append(memory / "memory.memsw.limit_in_bytes")
            try:
                for path in files:
                    write(path, value)
            except OSError:  # raising a cap: memsw (never below the memory cap) goes first
                for path in reversed(files):
                    write(path, value)


class V2Limiter(_CgroupLimiter):
    mechanism = Mechanism.CGROUP_V2
    version = 2

    def __init__(self, base: Path) -> None:
        super().__init__()
        self.base = base

    def describe(self) -> str:
        return f"cgroup v2 (delegated: {self.base}): a group per goal, each command in a group of its own inside it"

    def _dir(self, name: str, limits: CommandLimits, *, parent: bool) -> dict[str, Path]:
        path = self.base / name
        try:
            path.mkdir()
            self._write_caps({"pids": path, "memory": path}, limits)
            if parent:  # its commands' groups get the controllers' files (their verdicts)
                write(path / "cgroup.subtree_control", "+pids +memory")
        except OSError as exc:
            with contextlib.suppress(OSError):
                path.rmdir()
            raise LimitsUnavailable(f"cannot set up the cgroup {name}: {exc}") from None
        return {"pids": path, "memory": path}

    def _make_goal(self, name: str, limits: CommandLimits) -> dict[str, Path]:
        return self._dir(name, limits, parent=True)

    def _make_command(self, name: str, limits: CommandLimits) -> dict[str, Path]:
        return self._dir(name, limits, parent=False)

    def _write_caps(self, dirs: dict[str, Path], limits: CommandLimits) -> None:
        path = dirs["pids"]
        write(path / "pids.max", str(limits.max_processes or "max"))
        write(path / "memory.max", str(limits.max_memory_bytes or "max"))
        if limits.max_memory_bytes is not None and (path / "memory.swap.max").exists():
            write(path / "memory.swap.max", "0")
