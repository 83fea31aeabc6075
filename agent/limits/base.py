"""What limits a goal's commands and the interface of whatever enforces them (see :mod:`agent.limits`).

:class:`CommandLimits` is the caps as settings spell them, :class:`GoalGroup` the group every
command of one goal runs under (its caps bind them together), :class:`Group` the group of one
command (made, entered, read, removed) and :class:`Limiter` what makes groups on this machine. The
mechanisms (:mod:`agent.limits.cgroup`, :mod:`agent.limits.rlimit`) subclass these; this module
imports none of them, so the package has no import cycle.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from agent.errors import AgentError

MIB = 1024 * 1024
#: The smallest caps accepted: bwrap itself is two processes and a few MiB.
MIN_PROCESSES = 8
MIN_MEMORY_BYTES = 16 * MIB


class LimitsUnavailable(AgentError, RuntimeError):
    """A command's limits could not be set up; the command is not run."""


@dataclass(frozen=True)
class CommandLimits:
    """Caps on processes and memory (``None``: no cap): of a goal's commands all together when
    they run in the goal's group (:meth:`Limiter.group` with ``goal``), else of one command as a
    whole (an MCP server, a notification command, the rlimits fallback)."""

    #: Processes (and threads) at once, bwrap's two of each command included.
    max_processes: int | None = None
    #: Memory of every process together (and of each command's private ``/tmp``), in bytes.
    max_memory_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.max_processes is not None and self.max_processes < MIN_PROCESSES:
            raise ValueError(f"max_processes must be at least {MIN_PROCESSES}, got {self.max_processes}")
        if self.max_memory_bytes is not None and self.max_memory_bytes < MIN_MEMORY_BYTES:
            raise ValueError(f"the memory cap must be at least {MIN_MEMORY_BYTES // MIB} MiB")

    @classmethod
    def of(cls, max_processes: int | None = None, max_memory_mb: int | None = None) -> CommandLimits:
        """Caps as the settings spell them: memory in MiB, and 0 (or ``None``) for no cap."""
        return cls(max_processes or None, max_memory_mb * MIB if max_memory_mb else None)

    @property
    def active(self) -> bool:
        """Whether any cap is set."""
        return self.max_processes is not None or self.max_memory_bytes is not None

    def memory_text(self) -> str:
        """The memory cap as people read it (``"512 MiB"``)."""
        if self.max_memory_bytes is None:
            return "unlimited"
        return f"{self.max_memory_bytes / MIB:g} MiB"


class Mechanism(enum.StrEnum):
    """How limits are enforced on this machine."""

    #: A delegated cgroup v2 subtree: a group per goal, each command in a child group of it.
    CGROUP_V2 = "cgroup_v2"
    #: cgroup v1's ``pids`` and ``memory`` hierarchies: the same layout in each.
    CGROUP_V1 = "cgroup_v1"
    #: Resource limits per process, set for each command: weaker (see :mod:`agent.limits`), and
    #: never for a goal as a whole.
    RLIMIT = "rlimit"


class GoalGroup:
    """The group all of one goal's commands run under: its caps bind them together, parallel calls
    included. Made by :meth:`Limiter.hold` (or the first command's :meth:`Limiter.group`), each
    command's group inside it; removed once the last hold is released and the last command's group
    is removed. This base enforces nothing (the rlimits fallback: caps per command)."""

    def __init__(self, key: str, limits: CommandLimits) -> None:
        #: Whose commands these are (a goal's id, or a session's).
        self.key = key
        #: The caps of all of them together.
        self.limits = limits

    def peak_memory(self) -> int | None:
        """The most memory the goal's commands held together so far, in bytes (``None``: not known)."""
        return None

    def processes(self) -> int | None:
        """How many processes of the goal run now (``None``: not known)."""
        return None

    def peak_processes(self) -> int | None:
        """The most processes of the goal at once so far (``None``: not known; older kernels have
        no ``pids.peak``)."""
        return None

    async def release(self) -> None:
        """Give up one hold: the last one removes the group."""


class Group:
    """The group of one command: made before bwrap starts, entered while it waits, removed after
    (inside its goal's group, if it has one)."""

    def enter(self, pid: int) -> None:
        """Put ``pid`` (bwrap, still waiting for its arguments) under the limits.

        Raises:
            LimitsUnavailable: it could not be done.
        """

    def entry_script(self) -> str:
        """Lines of POSIX shell that put the shell running them under the limits (itself, which then
        execs bwrap) and exit 70 if they cannot: for a spawner that gives us no PID before the
        command runs (the MCP SDK's; see :meth:`agent.sandbox.Sandbox.launcher`), and, where
        :attr:`Limiter.enters_itself`, in front of every command's bwrap."""
        return ""

    def entry_files(self) -> list[Path]:
        """Where :attr:`Limiter.enters_itself`: the files a process writes ``0`` into to move itself
        into this group (cgroup v1's ``tasks``, one per controller); empty otherwise."""
        return []

    def verdict(self, *, failed: bool = False) -> str | None:
        """Which limit the command hit, in words; ``None`` if none (or if it cannot be told).
        ``failed``: the command exited with an error, so a memory limit reached while it ran (with
        nothing of it killed) is named as what may have refused it memory."""
        return None

    async def remove(self) -> None:
        """Remove what :meth:`Limiter.group` made (the command's processes are gone by now), and
        release its hold on the goal's group."""


class Limiter:
    """Makes one :class:`Group` per command, inside one :class:`GoalGroup` per goal, by this
    machine's :class:`Mechanism`."""

    mechanism: Mechanism
    #: Whether a command's first process moving itself into its group (:meth:`Group.entry_script`,
    #: run by a ``/bin/sh`` that then execs bwrap) is cheaper than the daemon moving bwrap in
    #: (:meth:`Group.enter`). True on cgroup v1: a process writing ``0`` into a ``tasks`` file moves
    #: itself without the lock the kernel takes to move another process (``cgroup_threadgroup_rwsem``
    #: for writing, an RCU grace period: about 5 ms per controller).
    enters_itself: bool = False
    #: Whether a goal's caps bind its commands together (cgroups), or each command (rlimits).
    per_goal: bool = True

    def describe(self) -> str:
        """What enforces the limits, in one line."""
        raise NotImplementedError

    def group(self, limits: CommandLimits, *, goal: str | None = None) -> Group:
        """The group of one command (set, not yet entered).

        With ``goal`` (a goal's id, or a session's: whoever's commands share the caps) the group is
        made inside that goal's group, whose caps are ``limits`` for all of its commands together
        (:meth:`hold`); the command's own group has no cap, it tells which command a limit hit.
        Without, the command's own group has the caps (an MCP server, a notification command).

        Raises:
            LimitsUnavailable: they could not be set up.
        """
        raise NotImplementedError

    def hold(self, goal: str, limits: CommandLimits) -> GoalGroup:
        """The group of ``goal``'s commands, made now with the caps ``limits`` if none is live,
        held until :meth:`GoalGroup.release`.

        Raises:
            LimitsUnavailable: it could not be set up.
        """
        return GoalGroup(goal, limits)

    def goals(self) -> dict[str, GoalGroup]:
        """The goal groups live now, by key."""
        return {}
