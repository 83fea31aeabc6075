"""What limits a command and the interface of whatever enforces them (see :mod:`agent.limits`).

:class:`CommandLimits` is the caps as settings spell them, :class:`Group` the limits of one command
(made, entered, read, removed) and :class:`Limiter` what makes groups on this machine. The
mechanisms (:mod:`agent.limits.cgroup`, :mod:`agent.limits.rlimit`) subclass these two; this
module imports none of them, so the package has no import cycle.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from agent.errors import AgentError

MIB = 1024 * 1024
#: The smallest caps accepted: bwrap itself is two processes and a few MiB.
MIN_PROCESSES = 8
MIN_MEMORY_BYTES = 16 * MIB


class LimitsUnavailable(AgentError, RuntimeError):
    """A command's limits could not be set up; the command is not run."""


@dataclass(frozen=True)
class CommandLimits:
    """The caps of one sandboxed command as a whole (``None``: no cap)."""

    #: Processes (and threads) at once, bwrap's two included.
    max_processes: int | None = None
    #: Memory of every process of the command together (and of its private ``/tmp``), in bytes.
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

    #: A delegated cgroup v2 subtree: each command in a child group.
    CGROUP_V2 = "cgroup_v2"
    #: cgroup v1's ``pids`` and ``memory`` hierarchies: each command in a child group of each.
    CGROUP_V1 = "cgroup_v1"
    #: Resource limits per process: weaker (see the module docstring).
    RLIMIT = "rlimit"


class Group:
    """The limits of one command: made before bwrap starts, entered while it waits, removed after."""

    def enter(self, pid: int) -> None:
        """Put ``pid`` (bwrap, still waiting for its arguments) under the limits.

        Raises:
            LimitsUnavailable: it could not be done.
        """

    def entry_script(self) -> str:
        """Lines of bash that put the shell running them under the limits (``$$``, which then
        execs bwrap) and exit 70 if they cannot: for a spawner that gives us no PID before the
        command runs (the MCP SDK's; see :meth:`agent.sandbox.Sandbox.launcher`)."""
        return ""

    def verdict(self) -> str | None:
        """Which limit the command hit, in words; ``None`` if none (or if it cannot be told)."""
        return None

    async def remove(self) -> None:
        """Remove what :meth:`Limiter.group` made (the command's processes are gone by now)."""


class Limiter:
    """Makes one :class:`Group` per command, by this machine's :class:`Mechanism`."""

    mechanism: Mechanism

    def describe(self) -> str:
        """What enforces the limits, in one line."""
        raise NotImplementedError

    def group(self, limits: CommandLimits) -> Group:
        """The limits of one command (set, not yet entered).

        Raises:
            LimitsUnavailable: they could not be set up.
        """
        raise NotImplementedError
