"""What the cluster benchmarks share: daemons started on one store, goals created and waited for.

``benchmarks/bench_cluster.py`` (rounds, latency) and ``benchmarks/cluster_takeover.py`` (takeover
after ``kill -9``) start real ``goald serve`` processes through the end-to-end harness of
``tests/`` (the ``test:worker`` scripted model, ``READY=1`` over a notify socket). Nothing sleeps a
fixed time: every wait polls the database with a short step and a time limit.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from cpu_caps import Group
from pg_measures import Db, load_test_module, rpc

_harness = load_test_module("harness")
Daemon, TEST_MODELS = _harness.Daemon, _harness.TEST_MODELS
_clusterkit = load_test_module("clusterkit")  # after the harness, which it imports

POLL = 0.02
#: Each PostgreSQL daemon's store connections (``bench_cluster.py --connections``).
CONNECTIONS = 8
#: Each daemon's CPU quota in CPUs (``bench_cluster.py --cpu-per-node``; ``None``: uncapped), as a
#: host of its own would have (``benchmarks/cpu_caps.py``).
CPU_PER_NODE: float | None = None


def load() -> float:
    return os.getloadavg()[0]


async def until(check: Callable[[], Awaitable[Any]], what: str, limit: float, step: float = POLL) -> Any:
    """The tests' wait (``tests/clusterkit.py``), at the benchmark's finer step."""
    return await _clusterkit.until(check, what, limit, step)


@dataclass
class Cluster:
    """Daemons started for one configuration; :meth:`close` kills what still runs."""

    root: Path
    store: str | Path
    nodes: list[Any] = field(default_factory=list)
    #: With ``CPU_PER_NODE``: each node's control group, in the order of ``nodes``.
    groups: list[Group] = field(default_factory=list)

    def start(self, count: int, ttl: float | None = None) -> list[Any]:
        made = []
        for _ in range(count):
            name = f"n{len(self.nodes)}"
            config: dict[str, Any] = {
                **TEST_MODELS,
                "log_level": "WARNING",
                "workdir_roots": [str(self.root / "work")],
                "max_concurrent_turns": 64,
            }
            if isinstance(self.store, str):
                cluster: dict[str, Any] = {"node_name": name}
                if ttl is not None:
                    cluster["lease_ttl_seconds"] = ttl
                config |= {"store": self.store, "cluster": cluster, "store_connections": CONNECTIONS}
            d = Daemon(self.root / name, config=config)
            self.nodes.append(d)
            made.append(d)
        for d in made:
            d.start(timeout=60)
            if CPU_PER_NODE is not None:
                group = Group(f"{self.root.name}-{d.state_dir.name}", CPU_PER_NODE)
                self.groups.append(group)
                group.add(d.proc.pid)
        return made

    def close(self) -> None:
        for d in self.nodes:
            d.close()
        for g in self.groups:
            g.close()


async def create_goals(nodes: list[Any], count: int, directive: str) -> list[str]:
    ids = []
    for i in range(count):
        g = await rpc(
            nodes[i % len(nodes)].socket_path,
            "goal/create",
            {"objective": f"Goal {i}. [{directive}]", "model": "test:worker", "verify": [{"cmd": "true"}]},
        )
        ids.append(g["goalId"])
    return ids


async def all_completed(db: Db, count: int, limit: float, step: float = 0.05) -> None:
    async def done() -> bool:
        counts = dict(db.q("SELECT status, COUNT(*) FROM goals GROUP BY status"))
        ended = sum(v for k, v in counts.items() if k != "active")
        if ended == count and counts.get("completed", 0) != count:
            reasons = db.q(
                "SELECT status, status_reason, COUNT(*) FROM goals WHERE status != 'completed' GROUP BY 1, 2"
            )
            raise RuntimeError(f"goals ended but not all completed: {counts}: {reasons}")
        return bool(counts.get("completed", 0) == count)

    await until(done, f"{count} goals completed", limit, step)


def at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def duplicate_continuations(db: Db) -> int:
    return len(
        db.q(
            "SELECT session_id, source_ref FROM inbox WHERE source_kind = 'goal' AND fate = 'admitted'"
            " GROUP BY session_id, source_ref HAVING COUNT(*) > 1"
        )
    )
