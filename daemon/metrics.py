"""Metrics in the Prometheus text format: the figures, read from the store and the live objects at
each collection, and their rendering. Where they are written and served is
:mod:`daemon.metrics_service`'s.

Why the format is written here rather than with a client library: every figure is read from the
store at collection time (the owners' query functions: :mod:`agent.usage`, :mod:`goals.queries`,
:mod:`agent.outbox`) or from live objects (provider health, the turn slots), so there is no
registry of in-process counters to keep; rendering a list of families is a few lines.

**Bounded labels**: no series is per goal or per session. Spend is labelled by provider, model and
schedule (the schedule's key, else its id; ``""`` for goals no schedule started); model errors by
provider and error class (an enum); goals by status. The number of series grows with providers,
models and schedules, which the operator configures, never with the number of goals.

Calls, tokens and cost are counters (``_total``): every call is added to ``usage_totals`` in the
transaction that ends it (:mod:`agent.usage`), so retention pruning ended goals and restarts never
lower them. Per schedule they are also given as sums over the calls still stored
(``goald_stored_model_*``): gauges, which retention lowers.
"""

from __future__ import annotations

import asyncio
import os
import platform
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from loguru import logger

from agent.db import Conn, database_errors, savepoint
from agent.models.health import BreakerState, ProviderHealth
from agent.outbox import backlog as outbox_backlog
from agent.store import Store
from agent.usage import usage_by_guard, usage_totals
from daemon import __version__
from goals.model import GoalStatus
from goals.queries import goal_facts

#: What the notification backlog is read with (the outbox's owner fills it; tests may pass another).
BacklogFn = Callable[[Conn], Mapping[str, int]]


@dataclass
class Family:
    """One metric family: its samples, each a label set and a value."""

    name: str
    help: str
    kind: str = "gauge"
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)

    def add(self, value: float, **labels: str) -> None:
        """One more sample."""
        self.samples.append((labels, value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 2**53 else repr(float(value))


def render(families: Iterable[Family]) -> str:
    """The families in the Prometheus text exposition format (version 0.0.4)."""
    out: list[str] = []
    for fam in families:
        out.append(f"# HELP {fam.name} {fam.help}")
        out.append(f"# TYPE {fam.name} {fam.kind}")
        for labels, value in fam.samples:
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
            out.append(f"{fam.name}{{{text}}} {_number(value)}" if text else f"{fam.name} {_number(value)}")
    return "\n".join(out) + "\n"


# -- the figures ------------------------------------------------------------------------------------


class SlotSemaphore(asyncio.Semaphore):
    """The daemon's turn slots, counting the turns that wait for one."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.size = value
        self.waiting = 0

    def snapshot(self) -> dict[str, int]:
        """``{"max", "inUse", "waiting"}``: the slots, those taken, and the turns waiting for one."""
        return {"max": self.size, "inUse": self.size - self._value, "waiting": self.waiting}

    async def acquire(self) -> Literal[True]:
        """Take a slot, counted as waiting while none is free."""
        if not self.locked():
            return await super().acquire()
        self.waiting += 1
        try:
            return await super().acquire()
        finally:
            self.waiting -= 1


class LoopLag:
    """How late the event loop runs a timer: a probe that sleeps ``period`` and measures the excess."""

    def __init__(self, period: float = 1.0) -> None:
        self.period = period
        self.last = 0.0
        self.max = 0.0

    async def run(self) -> None:
        """Measure until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await asyncio.sleep(self.period)
            self.last = max(0.0, loop.time() - started - self.period)
            self.max = max(self.max, self.last)

    def take_max(self) -> float:
        """The largest lag since the last call (then forgotten)."""
        worst, self.max = self.max, self.last
        return worst


@dataclass
class _Stored:
    """What one collection read from the store, in one snapshot."""

    goals: list[Any]
    usage: list[Any]
    totals: list[Any]
    schedule_names: dict[str, str]
    runs: list[tuple[str, str, int]]
    backlog: Mapping[str, int] | None


class Metrics:
    """Collects every family from the store and the live objects the daemon hands in."""

    def __init__(
        self,
        store: Store,
        *,
        healths: Mapping[str, ProviderHealth],
        slots: SlotSemaphore | None = None,
        lag: LoopLag | None = None,
        backlog: BacklogFn | None = outbox_backlog,
        cluster: Callable[[], Awaitable[list[dict[str, Any]]]] | None = None,
    ) -> None:
        self.store = store
        self.healths = healths
        self.slots = slots
        self.lag = lag
        self.backlog = backlog
        #: A cluster's nodes as the store has them (``LeaseManager.nodes``): every node's metrics
        #: are its own, and this family is the cluster's view, the same on every node.
        self.cluster = cluster

    def _read(self, conn: Conn) -> _Stored:
        names = {str(r[0]): str(r[1] or r[0]) for r in conn.execute("SELECT id, key FROM schedules")}
        runs = [
            (str(r[0]), str(r[1]), int(r[2]))
            for r in conn.execute(
                "SELECT schedule_id, outcome, COUNT(*) FROM schedule_runs GROUP BY schedule_id, outcome"
            )
        ]
        backlog = None
        if self.backlog is not None:
            try:
                # The savepoint keeps a PostgreSQL read usable after the error (a no-op on SQLite).
                with savepoint(conn):
                    backlog = self.backlog(conn)
            except database_errors() as exc:  # an outbox not created yet
                logger.debug("no notification backlog: {}", exc)
        return _Stored(goal_facts(conn), usage_by_guard(conn), usage_totals(conn), names, runs, backlog)

    async def families(self) -> list[Family]:
        """Every family, read now."""
        started = time.perf_counter()
        stored = await self.store.read(self._read)
        fams = self._from_store(stored)
        fams += self._live()
        fams += await self._cluster()
        size = await self.store.size_bytes()
        fams.append(
            Family(
                "goald_database_bytes",
                "Size of the database (the SQLite file with its WAL, or the PostgreSQL database), in bytes.",
                samples=[({}, size)],
            )
        )
        fams.append(
            Family(
                "goald_metrics_collect_seconds",
                "Seconds this collection took.",
                samples=[({}, round(time.perf_counter() - started, 6))],
            )
        )
        return fams

    async def text(self) -> str:
        """The metrics in the text format."""
        return render(await self.families())

    def _from_store(self, s: _Stored) -> list[Family]:
        goals = Family("goald_goals", "Goals by status.")
        rounds = Family("goald_goal_rounds", "Rounds run, summed over the goals of each status.")
        by_status: dict[str, int] = dict.fromkeys((st.value for st in GoalStatus), 0)
        rounds_by: dict[str, int] = dict.fromkeys((st.value for st in GoalStatus), 0)
        schedule_of_guard: dict[str, str] = {}
        for g in s.goals:
            by_status[g.status] = by_status.get(g.status, 0) + 1
            rounds_by[g.status] = rounds_by.get(g.status, 0) + g.rounds
            if g.schedule_id is not None:
                schedule_of_guard[g.guard_id] = s.schedule_names.get(g.schedule_id, g.schedule_id)
        for status, n in sorted(by_status.items()):
            goals.add(n, status=status)
        for status, n in sorted(rounds_by.items()):
            rounds.add(n, status=status)

        tokens = Family(
            "goald_stored_model_tokens",
            "Tokens of the model calls still stored (retention lowers it), by provider, model, schedule and kind.",
        )
        cost = Family(
            "goald_stored_model_cost",
            "Cost of the model calls still stored (retention lowers it), by provider, model and schedule.",
        )
        sums: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0, 0, 0, 0, 0.0])
        for u in s.usage:
            key = (u.provider, u.model, schedule_of_guard.get(u.guard_id or "", ""))
            acc = sums[key]
            for i, v in enumerate((u.input_tokens, u.output_tokens, u.cache_read_tokens, u.cache_write_tokens, u.cost)):
                acc[i] += v
        for (provider, model, schedule), acc in sorted(sums.items()):
            for i, kind in enumerate(("input", "output", "cache_read", "cache_write")):
                tokens.add(acc[i], provider=provider, model=model, schedule=schedule, kind=kind)
            cost.add(round(acc[4], 9), provider=provider, model=model, schedule=schedule)

        fams = [goals, rounds, *self._counters(s.totals), tokens, cost]

        runs = Family("goald_schedule_runs", "Recorded schedule runs, by schedule and outcome.")
        for schedule_id, outcome, n in sorted(s.runs):
            runs.add(n, schedule=s.schedule_names.get(schedule_id, schedule_id), outcome=outcome)

        fams.append(runs)
        if s.backlog is not None:
            waiting = int(s.backlog.get("unsealed", 0)) + int(s.backlog.get("pending", 0))
            fams.append(
                Family(
                    "goald_notification_backlog",
                    "Notifications not delivered yet (not yet sealed into a message, or deliveries pending).",
                    samples=[({}, waiting)],
                )
            )
            states = Family("goald_notification_deliveries", "Notification rows and deliveries by state.")
            for state, n in sorted(s.backlog.items()):
                states.add(n, state=state)
            fams.append(states)
        return fams

    @staticmethod
    def _counters(totals: list[Any]) -> list[Family]:
        """The monotonic families: every call ever settled or charged (``agent.usage.usage_totals``)."""
        calls = Family("goald_model_calls_total", "Model calls (attempts) ended, by provider.", "counter")
        errors = Family(
            "goald_model_call_errors_total", "Model calls that failed, by provider and error class.", "counter"
        )
        tokens = Family("goald_model_tokens_total", "Tokens of model calls, by provider, model and kind.", "counter")
        cost = Family("goald_model_cost_total", "Cost of model calls, by provider and model.", "counter")
        per_provider: dict[str, int] = defaultdict(int)
        per_error: dict[tuple[str, str], int] = defaultdict(int)
        per_model: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0, 0, 0, 0.0])
        for t in totals:
            per_provider[t.provider] += t.calls
            if t.error_class is not None:
                per_error[(t.provider, t.error_class)] += t.calls
            acc = per_model[(t.provider, t.model)]
            for i, v in enumerate((t.input_tokens, t.output_tokens, t.cache_read_tokens, t.cache_write_tokens, t.cost)):
                acc[i] += v
        for provider, n in sorted(per_provider.items()):
            calls.add(n, provider=provider)
        for (provider, error_class), n in sorted(per_error.items()):
            errors.add(n, provider=provider, **{"class": error_class})
        for (provider, model), acc in sorted(per_model.items()):
            for i, kind in enumerate(("input", "output", "cache_read", "cache_write")):
                tokens.add(acc[i], provider=provider, model=model, kind=kind)
            cost.add(round(acc[4], 9), provider=provider, model=model)
        return [calls, errors, tokens, cost]

    async def _cluster(self) -> list[Family]:
        if self.cluster is None:
            return []
        try:
            nodes = await self.cluster()
        except Exception as exc:  # the database unreachable: the storage families say so
            logger.debug("no cluster view: {}", exc)
            return []
        leases = Family("goald_cluster_node_leases", "Sessions each node of the cluster holds (the store's view).")
        alive = Family("goald_cluster_node_alive", "1 if the node renewed its leases within the TTL, else 0.")
        for n in nodes:
            leases.add(n["leases"], node=n["name"], node_id=n["nodeId"])
            alive.add(1 if n["alive"] else 0, node=n["name"], node_id=n["nodeId"])
        return [leases, alive]

    def _live(self) -> list[Family]:
        fams = [
            Family(
                "goald_build_info",
                "Always 1: the goald version (and Python's) this daemon runs.",
                samples=[({"version": __version__, "python": platform.python_version()}, 1)],
            ),
            *process_families(),
        ]
        breaker = Family("goald_breaker_state", "Each provider's circuit breaker: 1 for its current state.")
        trips = Family("goald_breaker_trips", "Times each provider's circuit breaker opened since the daemon started.")
        for name, health in sorted(self.healths.items()):
            snap = health.breaker.snapshot()
            for state in BreakerState:
                breaker.add(1 if snap["state"] == state.value else 0, provider=name, state=state.value)
            trips.add(snap["trips"], provider=name)
        fams += [breaker, trips]
        if self.slots is not None:
            fams.append(
                Family(
                    "goald_turns_waiting_for_slot",
                    "Turns waiting for one of max_concurrent_turns slots.",
                    samples=[({}, self.slots.waiting)],
                )
            )
        if self.lag is not None:
            fams.append(
                Family(
                    "goald_event_loop_lag_seconds",
                    "How late the event loop ran its last timer probe.",
                    samples=[({}, round(self.lag.last, 6))],
                )
            )
            fams.append(
                Family(
                    "goald_event_loop_lag_max_seconds",
                    "The largest event-loop lag since the previous collection.",
                    samples=[({}, round(self.lag.take_max(), 6))],
                )
            )
        return fams


def process_families() -> list[Family]:
    """The process metrics under the client library's names (``process_cpu_seconds_total``,
    ``process_resident_memory_bytes``, ``process_open_fds``, ``process_start_time_seconds``, ...),
    read from ``/proc/self`` as its process collector reads them; none where there is no ``/proc``."""
    try:
        ticks = os.sysconf("SC_CLK_TCK")
        stat = Path("/proc/self/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))  # fmt: skip
        fds = len(os.listdir("/proc/self/fd"))
        limits = Path("/proc/self/limits").read_text().splitlines()
        max_fds = next(float(line.split()[3]) for line in limits if line.startswith("Max open files"))
    except (OSError, ValueError, StopIteration, IndexError):
        return []
    # fields[0] is the state (field 3 of stat(5)): utime is field 14, stime 15, starttime 22,
    # vsize 23, rss 24 (in pages).
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    start = boot + int(fields[19]) / ticks
    rss = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    return [
        Family(
            "process_cpu_seconds_total",
            "Total user and system CPU time spent in seconds.",
            "counter",
            [({}, round(cpu, 6))],
        ),
        Family("process_virtual_memory_bytes", "Virtual memory size in bytes.", samples=[({}, int(fields[20]))]),
        Family("process_resident_memory_bytes", "Resident memory size in bytes.", samples=[({}, rss)]),
        Family(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            samples=[({}, round(start, 2))],
        ),
        Family("process_open_fds", "Number of open file descriptors.", samples=[({}, fds)]),
        Family("process_max_fds", "Maximum number of open file descriptors.", samples=[({}, max_fds)]),
    ]
