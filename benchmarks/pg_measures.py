"""What :mod:`bench_cluster`'s PostgreSQL figures are made of: the server, the statement and
round-trip counts, the lock sampler, the delaying link and this host's floors.

Split from the benchmark so that it reads as the measurement it runs: the instruments here are the
ones its docstring names (``pg_stat_statements`` counted as the daemons' role, ``pg_locks`` sampled
every 5 ms, ``benchmarks/delay_relay.py`` between the daemons and the server, the bare round trip,
write and ``NOTIFY`` floors). Imported by ``bench_cluster.py``, which runs as a script from this
directory.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg

from agent.backends import SESSION_LOCKS, WRITER_LOCK


def load_test_module(name: str) -> ModuleType:
    """A module of ``tests/`` (the harness, pgkit), loaded once by path."""
    if name in sys.modules:
        return sys.modules[name]
    # Loaded by path: ``tests/`` on sys.path would shadow the packages with its test folders of the
    # same names (``tests/agent``, ``tests/daemon``, ...).
    path = Path(__file__).parents[1] / "tests" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_harness = load_test_module("harness")
_pgkit = load_test_module("pgkit")
rpc, PgServer = _harness.rpc, _pgkit.PgServer


#: The role the benchmark's own queries run as, so that the statement counts are the daemons' alone.
BENCH_ROLE = "bench"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Db:
    """Read-only queries on the store the daemons share (PostgreSQL DSN or SQLite file)."""

    def __init__(self, store: str | Path) -> None:
        self.store = store
        # One connection for the whole measurement: a connect per poll would cost more than the poll.
        self._pg: psycopg.Connection[Any] | None = None

    def q(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        if isinstance(self.store, Path):
            conn = sqlite3.connect(f"file:{self.store}?mode=ro", uri=True, timeout=30)
            try:
                return conn.execute(sql.replace("%s", "?"), args).fetchall()
            finally:
                conn.close()
        if self._pg is None:
            self._pg = psycopg.connect(self.store, autocommit=True)
        return self._pg.execute(sql, args).fetchall()

    def close(self) -> None:
        if self._pg is not None:
            self._pg.close()
            self._pg = None


def bench_role(dsn: str) -> str:
    """``dsn`` (``postgresql://goald@…``) with the benchmark's own role instead of the daemons'."""
    return dsn.replace(f"//{_pgkit.USER}@", f"//{BENCH_ROLE}@", 1)


def statement_counts(db: Db) -> tuple[int, int] | None:
    """``pg_stat_statements``' calls by the daemons' role in this database so far: all statements
    and the writer lock's (exclusive, or shared with the session's in ``goald_begin`` or
    ``goald_check``: one per write transaction); round trips are counted by the daemons
    (:func:`round_trips`). None on SQLite."""
    if isinstance(db.store, Path):
        return None
    rows = db.q(
        "SELECT COALESCE(SUM(calls), 0), COALESCE(SUM(calls) FILTER (WHERE query LIKE '%%pg_advisory_xact_lock%%'"
        " OR query LIKE '%%goald_begin(%%' OR query LIKE '%%goald_check(%%'), 0),"
        " COALESCE(SUM(calls) FILTER (WHERE query LIKE '%%pg_advisory_xact_lock(%%hashtext%%'), 0)"
        " FROM benchstats.pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid"
        " WHERE r.rolname = %s AND s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
        _pgkit.USER,
    )
    # A write bound to a session takes both its locks in ``goald_begin`` or, opened on the state the
    # node knows, ``goald_check`` (agent.schema's versions 6 and 7);
    # one that needs the cluster to itself, the writer lock alone. A session's lock (``hashtext``)
    # taken alone is a further session of a transaction that has its writer lock already.
    total, locks, session_locks = (int(v) for v in rows[0])
    return total, locks - session_locks


async def round_trips(nodes: list[Any]) -> int | None:
    """The daemons' client round trips to PostgreSQL so far, as each counts them (``daemon/health``'s
    ``storeRoundTrips``: every statement, or text of statements sent together, is one). None on SQLite."""
    counts = [(await rpc(d.socket_path, "daemon/health")).get("storeRoundTrips") for d in nodes]
    return None if any(c is None for c in counts) else sum(counts)


async def reruns(nodes: list[Any]) -> int | None:
    """The writes the daemons ran again since they started because their session had changed since
    they last committed it (``daemon/health``'s ``storeReruns``). None on SQLite (always 0 there)."""
    healths = [await rpc(d.socket_path, "daemon/health") for d in nodes]
    if any(h.get("storeRoundTrips") is None for h in healths):
        return None
    return sum(int(h["storeReruns"]) for h in healths)


def statement_table(db: Db) -> dict[str, int]:
    """``pg_stat_statements``' calls by the daemons' role in this database so far, per statement."""
    if isinstance(db.store, Path):
        return {}
    rows = db.q(
        "SELECT s.query, SUM(s.calls) FROM benchstats.pg_stat_statements s JOIN pg_roles r ON r.oid = s.userid"
        " WHERE r.rolname = %s AND s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " GROUP BY s.query",
        _pgkit.USER,
    )
    return {str(q): int(c) for q, c in rows}


def print_statements(label: str, before: dict[str, int], after: dict[str, int], rounds: int) -> None:
    """The statements of a run per round, most frequent first (``--statements``)."""
    per = sorted(((after[q] - before.get(q, 0)) / rounds, q) for q in after)
    print(f"statements per round, {label}:")
    for calls, query in reversed(per):
        if calls >= 0.05:
            print(f"  {calls:6.2f}  {' '.join(query.split())[:150]}")


@dataclass
class Link:
    """How the daemons reach PostgreSQL: directly (``rtt_ms`` 0), or through a relay that adds a
    fixed round trip (``benchmarks/delay_relay.py``, started by :meth:`start`); and how long each
    model call takes (``model_delay`` seconds: a real model's latency, so that CPU is not the limit)."""

    rtt_ms: float = 0.0
    model_delay: float = 0.0
    server_port: int = 0
    port: int = 0
    proc: subprocess.Popen[str] | None = None
    #: The round trip measured through the relay (``SELECT 1``, median, ms).
    measured_ms: float | None = None

    @property
    def directive(self) -> str:
        return f" delay={self.model_delay:g}" if self.model_delay else ""

    def dsn(self, dsn: str) -> str:
        """``dsn`` as the daemons use it: through the relay, if there is one."""
        if self.proc is None:
            return dsn
        return dsn.replace(f":{self.server_port}/", f":{self.port}/", 1)

    def start(self, server_port: int, probe_dsn: str) -> None:
        self.server_port = server_port
        if self.rtt_ms <= 0:
            return
        relay = Path(__file__).with_name("delay_relay.py")
        self.proc = subprocess.Popen(
            [sys.executable, str(relay), "--to", str(server_port), "--rtt-ms", str(self.rtt_ms)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())
        times = []
        with psycopg.connect(self.dsn(probe_dsn), autocommit=True) as conn:
            for _ in range(50):
                t0 = time.perf_counter()
                conn.execute("SELECT 1").fetchall()
                times.append(time.perf_counter() - t0)
        self.measured_ms = statistics.median(times) * 1000

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


class LockSampler:
    """How busy the locks are while a run goes: ``pg_locks`` read every few milliseconds (as the
    benchmark's role, so it counts for none of the daemons' figures), and, with a relay, the round
    trip through it under the run's load (the relay is a process on the same cores). ``exclusive``: the share of
    samples in which the cluster-wide writer lock was held alone (a write that needs the cluster);
    ``shared``: held by any write at all; ``session``: the share in which the busiest session lock was
    held. An advisory lock shows as (``classid``, ``objid``): a bigint key's high and low 32 bits
    (``objsubid`` 1), or its two int4 keys (``objsubid`` 2)."""

    WRITER = (WRITER_LOCK >> 32, WRITER_LOCK & 0xFFFFFFFF)
    SQL = (
        "SELECT classid::bigint, objid::bigint, objsubid, mode FROM pg_locks WHERE locktype = 'advisory'"
        " AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    )

    def __init__(self, dsn: str, link: Link | None = None, every: float = 0.005) -> None:
        self.dsn, self.every = dsn, every
        #: With a delaying relay: a ``SELECT 1`` through it at each sample (the link under load).
        self.link_dsn = link.dsn(dsn) if link is not None and link.proc is not None else None
        self.link_times: list[float] = []
        self.samples = self.exclusive = self.shared = 0
        self.sessions: Counter[int] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lock-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with contextlib.ExitStack() as stack:
            conn = stack.enter_context(psycopg.connect(self.dsn, autocommit=True))
            through = stack.enter_context(psycopg.connect(self.link_dsn, autocommit=True)) if self.link_dsn else None
            while not self._stop.wait(self.every):
                if through is not None:
                    t0 = time.perf_counter()
                    through.execute("SELECT 1").fetchall()
                    self.link_times.append(time.perf_counter() - t0)
                rows = conn.execute(self.SQL).fetchall()
                self.samples += 1
                writer = [mode for cls, obj, sub, mode in rows if sub == 1 and (cls, obj) == self.WRITER]
                self.exclusive += "ExclusiveLock" in writer
                self.shared += bool(writer)
                self.sessions.update({obj for cls, obj, sub, _ in rows if sub == 2 and cls == SESSION_LOCKS})

    def link_ms(self) -> float | None:
        """The median round trip through the relay while the run went (``None``: no relay)."""
        return statistics.median(self.link_times) * 1000 if self.link_times else None

    def stop(self) -> tuple[float, float, float]:
        """``(exclusive, shared, busiest session)`` as shares of the samples."""
        self._stop.set()
        self._thread.join()
        n = max(self.samples, 1)
        busiest = max(self.sessions.values(), default=0)
        return self.exclusive / n, self.shared / n, busiest / n


def start_server() -> Any:
    """The private PostgreSQL, with ``pg_stat_statements`` (in a schema of its own in ``template1``,
    so every database made for a configuration has it, out of goald's way) and the benchmark's role."""
    server = PgServer.start(
        {"shared_preload_libraries": "'pg_stat_statements'", "pg_stat_statements.track_utility": "on"}
    )
    try:
        with psycopg.connect(server.dsn("postgres"), autocommit=True) as admin:
            admin.execute(f"CREATE ROLE {BENCH_ROLE} LOGIN SUPERUSER")
        with psycopg.connect(server.dsn("template1"), autocommit=True) as tpl:
            tpl.execute("CREATE SCHEMA benchstats")
            tpl.execute("CREATE EXTENSION pg_stat_statements SCHEMA benchstats")
    except BaseException:
        server.stop()
        raise
    return server


@dataclass
class Probe:
    """Client-side floors on this host: a bare round trip, a writer-locked write transaction, and a
    ``NOTIFY`` from one connection to a ``LISTEN`` on another."""

    round_trip: list[float] = field(default_factory=list)
    locked_write: list[float] = field(default_factory=list)
    notify: list[float] = field(default_factory=list)


def probe(dsn: str, count: int = 300) -> Probe:
    out = Probe()
    with psycopg.connect(dsn, autocommit=True) as conn, psycopg.connect(dsn, autocommit=True) as listener:
        conn.execute("CREATE TABLE probe (id BIGSERIAL PRIMARY KEY, note TEXT NOT NULL)")
        listener.execute("LISTEN bench_probe")
        for i in range(count):
            t0 = time.perf_counter()
            conn.execute("SELECT 1").fetchall()
            t1 = time.perf_counter()
            conn.execute("BEGIN")
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (0x676F616C64,))
            conn.execute("INSERT INTO probe (note) VALUES (%s)", (f"row {i}",))
            conn.execute("COMMIT")
            t2 = time.perf_counter()
            conn.execute("SELECT pg_notify('bench_probe', %s)", (str(i),))
            got = next(iter(listener.notifies(timeout=5, stop_after=1)), None)
            t3 = time.perf_counter()
            if got is None or got.payload != str(i):
                raise RuntimeError(f"notification {i} not delivered within 5 s")
            out.round_trip.append(t1 - t0)
            out.locked_write.append(t2 - t1)
            out.notify.append(t3 - t2)
    return out


def print_probe(p: Probe) -> None:
    print("\nthis host's floors (client side, 127.0.0.1, ms):  median  p90")
    for name, values in (
        ("SELECT 1 round trip", p.round_trip),
        ("BEGIN + writer lock + INSERT + COMMIT", p.locked_write),
        ("pg_notify (autocommit) -> LISTEN delivery", p.notify),
    ):
        print(f"  {name:<42} {statistics.median(values) * 1000:6.2f} {pct(values, 0.9) * 1000:5.2f}")
