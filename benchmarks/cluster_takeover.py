"""Takeover after ``kill -9``: how long until another node drives a dead node's sessions.

Three nodes with a lease TTL run goals slow enough to be live (a ``delay`` per model call); once
the first node holds sessions of active goals it is killed with SIGKILL. From the kill: how long
its leases still ran (the first and the last to expire, on the database's clock), the time until
the first and until every one of those sessions is leased by another node (polling ``leases``), the
time from the last expiry to the last claim (at most one heartbeat, TTL/3, of the claiming nodes),
and the time until the first and the last of them starts a new turn on its new holder. Run by
``benchmarks/bench_cluster.py`` (its module docstring, item 3).
"""

from __future__ import annotations

import os
import signal
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster_kit import Cluster, all_completed, at, create_goals, duplicate_continuations, until
from pg_measures import Db, bench_role, rpc


@dataclass
class Takeover:
    ttl: float
    sessions: int
    #: How long the victim's leases still ran at the kill (the database's clock), the first to
    #: expire and the last: a lease is not taken before it expires, and is taken at the latest one
    #: heartbeat of the other nodes after it.
    left_min: float
    left_max: float
    first_leased: float
    leased: float
    first_turn: float | None
    last_turn: float | None


async def measure_takeover(root: Path, dsn: str, ttl: float, goals: int) -> Takeover:
    db = Db(bench_role(dsn))
    cluster = Cluster(root, dsn)
    try:
        nodes = cluster.start(3, ttl=ttl)
        # Long enough per goal that the victim's goals are surely live at the kill and after it.
        await create_goals(nodes, goals, f"rounds=8 delay={0.1 if ttl < 10 else 0.3}")
        victim = nodes[0]
        victim_id = (await rpc(victim.socket_path, "daemon/health"))["cluster"]["nodeId"]
        held_sql = (
            "SELECT l.session_id FROM leases l JOIN goals g ON g.session_id = l.session_id"
            " WHERE l.node_id = %s AND g.status = 'active'"
        )

        async def victim_holds() -> list[str]:
            return [r[0] for r in db.q(held_sql, victim_id)]

        await until(victim_holds, "the victim holding live goals", limit=60)
        held = await victim_holds()
        left = db.q(
            "SELECT EXTRACT(EPOCH FROM MIN(expires_at) - clock_timestamp()),"
            " EXTRACT(EPOCH FROM MAX(expires_at) - clock_timestamp()) FROM leases WHERE session_id = ANY(%s)",
            held,
        )[0]
        assert victim.proc is not None
        os.kill(victim.proc.pid, signal.SIGKILL)
        killed_wall, killed = time.time(), time.monotonic()
        victim.proc.wait(30)

        first_leased: list[float] = []

        async def taken() -> bool:
            rows = db.q(
                "SELECT COUNT(*) FROM leases WHERE session_id = ANY(%s) AND node_id IS NOT NULL AND node_id <> %s",
                held,
                victim_id,
            )
            if rows[0][0] and not first_leased:
                first_leased.append(time.monotonic() - killed)
            return bool(rows[0][0] == len(held))

        await until(taken, "the victim's sessions taken over", limit=ttl * 3 + 60)
        leased = time.monotonic() - killed

        def first_turns() -> dict[str, float]:
            rows = db.q(
                "SELECT session_id, MIN(at) FROM events WHERE session_id = ANY(%s) AND type = 'turn/start'"
                " AND data::jsonb->>'node' <> %s GROUP BY session_id",
                held,
                victim_id,
            )
            return {sid: at(when) - killed_wall for sid, when in rows if at(when) >= killed_wall}

        async def all_started() -> bool:
            ended = db.q("SELECT COUNT(*) FROM goals WHERE session_id = ANY(%s) AND status <> 'active'", held)[0][0]
            return bool(len(first_turns()) + ended >= len(held))

        await until(all_started, "a new turn on every taken-over session", limit=60)
        turns = first_turns()
        await all_completed(db, goals, limit=120 + goals * 2)
        if duplicate_continuations(db):
            raise RuntimeError("a continuation was admitted twice after the takeover")
        return Takeover(
            ttl,
            len(held),
            float(left[0]),
            float(left[1]),
            first_leased[0],
            leased,
            min(turns.values(), default=None),
            max(turns.values(), default=None),
        )
    finally:
        db.close()
        cluster.close()


def sec(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def med(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def print_takeovers(takeovers: list[Takeover], ttls: list[float]) -> None:
    print("\ntakeover after kill -9 of one of 3 nodes: seconds from the kill, medians over runs (heartbeat = TTL/3)")
    head = f"{'TTL s':>6} {'runs':>5} {'sessions':>9} {'left min':>8} {'max':>5} {'1st leased':>11} {'all leased':>11}"
    print(f"{head} {'min':>6} {'max':>6} {'after expiry':>12} {'1st turn':>9} {'last turn':>10}")
    for ttl in ttls:
        ts = [t for t in takeovers if t.ttl == ttl]
        if not ts:
            continue
        leased = [t.leased for t in ts]
        print(
            f"{ttl:6g} {len(ts):5d} {statistics.median([t.sessions for t in ts]):9g}"
            f" {statistics.median([t.left_min for t in ts]):8.2f} {statistics.median([t.left_max for t in ts]):5.2f}"
            f" {sec(med([t.first_leased for t in ts])):>11} {sec(med(leased)):>11}"
            f" {min(leased):6.2f} {max(leased):6.2f} {sec(med([t.leased - t.left_max for t in ts])):>12}"
            f" {sec(med([t.first_turn for t in ts if t.first_turn is not None])):>9}"
            f" {sec(med([t.last_turn for t in ts if t.last_turn is not None])):>10}"
        )


async def all_takeovers(server: Any, root: Path, ttls: list[float], runs: int, goals: int) -> list[Takeover]:
    takeovers = []
    for ttl in ttls:
        for k in range(runs):
            t = await measure_takeover(root / f"t{ttl:g}-{k}", server.create_database(), ttl, goals)
            takeovers.append(t)
            print(
                f"takeover TTL {ttl:g} s run {k + 1}: {t.sessions} sessions,"
                f" leases left {t.left_min:.2f}-{t.left_max:.2f} s;"
                f" leased first {t.first_leased:.2f} s,"
                f" all {t.leased:.2f} s; new turn first {sec(t.first_turn)} s, last {sec(t.last_turn)} s",
                flush=True,
            )
    return takeovers
