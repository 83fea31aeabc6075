"""Limits per sandboxed command: a cap on its processes and its memory, for the command as a whole.

Why cgroups. A command is many processes (bash, its pipelines, whatever they fork), and the daemon
often runs as root. As root ``RLIMIT_NPROC`` does not bind at all (65 processes were started under
``ulimit -u 20``, also with bwrap's ``--uid 1000``), and ``RLIMIT_AS`` binds each process, not the
command: twenty processes under a 1 GiB cap may take 20 GiB. A cgroup counts every process of the
command together, and its limits bind root as well. So each command gets a cgroup of its own:

* **cgroup v2, where it is delegated to us** (systemd's ``Delegate=yes``): our own group must let
  us enable ``pids`` and ``memory`` for children. A v2 group that has children with controllers may
  hold no process itself, so the daemon first moves itself into a leaf ``goald-daemon`` beside the
  command groups (what systemd asks of delegated subtrees). Limits: ``pids.max``, ``memory.max``
  (and ``memory.swap.max = 0``, so a hog cannot escape into swap); verdicts: ``pids.events`` and
  ``memory.events``.
* **cgroup v1** otherwise, when the ``pids`` and ``memory`` hierarchies are mounted and our own
  group in each is writable: ``pids.max``, ``memory.limit_in_bytes`` (and ``memsw`` when swap is
  accounted); verdicts: ``pids.events`` and ``memory.oom_control``'s ``oom_kill``.
* **rlimits** when neither is writable, said once in a warning at start: ``RLIMIT_AS`` on each
  process (the memory cap), ``RLIMIT_NPROC`` only when not root (it counts every process of the
  daemon's user, so it is set to that count plus the cap). A hit limit is then not explained.

How a command enters its group before it runs anything: bwrap is started with ``--args FD`` on a
pipe whose write end the daemon still holds. bwrap reads its arguments before it does anything
else, so it waits there; the daemon writes bwrap's PID into the group (or sets its rlimits with
``prlimit``), then writes the arguments (the secrets, or nothing) and closes the pipe. Everything
bwrap starts inherits the group. No ``preexec_fn`` (unsafe in a threaded process), and nothing
that needs ``clone3(CLONE_INTO_CGROUP)``, which Python does not offer. A long-running command
started by a spawner that hands us no PID before it runs (an MCP server, through the SDK) is
started by a launching bash of the daemon's own (:meth:`Group.entry_script`): it writes its own
PID into the group (or sets its rlimits) and only then execs bwrap, or exits 70; nothing of
the server runs before that, so it is as early as the daemon writing the PID itself.

After the command (once its PID namespace is empty, see :mod:`agent.sandbox`) the verdict is read
— ``process limit (N) reached`` or ``memory limit (X MiB) exceeded`` — and the group is removed.
Groups left by a daemon that was killed are removed when the next daemon detects its mechanism
(their names carry the PID of the daemon that made them).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import os
import re
import resource
import shlex
import threading
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

from agent.errors import AgentError

MIB = 1024 * 1024
#: The smallest caps accepted: bwrap itself is two processes and a few MiB.
MIN_PROCESSES = 8
MIN_MEMORY_BYTES = 16 * MIB
_PREFIX = "goald-"
_LEAF = "goald-daemon"
_STALE = re.compile(r"^goald-(\d+)-\d+$")


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

    mechanism: Mechanism = Mechanism.RLIMIT

    def describe(self) -> str:
        """What enforces the limits, in one line."""
        return "rlimits per process (RLIMIT_AS; RLIMIT_NPROC only when not root)"

    def group(self, limits: CommandLimits) -> Group:
        """The limits of one command (set, not yet entered).

        Raises:
            LimitsUnavailable: they could not be set up.
        """
        return _RlimitGroup(limits)


# -- cgroups -----------------------------------------------------------------------------------

_seq = itertools.count(1)


def _write(path: Path, value: str) -> None:
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


def _clean_stale(parent: Path) -> None:
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
                _write(path / "cgroup.procs", str(pid))
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


class _V1(Limiter):
    mechanism = Mechanism.CGROUP_V1

    def __init__(self, bases: dict[str, Path]) -> None:
        self.bases = bases

    def describe(self) -> str:
        return "cgroup v1 (" + ", ".join(f"{c} under {p}" for c, p in self.bases.items()) + ")"

    def group(self, limits: CommandLimits) -> Group:
        name = f"{_PREFIX}{os.getpid()}-{next(_seq)}"
        dirs: dict[str, Path] = {}
        try:
            if limits.max_processes is not None:
                dirs["pids"] = self.bases["pids"] / name
                dirs["pids"].mkdir()
                _write(dirs["pids"] / "pids.max", str(limits.max_processes))
            if limits.max_memory_bytes is not None:
                dirs["memory"] = path = self.bases["memory"] / name
                path.mkdir()
                _write(path / "memory.limit_in_bytes", str(limits.max_memory_bytes))
                if (path / "memory.memsw.limit_in_bytes").exists():
                    _write(path / "memory.memsw.limit_in_bytes", str(limits.max_memory_bytes))
        except OSError as exc:
            for path in dirs.values():
                with contextlib.suppress(OSError):
                    path.rmdir()
            raise LimitsUnavailable(f"cannot set up the command's cgroup: {exc}") from None
        return _CgroupGroup(limits, dirs, 1)


class _V2(Limiter):
    mechanism = Mechanism.CGROUP_V2

    def __init__(self, base: Path) -> None:
        self.base = base

    def describe(self) -> str:
        return f"cgroup v2 (delegated: {self.base})"

    def group(self, limits: CommandLimits) -> Group:
        path = self.base / f"{_PREFIX}{os.getpid()}-{next(_seq)}"
        try:
            path.mkdir()
            if limits.max_processes is not None:
                _write(path / "pids.max", str(limits.max_processes))
            if limits.max_memory_bytes is not None:
                _write(path / "memory.max", str(limits.max_memory_bytes))
                if (path / "memory.swap.max").exists():
                    _write(path / "memory.swap.max", "0")
        except OSError as exc:
            with contextlib.suppress(OSError):
                path.rmdir()
            raise LimitsUnavailable(f"cannot set up the command's cgroup: {exc}") from None
        return _CgroupGroup(limits, {"pids": path, "memory": path}, 2)


# -- rlimits -----------------------------------------------------------------------------------


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


# -- detection ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Mount:
    root: str
    point: Path
    fstype: str
    options: frozenset[str]


def _mounts() -> list[_Mount]:
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if len(fields) < 5 or len(rest) < 3 or not rest[0].startswith("cgroup"):
                continue
            point = fields[4].replace("\\040", " ")
            found.append(_Mount(fields[3], Path(point), rest[0], frozenset(rest[2].split(","))))
    return found


def _own_groups() -> dict[str, str]:
    """Our group in each hierarchy: controller name (``""`` for v2) -> path."""
    groups: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                groups[controller] = path
    return groups


def _located(mount: _Mount, path: str) -> Path | None:
    """Where the group ``path`` is under ``mount`` (which may show only part of the hierarchy)."""
    rel = os.path.relpath(path, mount.root)
    if rel.startswith(".."):
        return None
    return Path(os.path.normpath(mount.point / rel))


def _writable_child(base: Path) -> bool:
    probe = base / f"{_PREFIX}{os.getpid()}-0"
    try:
        probe.mkdir()
    except FileExistsError:
        pass
    except OSError:
        return False
    with contextlib.suppress(OSError):
        probe.rmdir()
    return True


def _detect_v1(groups: dict[str, str], mounts: list[_Mount]) -> _V1 | None:
    bases: dict[str, Path] = {}
    for controller in ("pids", "memory"):
        path = groups.get(controller)
        mount = next((m for m in mounts if m.fstype == "cgroup" and controller in m.options), None)
        if path is None or mount is None:
            return None
        base = _located(mount, path)
        if base is None or not base.is_dir():
            return None
        _clean_stale(base)
        if not _writable_child(base):
            return None
        bases[controller] = base
    return _V1(bases)


def _detect_v2(groups: dict[str, str], mounts: list[_Mount]) -> _V2 | None:
    path = groups.get("")
    mount = next((m for m in mounts if m.fstype == "cgroup2"), None)
    if path is None or mount is None:
        return None
    own = _located(mount, path)
    if own is None:
        return None
    try:
        available = set((own / "cgroup.controllers").read_text().split())
    except OSError:
        return None
    if not {"pids", "memory"} <= available:
        return None
    # A group that we are in (and is not the root) cannot enable controllers for its children:
    # the daemon moves into a leaf of its own first. Started again in that leaf, the base is its parent.
    base = own.parent if own.name == _LEAF else own
    moved = False
    try:
        enabled = set((base / "cgroup.subtree_control").read_text().split())
        if not {"pids", "memory"} <= enabled:
            if base == own and own != mount.point:
                leaf = own / _LEAF
                leaf.mkdir(exist_ok=True)
                _write(leaf / "cgroup.procs", str(os.getpid()))
                moved = True
            _write(base / "cgroup.subtree_control", "+pids +memory")
    except OSError as exc:
        logger.debug("cgroup v2 at {} is not delegated to us: {}", base, exc)
        if moved:  # other processes share the group: go back where we were
            with contextlib.suppress(OSError):
                _write(own / "cgroup.procs", str(os.getpid()))
                (own / _LEAF).rmdir()
        return None
    _clean_stale(base)
    return _V2(base) if _writable_child(base) else None


_lock = threading.Lock()
_limiter: Limiter | None = None


def limiter() -> Limiter:
    """This process's limiter, detected on first use (v2 delegated, else v1, else rlimits); a
    fallback to rlimits is logged once, as a warning."""
    global _limiter
    with _lock:
        if _limiter is None:
            groups, mounts = _own_groups(), _mounts()
            found: Limiter | None = _detect_v2(groups, mounts) or _detect_v1(groups, mounts)
            if found is None:
                found = Limiter()
                logger.warning(
                    "no writable cgroup (a delegated cgroup v2 subtree, or cgroup v1 pids and memory): command "
                    "limits fall back to rlimits, memory per process and processes only when not root; see {}",
                    "systemd/README.md",
                )
            else:
                logger.info("command limits: {}", found.describe())
            _limiter = found
        return _limiter
