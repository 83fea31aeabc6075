"""Each node a host of its own: a CPU quota per process group, and what each group used.

A cluster's nodes run on separate machines; on one small host they take each other's cores, so a
benchmark of several nodes measures the host, not the cluster (three daemons on two cores cannot run
three times one daemon's rounds, however little they share). ``bench_cluster.py --cpu-per-node C``
gives each daemon a control group of its own capped at C CPUs (the kernel's CFS quota: C × 100 ms
of CPU time per 100 ms), as a host with C cores would, and accounts the CPU time of every group: each
node, the database server and the delaying relay (both uncapped: the database's host and the
network). The figures then say what a node does with C cores, and whether N nodes get N times it.

Made by the benchmark as root and removed after. cgroup v2 (``cpu.max``, ``cpu.stat``) where the
``cpu`` controller is on the unified hierarchy, else v1 (``cpu.cfs_quota_us`` and ``cpuacct.usage``).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000


def _v2() -> bool:
    controllers = ROOT / "cgroup.controllers"
    return controllers.exists() and "cpu" in controllers.read_text().split()


class Group:
    """One process group: ``cpus`` is its quota (``None``: no cap, accounted only)."""

    def __init__(self, name: str, cpus: float | None) -> None:
        self.name, self.cpus = name, cpus
        tag = f"goald-bench-{os.getpid()}-{name}"
        if _v2():
            parent = ROOT
            (parent / "cgroup.subtree_control").write_text("+cpu")
            self.dirs = [parent / tag]
        else:
            self.dirs = [ROOT / "cpu" / tag, ROOT / "cpuacct" / tag]
        for d in self.dirs:
            d.mkdir()
        if cpus is not None:
            quota = max(1000, int(cpus * PERIOD_US))
            if _v2():
                (self.dirs[0] / "cpu.max").write_text(f"{quota} {PERIOD_US}")
            else:
                (self.dirs[0] / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                (self.dirs[0] / "cpu.cfs_quota_us").write_text(str(quota))
        self._t0 = time.perf_counter()
        self._used0 = self.used()

    def add(self, pid: int) -> None:
        """``pid`` and every thread of it; what it forks later is in the group too."""
        for d in self.dirs:
            (d / "cgroup.procs").write_text(str(pid))

    def used(self) -> float:
        """CPU seconds used by the group's processes so far."""
        if _v2():
            for line in (self.dirs[0] / "cpu.stat").read_text().splitlines():
                key, value = line.split()
                if key == "usage_usec":
                    return int(value) / 1e6
            return 0.0
        return int((self.dirs[1] / "cpuacct.usage").read_text()) / 1e9

    def mark(self) -> None:
        """Start a new measurement window (:meth:`busy` counts from here)."""
        self._t0, self._used0 = time.perf_counter(), self.used()

    def busy(self) -> float:
        """Cores busy on average since the last :meth:`mark`."""
        elapsed = time.perf_counter() - self._t0
        return (self.used() - self._used0) / elapsed if elapsed > 0 else 0.0

    def close(self) -> None:
        """Move what still runs in the group back to the root, and remove the group."""
        for d in self.dirs:
            if not d.exists():
                continue
            for pid in (d / "cgroup.procs").read_text().split():
                try:
                    (d.parent / "cgroup.procs").write_text(pid)
                except OSError:
                    pass  # exited meanwhile
            d.rmdir()


def family(pid: int) -> list[int]:
    """``pid`` and the processes it has forked so far (a server's workers, started before its group)."""
    out = [pid]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def available() -> str | None:
    """Why CPU quotas cannot be set here, or ``None`` if they can (a capped group made and removed)."""
    if os.geteuid() != 0:
        return "not root"
    if not (_v2() or (ROOT / "cpu" / "cpu.cfs_quota_us").exists()):
        return "no cgroup cpu controller"
    try:
        Group("probe", 0.5).close()
    except OSError as exc:  # e.g. a container whose cgroup root may not delegate the cpu controller
        return f"a capped cgroup cannot be made: {exc}"
    return None


class Accounts:
    """What a run accounts besides its nodes (capped in groups of their own): the database server
    and the delaying relay, neither capped — the database's host and the network."""

    def __init__(self) -> None:
        self.db: Group | None = None
        self.relay: Group | None = None

    def server(self, postmaster: int) -> None:
        """Account the database server: its postmaster, the workers it has and every backend it forks."""
        self.db = Group("db", None)
        self.db.add(postmaster)
        for pid in family(postmaster)[1:]:
            with contextlib.suppress(ProcessLookupError):  # a worker that ended meanwhile
                self.db.add(pid)

    def link(self, pid: int | None) -> None:
        """Account the relay of the next runs (``None``: there is none)."""
        if self.relay is not None:
            self.relay.close()
            self.relay = None
        if pid is not None and self.db is not None:
            self.relay = Group("relay", None)
            self.relay.add(pid)

    def mark(self, nodes: list[Group]) -> None:
        """Start a run's window, for ``nodes`` and the accounted groups."""
        for g in [*nodes, self.db, self.relay]:
            if g is not None:
                g.mark()

    def cores(self, nodes: list[Group]) -> tuple[float, float, float] | None:
        """Cores busy since :meth:`mark`: ``nodes`` together, the database server, the relay
        (``None`` unless the server is accounted)."""
        if self.db is None:
            return None
        return (sum(g.busy() for g in nodes), self.db.busy(), self.relay.busy() if self.relay is not None else 0.0)

    def close(self) -> None:
        self.link(None)
        if self.db is not None:
            self.db.close()
            self.db = None
