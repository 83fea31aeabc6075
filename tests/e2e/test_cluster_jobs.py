"""The cluster's jobs run on one node at a time (real daemons on one real PostgreSQL).

Pins: of two nodes exactly one runs the notification sender and one retention (``daemon/health``'s
``cluster.jobs``); every goal's notifications reach the webhook, from whichever node; after a
``kill -9`` of the node that sends, the other takes the job over by itself and the notifications of
goals that end afterwards arrive too — none is lost.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import psycopg
import pytest
from clusterkit import until
from harness import TEST_MODELS, Daemon, rpc
from webhook_server import WebhookServer

pytestmark = pytest.mark.timeout(300)


def outbox_ids(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {r[0] for r in conn.execute("SELECT id FROM outbox").fetchall()}


async def jobs_of(d: Daemon) -> set[str]:
    cluster = (await rpc(d.socket_path, "daemon/health"))["cluster"]
    return set(cluster["jobs"]) if cluster is not None else set()  # None: serving, not joined yet


async def test_one_node_sends_and_another_takes_over_after_a_kill(tmp_path: Path, pg_dsn: str) -> None:
    async with WebhookServer() as hook:
        notify = {"retry_first_seconds": 0.05, "retry_max_seconds": 0.3, "group_window_seconds": 0.2}
        nodes = []
        for name in ("a", "b"):
            d = Daemon(
                tmp_path / name,
                config={
                    **TEST_MODELS,
                    "store": pg_dsn,
                    "workdir_roots": [str(tmp_path / "work")],
                    "cluster": {"node_name": name, "lease_ttl_seconds": 3},
                    "notify": notify,
                    "metrics": {"file": str(tmp_path / f"{name}.prom"), "interval_seconds": 0.2},
                },
            )
            d.config_path.write_text(
                d.config_path.read_text()
                + f'[[notify.sinks]]\ntype = "webhook"\nname = "ops"\nurl = "{hook.url}/ops"\n'
            )
            nodes.append(d)
        try:
            for d in nodes:
                d.start()

            async def split() -> tuple[set[str], set[str]] | None:
                a, b = await jobs_of(nodes[0]), await jobs_of(nodes[1])
                return (a, b) if a | b == {"notifications", "retention"} else None

            a_jobs, b_jobs = await until(split, "both jobs taken")

            async def cluster_metrics() -> bool:
                # Each node's metrics are its own; the cluster's view (every node's leases) is in each.
                text = await asyncio.to_thread(_read, tmp_path / "a.prom")
                return 'goald_cluster_node_alive{node="a"' in text and 'goald_cluster_node_alive{node="b"' in text

            await until(cluster_metrics, "the cluster view in node a's metrics")
            assert not a_jobs & b_jobs  # one node each job
            sender = nodes[0] if "notifications" in a_jobs else nodes[1]
            other = nodes[1] if sender is nodes[0] else nodes[0]

            async def goals_through(d: Daemon, n: int) -> None:
                for i in range(n):
                    await rpc(
                        d.socket_path,
                        "goal/create",
                        {"objective": f"Done {i}. [rounds=1]", "model": "test:worker", "verify": [{"cmd": "false"}]},
                    )

            await goals_through(other, 3)  # notifications written on the node that does not send

            async def all_delivered() -> bool:
                ids = outbox_ids(pg_dsn)
                got = {i for r in hook.accepted() for i in r.json.get("ids", [])}
                return bool(ids) and ids <= got

            await until(all_delivered, "every notification delivered")

            assert sender.proc is not None
            os.kill(sender.proc.pid, signal.SIGKILL)
            sender.proc.wait(30)

            async def took_over() -> bool:
                return "notifications" in await jobs_of(other) and "retention" in await jobs_of(other)

            await until(took_over, "the survivor running both jobs")
            before = len(outbox_ids(pg_dsn))
            await goals_through(other, 3)
            await until(lambda: _more(pg_dsn, before), "new notifications written")
            await until(all_delivered, "every notification delivered after the kill")
        finally:
            for d in nodes:
                d.close()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


async def _more(dsn: str, n: int) -> bool:
    return len(outbox_ids(dsn)) > n
