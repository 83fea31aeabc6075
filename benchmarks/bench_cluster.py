"""A cluster: goal rounds, idle → continuation latency and takeover after ``kill -9``, with real daemons.

Every figure comes from real ``goald serve`` processes (the end-to-end harness of ``tests/``: the
``test:worker`` scripted model, ``READY=1`` over a notify socket) on a private PostgreSQL that the
benchmark starts in a temporary directory (``tests/pgkit.py``: fsync off, as the tests run it; as
the ``postgres`` user when run as root), a fresh database per configuration. Nothing sleeps a fixed
time: every wait polls the database with a short step and a time limit. The benchmark's own queries
run as a role of their own, so ``pg_stat_statements`` (loaded for the run) counts the daemons' alone.

What is measured:

1. **Goal rounds per second** with 1, 2 and 3 nodes on one PostgreSQL, and with 1 daemon on
   SQLite for comparison. N goals of R rounds each (``[rounds=R]`` in the objective; a round is
   three instant model calls, a ``write_file`` and the goal engine's decision; ``verify = true`` at
   the end) are created round-robin over the nodes' sockets; the clock runs from the first
   ``goal/create`` to the moment the ``goals`` table says all N are completed. Rounds/s is N·R over
   that wall time. On PostgreSQL, the daemons' statements per round (every statement, ``BEGIN``
   and ``COMMIT`` included, is one client round trip) and write transactions per round (each takes
   the cluster-wide writer lock, ``pg_advisory_xact_lock``) come from ``pg_stat_statements``. A
   check over the inbox counts continuations admitted twice (must be 0). How busy the locks are:
   ``pg_locks`` sampled every 5 ms (:class:`LockSampler`): the share of samples in which the writer
   lock was held alone, held at all, and in which the busiest session's lock was held.
2. **Idle → next continuation**: for every round but a goal's last, from the session's committed
   ``status: idle`` event to the next ``message/queued`` whose source kind is ``goal`` (the goal
   engine's decision), from the events' stored ``at`` timestamps (the writer's clock, microseconds);
   median and p90, under the load of the N goals, and for one goal run alone afterwards on the same
   daemons (its latency without dozens of sessions queued on the same store thread and writer lock).
3. **Takeover after ``kill -9``**: three nodes with ``lease_ttl_seconds`` 3 and 15 (the default)
   run goals slow enough to be live (a ``delay`` per model call); once the first node holds sessions
   of active goals it is killed with SIGKILL. From the kill: how long its leases still ran (the
   first and the last to expire, on the database's clock), the time until the first and until
   every one of those sessions is leased by another node (polling ``leases``), the time from the
   last expiry to the last claim (at most one heartbeat, TTL/3, of the claiming nodes), and the time
   until the first and the last of them starts a new turn on its new holder (the ``turn/start``
   events' ``at`` against the wall clock of the kill: one host, one clock). The victim is killed
   just after it claimed its sessions, so its leases have nearly a whole TTL left: these are
   close to the worst case (TTL + heartbeat); a node that dies at a random moment is replaced
   between TTL − heartbeat and TTL + heartbeat after its death.
With ``--rtt-ms 2,5`` the PostgreSQL configurations run again with the daemons reaching the
database through ``benchmarks/delay_relay.py``, a relay that adds that round trip (this kernel has
no ``netem``; the round trip measured through it is printed, idle before the run and, sampled
with the locks, under the run's load: the relay shares the cores), plus a control: three daemons on three
databases of their own through the same relay, the goals shared out, which shows what the machine
and the link allow when nothing is shared. ``--model-delay 0.2`` makes each model call take 0.2 s,
as a real model's would, so that CPU is not what limits the rounds.

With ``--cpu-per-node C`` (as root) each daemon runs in a control group of its own capped at C CPUs
(``benchmarks/cpu_caps.py``: the kernel's CFS quota), as a host with C cores would give it, and the
table says how many cores each part kept busy over the run: the daemons together, the database
server and the relay (those two accounted, not capped: the database's host and the network). On a
small host this is how several nodes are measured like separate hosts: uncapped, three daemons on
two cores take each other's CPU, and the figure is the host's, not the cluster's (the control shows
it: three daemons on three databases, sharing nothing but the cores, gain no more). Capped, a node
does what C cores let it, and N nodes get N times that only if nothing they share (the database,
its locks, the link) holds them back: the control is the same daemons with nothing shared.

4. **This host's floors**, for reading the above and projecting them to separate hosts: a bare
   ``SELECT 1`` round trip, a write transaction shaped like goald's (``BEGIN``, the writer lock,
   an ``INSERT``, ``COMMIT``), and ``pg_notify`` → delivery to a ``LISTEN`` on another connection.

The machine is shared and small, so the figures are about overhead and correctness on one host, not
speed-up: the nodes compete with each other and the database for the same cores. Each
configuration prints the 1-minute load average at its start, so a reader can tell a noisy figure.

The instruments (the server with ``pg_stat_statements``, the counts, the lock sampler, the relay,
the floors) are ``benchmarks/pg_measures.py``; the daemons and goals ``benchmarks/cluster_kit.py``;
the takeover ``benchmarks/cluster_takeover.py``.

Run: ``python benchmarks/bench_cluster.py [--goals N] [--rounds R] [--runs K] [--takeover-goals G]
[--ttls 3,15] [--skip-takeover] [--rtt-ms 0,2,5] [--model-delay S] [--cpu-per-node C] [--statements]
[--full]``
(``--full``: 300 goals, 5 takeover runs of 30 goals).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cluster_kit
import cpu_caps
from cluster_kit import Cluster, all_completed, at, create_goals, duplicate_continuations, load
from cluster_takeover import Takeover, all_takeovers, print_takeovers
from pg_measures import (
    Db,
    Link,
    LockSampler,
    bench_role,
    pct,
    print_probe,
    print_statements,
    probe,
    reruns,
    round_trips,
    rpc,
    start_server,
    statement_counts,
    statement_table,
)

SOLO_ROUNDS = 20


#: ``--statements``: print each PostgreSQL configuration's statements per round.
SHOW_STATEMENTS = False
#: The node counts measured (``--nodes``), and whether the control runs (``--no-control``).
NODES = (1, 2, 3)
CONTROL = True
#: With ``--cpu-per-node``: the database server's and the relay's CPU (the nodes' groups are their
#: clusters', ``Cluster.groups``).
ACCOUNTS = cpu_caps.Accounts()


def idle_to_continuation(db: Db, only: str | None = None, but: str | None = None) -> list[float]:
    """Seconds from each ``status: idle`` to the next goal continuation queued on the same session
    (of session ``only`` if given, of every session but ``but`` if given)."""
    rows = db.q(
        "SELECT session_id, seq, type, data, at FROM events WHERE type IN ('status', 'message/queued')"
        " ORDER BY session_id, seq"
    )
    rows = [r for r in rows if (only is None or r[0] == only) and r[0] != but]
    out: list[float] = []
    idle_at: float | None = None
    session = None
    for sid, _seq, typ, data, when in rows:
        if sid != session:
            session, idle_at = sid, None
        d = json.loads(data)
        if typ == "status":
            idle_at = at(when) if d.get("status") == "idle" else None
        elif (d.get("source") or {}).get("kind") == "goal" and idle_at is not None:
            out.append(at(when) - idle_at)
            idle_at = None
    return out


def steady(db: Db, but: str | None = None) -> float | None:
    """Rounds per second in the middle of the run: from the 10th to the 90th percentile of the
    rounds' end times (the ramp-up while goals are created and the tail as the last ones finish
    left out)."""
    ends = sorted(
        at(r[1]) for r in db.q("SELECT session_id, ended_at FROM turns WHERE ended_at IS NOT NULL") if r[0] != but
    )
    if len(ends) < 20:
        return None
    lo, hi = len(ends) // 10, len(ends) * 9 // 10
    return (hi - lo) / (ends[hi] - ends[lo]) if ends[hi] > ends[lo] else None


@dataclass
class Rounds:
    label: str
    seconds: float
    rounds: int
    latencies: list[float]
    solo: list[float]
    duplicates: int
    load: float
    #: PostgreSQL only: the daemons' statements (BEGIN and COMMIT included: one client round trip
    #: each) and write transactions (each takes the cluster-wide writer lock) over the run.
    statements: int | None = None
    writes: int | None = None
    #: PostgreSQL only: the daemons' client round trips over the run (see round_trips).
    trips: int | None = None
    #: Rounds per second in the middle of the run (:func:`steady`).
    steady: float | None = None
    #: PostgreSQL only: the locks' busy shares (:class:`LockSampler`): exclusive, shared, busiest session.
    locks: tuple[float, float, float] | None = None
    #: Through a relay: its median round trip while the run went (:class:`LockSampler`), in ms.
    link_ms: float | None = None
    #: PostgreSQL only: writes run again on a session changed since their node last wrote it.
    reruns: int | None = None
    #: With ``--cpu-per-node``: cores busy on average over the run: the nodes together, the
    #: database server, the relay.
    cores: tuple[float, float, float] | None = None


async def measure_rounds(
    label: str, root: Path, store: str | Path, nodes: int, goals: int, rounds: int, link: Link | None = None
) -> Rounds:
    """``goals`` goals of ``rounds`` rounds on ``nodes`` daemons of one store; with ``link``, the
    daemons reach PostgreSQL through its delaying relay (the benchmark's own queries do not)."""
    started_load = load()
    link = link or Link()
    cluster = Cluster(root, link.dsn(store) if isinstance(store, str) else store)
    db: Db | None = None
    try:
        live = cluster.start(nodes)
        db = Db(bench_role(store) if isinstance(store, str) else root / "n0" / "goald.db")
        before = statement_counts(db)
        trips_before = await round_trips(live)
        table = statement_table(db) if SHOW_STATEMENTS else {}
        t0 = time.perf_counter()
        ACCOUNTS.mark(cluster.groups)
        await create_goals(live, goals, f"rounds={rounds}{link.directive}")
        print(f"{label}: {goals} goals created in {time.perf_counter() - t0:.1f} s", flush=True)
        sampler = LockSampler(bench_role(store), link) if isinstance(store, str) else None
        try:
            await all_completed(db, goals, limit=120 + goals * rounds * (1 + 10 * link.model_delay))
        finally:
            locks = sampler.stop() if sampler is not None else None
        seconds = time.perf_counter() - t0
        cores = ACCOUNTS.cores(cluster.groups)
        after = statement_counts(db)
        trips_after, rerun = await round_trips(live), await reruns(live)
        done = sum(r[0] for r in db.q("SELECT rounds FROM goals"))
        if SHOW_STATEMENTS and not isinstance(store, Path):
            print_statements(label, table, statement_table(db), done)
        # One goal alone afterwards: its latency without 59 other sessions queued on the same writer.
        solo = await rpc(
            live[-1].socket_path,
            "goal/create",
            {
                "objective": f"Alone. [rounds={SOLO_ROUNDS}{link.directive}]",
                "model": "test:worker",
                "verify": [{"cmd": "true"}],
            },
        )
        await all_completed(db, goals + 1, limit=120 + SOLO_ROUNDS * 10 * link.model_delay)
        out = Rounds(
            label,
            seconds,
            done,
            idle_to_continuation(db, but=solo["sessionId"]),
            idle_to_continuation(db, only=solo["sessionId"]),
            duplicate_continuations(db),
            started_load,
        )
        if before is not None and after is not None:
            out.statements, out.writes = after[0] - before[0], after[1] - before[1]
        if trips_before is not None and trips_after is not None:
            out.trips = trips_after - trips_before
        out.steady = steady(db, but=solo["sessionId"])
        out.locks = locks
        out.link_ms = sampler.link_ms() if sampler is not None else None
        out.reruns = rerun
        out.cores = cores
        return out
    finally:
        if db is not None:
            db.close()
        cluster.close()


def print_rounds(results: list[Rounds], goals: int, rounds: int, model_delay: float = 0.0) -> None:
    model = f"{model_delay:g} s per model call" if model_delay else "instant"
    print(f"\n{goals} goals x {rounds} rounds, test:worker ({model}), created round-robin over the nodes")
    print(f"idle -> continuation in ms: under that load, and of one goal alone afterwards ({SOLO_ROUNDS} rounds)")
    print(
        "stmts/round, trips/round, writes/round: the daemons' statements, client round trips and"
        " writer-locked transactions per round (PostgreSQL)"
    )
    print("steady: rounds/s from the 10th to the 90th percentile of the rounds' end times")
    print(
        "locks: % of samples (every 5 ms, after the goals' creation) in which the writer lock was held"
        " alone / held at all / the busiest session's lock was held (PostgreSQL)"
    )
    print("link ms: through the relay, the median round trip of a SELECT 1 while the run went (its load on it)")
    if cluster_kit.CPU_PER_NODE is not None:
        print(
            f"cores: each daemon capped at {cluster_kit.CPU_PER_NODE:g} CPU (a cgroup of its own); cores busy on"
            " average over the run: the daemons together / the database server / the relay (uncapped)"
        )
    head = f"{'configuration':<20} {'rounds/s':>8} {'steady':>6} {'wall s':>6} {'p50':>6} {'p90':>6}"
    head += f" {'alone p50':>9} {'p90':>6}"
    head += f" {'stmts/round':>11} {'trips/round':>11} {'writes/round':>12}"
    print(f"{head} {'locks %':>13} {'link ms':>7} {'dup':>3} {'load':>4} {'cores':>14}")
    for r in results:
        stmts = "-" if r.statements is None else f"{r.statements / r.rounds:.0f}"
        trips = "-" if r.trips is None else f"{r.trips / r.rounds:.0f}"
        writes = "-" if r.writes is None else f"{r.writes / r.rounds:.1f}"
        rate = "-" if r.steady is None else f"{r.steady:.1f}"
        locks = "-" if r.locks is None else "/".join(f"{share * 100:.0f}" for share in r.locks)
        link = "-" if r.link_ms is None else f"{r.link_ms:.2f}"
        cores = "-" if r.cores is None else "/".join(f"{c:.2f}" for c in r.cores)
        print(
            f"{r.label:<20} {r.rounds / r.seconds:8.1f} {rate:>6} {r.seconds:6.1f}"
            f" {statistics.median(r.latencies) * 1000:6.1f} {pct(r.latencies, 0.9) * 1000:6.1f}"
            f" {statistics.median(r.solo) * 1000:9.1f} {pct(r.solo, 0.9) * 1000:6.1f}"
            f" {stmts:>11} {trips:>11} {writes:>12} {locks:>13} {link:>7} {r.duplicates:3d} {r.load:4.1f}"
            f" {cores:>14}"
        )


async def all_rounds(
    server: Any, root: Path, goals: int, rounds: int, rtts: list[float] | None = None, model_delay: float = 0.0
) -> list[Rounds]:
    """Every configuration: SQLite and 1, 2, 3 PostgreSQL nodes directly; for each round trip of
    ``rtts`` above 0, 1, 2 and 3 nodes through the delaying relay and the control (3 daemons on 3
    databases of their own through the same relay, each with a third of the goals)."""
    results = []
    for rtt in rtts or [0.0]:
        link = Link(rtt, model_delay)
        link.start(server.port, server.create_database())
        ACCOUNTS.link(link.proc.pid if link.proc is not None else None)
        try:
            at = f", {rtt:g} ms" if rtt else ""
            configs: list[tuple[str, str | Path, int]] = [] if rtt else [("SQLite, 1 daemon", root / "sqlite", 1)]
            configs += [(f"PostgreSQL{at}, {n} node{'s' * (n > 1)}", "", n) for n in NODES]
            for label, store, count in configs:
                where = root / f"c{len(results)}"
                r = await measure_rounds(label, where, store or server.create_database(), count, goals, rounds, link)
                results.append(_said(r, link))
            if rtt and CONTROL:
                dbs = [server.create_database() for _ in range(3)]
                r = await measure_control(f"control{at}, 3 dbs", root / f"c{len(results)}", dbs, goals, rounds, link)
                results.append(_said(r, link))
        finally:
            link.stop()
            ACCOUNTS.link(None)
    return results


def _said(r: Rounds, link: Link) -> Rounds:
    trip = f"; measured round trip {link.measured_ms:.2f} ms" if link.measured_ms is not None else ""
    trip += f"; {r.reruns} writes run again (their session changed)" if r.reruns is not None else ""
    print(
        f"{r.label}: {r.rounds} rounds in {r.seconds:.1f} s = {r.rounds / r.seconds:.1f} rounds/s;"
        f" idle->continuation median {statistics.median(r.latencies) * 1000:.1f} ms (load {r.load:.1f}){trip}",
        flush=True,
    )
    return r


async def measure_control(label: str, root: Path, dbs: list[str], goals: int, rounds: int, link: Link) -> Rounds:
    """The control: one daemon on each of ``dbs`` (a database of its own, through ``link``), the goals
    shared out, all at once; what the machine and the link allow when nothing is shared."""
    started_load = load()
    clusters = [Cluster(root / f"d{i}", link.dsn(dsn)) for i, dsn in enumerate(dbs)]
    readers: list[Db] = []
    try:
        lives = [c.start(1) for c in clusters]
        readers = [Db(bench_role(dsn)) for dsn in dbs]
        shares = [goals // len(dbs) + (1 if i < goals % len(dbs) else 0) for i in range(len(dbs))]
        t0 = time.perf_counter()
        ACCOUNTS.mark([g for c in clusters for g in c.groups])
        for live, share in zip(lives, shares, strict=True):
            await create_goals(live, share, f"rounds={rounds}{link.directive}")
        limit = 120 + goals * rounds * (1 + 10 * link.model_delay)
        for db, share in zip(readers, shares, strict=True):
            await all_completed(db, share, limit=limit)
        seconds = time.perf_counter() - t0
        cores = ACCOUNTS.cores([g for c in clusters for g in c.groups])
        done = sum(r[0] for db in readers for r in db.q("SELECT rounds FROM goals"))
        latencies = [x for db in readers for x in idle_to_continuation(db)]
        duplicates = sum(duplicate_continuations(db) for db in readers)
        out = Rounds(label, seconds, done, latencies, latencies, duplicates, started_load)
        rates = [steady(db) for db in readers]
        out.steady = sum(r for r in rates if r is not None) if all(r is not None for r in rates) else None
        out.cores = cores
        return out
    finally:
        for db in readers:
            db.close()
        for c in clusters:
            c.close()


async def run(args: argparse.Namespace) -> None:
    server = start_server()
    if cluster_kit.CPU_PER_NODE is not None:
        ACCOUNTS.server(int((server.data_dir / "postmaster.pid").read_text().splitlines()[0]))
    print(f"PostgreSQL {server.bin_dir.parent.name} on 127.0.0.1:{server.port} (fsync off, as the tests run it)")
    takeovers: list[Takeover] = []
    try:
        floors = probe(server.create_database())
        with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
            # As root, commands run as the sandbox user: it must pass through to the work directories.
            os.chmod(tmp, 0o711)
            results = await all_rounds(server, Path(tmp), args.goals, args.rounds, args.rtt_ms, args.model_delay)
            if not args.skip_takeover:
                takeovers = await all_takeovers(server, Path(tmp), args.ttls, args.runs, args.takeover_goals)
    finally:
        server.stop()
        ACCOUNTS.close()
    print_probe(floors)
    print_rounds(results, args.goals, args.rounds, args.model_delay)
    if takeovers:
        print_takeovers(takeovers, args.ttls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--goals", type=int, default=60, help="goals per configuration")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per goal")
    parser.add_argument("--runs", type=int, default=3, help="takeover runs per TTL")
    parser.add_argument("--takeover-goals", type=int, default=15, help="goals on the three nodes of a takeover run")
    parser.add_argument(
        "--ttls", type=lambda s: [float(x) for x in s.split(",")], default=[3.0, 15.0], help="lease TTLs, e.g. 3,15"
    )
    parser.add_argument("--skip-takeover", action="store_true", help="measure rounds and latency only")
    parser.add_argument(
        "--rtt-ms",
        type=lambda s: [float(x) for x in s.split(",")],
        default=[0.0],
        help="round trips to PostgreSQL to measure, e.g. 0,2,5 (above 0: through benchmarks/delay_relay.py)",
    )
    parser.add_argument(
        "--model-delay", type=float, default=0.0, help="seconds each model call takes (e.g. 0.2: a real model's)"
    )
    parser.add_argument(
        "--nodes", type=lambda s: tuple(int(x) for x in s.split(",")), default=(1, 2, 3), help="node counts, e.g. 1,3"
    )
    parser.add_argument("--no-control", action="store_true", help="leave out the control of 3 databases")
    parser.add_argument(
        "--connections", type=int, default=8, help="store connections of each PostgreSQL daemon (store_connections)"
    )
    parser.add_argument(
        "--cpu-per-node",
        type=float,
        default=None,
        help="cap each daemon at this many CPUs, as a host of its own would have (a cgroup each; root)",
    )
    parser.add_argument(
        "--statements", action="store_true", help="print each PostgreSQL configuration's statements per round"
    )
    parser.add_argument(
        "--full", action="store_true", help="300 goals per configuration; 5 takeover runs per TTL of 30 goals"
    )
    args = parser.parse_args()
    global SHOW_STATEMENTS, NODES, CONTROL
    SHOW_STATEMENTS, NODES, CONTROL = args.statements, args.nodes, not args.no_control
    cluster_kit.CONNECTIONS = args.connections
    if args.cpu_per_node is not None:
        why = cpu_caps.available()
        if why is not None:
            parser.error(f"--cpu-per-node: CPU quotas cannot be set here: {why}")
        cluster_kit.CPU_PER_NODE = args.cpu_per_node
    if args.full:
        args.goals, args.runs, args.takeover_goals = (
            max(args.goals, 300),
            max(args.runs, 5),
            max(args.takeover_goals, 30),
        )
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
