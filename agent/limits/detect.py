"""Which mechanism limits commands on this machine, found once per process.

Read from ``/proc/self/mountinfo`` (the cgroup mounts) and ``/proc/self/cgroup`` (our group in
each hierarchy): a delegated cgroup v2 subtree first, else cgroup v1's ``pids`` and ``memory``,
else rlimits, said once as a warning. Detecting a cgroup mechanism also removes the groups (goals'
and commands') of daemons that no longer run.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

from agent.limits.base import Limiter
from agent.limits.cgroup import LEAF, PREFIX, V1Limiter, V2Limiter, write
from agent.limits.rlimit import RlimitLimiter
from agent.limits.stale import clean_stale


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
    probe = base / f"{PREFIX}{os.getpid()}-0"
    try:
        probe.mkdir()
    except FileExistsError:
        pass
    except OSError:
        return False
    with contextlib.suppress(OSError):
        probe.rmdir()
    return True


def _detect_v1(groups: dict[str, str], mounts: list[_Mount]) -> V1Limiter | None:
    bases: dict[str, Path] = {}
    for controller in ("pids", "memory"):
        path = groups.get(controller)
        mount = next((m for m in mounts if m.fstype == "cgroup" and controller in m.options), None)
        if path is None or mount is None:
            return None
        base = _located(mount, path)
        if base is None or not base.is_dir():
            return None
        clean_stale(base)
        if not _writable_child(base):
            return None
        bases[controller] = base
    return V1Limiter(bases)


def _detect_v2(groups: dict[str, str], mounts: list[_Mount]) -> V2Limiter | None:
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
    base = own.parent if own.name == LEAF else own
    moved = False
    try:
        enabled = set((base / "cgroup.subtree_control").read_text().split())
        if not {"pids", "memory"} <= enabled:
            if base == own and own != mount.point:
                leaf = own / LEAF
                leaf.mkdir(exist_ok=True)
                write(leaf / "cgroup.procs", str(os.getpid()))
                moved = True
            write(base / "cgroup.subtree_control", "+pids +memory")
    except OSError as exc:
        logger.debug("cgroup v2 at {} is not delegated to us: {}", base, exc)
        if moved:  # other processes share the group: go back where we were
            with contextlib.suppress(OSError):
                write(own / "cgroup.procs", str(os.getpid()))
                (own / LEAF).rmdir()
        return None
    clean_stale(base)
    return V2Limiter(base) if _writable_child(base) else None


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
                found = RlimitLimiter()
                logger.warning(
                    "no writable cgroup (a delegated cgroup v2 subtree, or cgroup v1 pids and memory): limits fall "
                    "back to rlimits, set per command and not per goal (parallel calls each get the goal's caps), "
                    "memory per process and processes only when not root; see {}",
                    "systemd/README.md",
                )
            else:
                logger.info("limits: {}", found.describe())
            _limiter = found
        return _limiter
