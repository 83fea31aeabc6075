"""Metrics of a real daemon, read with a real Prometheus parser (``prometheus_client``'s).

After goals ran on the priced ``test:worker`` model, the endpoint's figures equal what ``goal/list``
says (goals by status, rounds) and what the ``model_calls`` table holds (calls, tokens and cost by
provider and model); the textfile written at stop says the same. With goals waiting for the single turn
slot, the waiting turns show, and the series are those of one goal (no label is per goal).
"""

from __future__ import annotations

import asyncio
import json
import socket
import sqlite3
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from harness import TEST_MODELS, Daemon, rpc, wait_goal
from prometheus_client.parser import text_string_to_metric_families

from daemon import __version__
from daemon.client import Connection
from daemon.metrics_service import scrape


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return out


def series(metrics: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    found = [v for lab, v in metrics.get(name, []) if all(lab.get(k) == w for k, w in labels.items())]
    assert found, f"no {name} {labels} in {sorted(metrics)}"
    return sum(found)


def stored_calls(db: Path) -> list[sqlite3.Row]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(
            "SELECT provider, model, COUNT(*) AS calls, SUM(input_tokens) AS input, SUM(output_tokens) AS output,"
            " SUM(cost) AS cost, SUM(error_class IS NOT NULL) AS errors FROM model_calls GROUP BY provider, model"
        ).fetchall()
    finally:
        conn.close()


def check_against_store(metrics: dict[str, Any], goals: list[dict[str, Any]], db: Path) -> None:
    by_status: dict[str, int] = defaultdict(int)
    rounds: dict[str, int] = defaultdict(int)
    for g in goals:
        by_status[g["status"]] += 1
        rounds[g["status"]] += g["rounds"]
    for status in ("active", "paused", "completed", "failed", "cancelled", "exhausted"):
        assert series(metrics, "goald_goals", status=status) == by_status[status], status
        assert series(metrics, "goald_goal_rounds", status=status) == rounds[status], status
    calls = stored_calls(db)
    assert calls
    for row in calls:
        where = {"provider": row["provider"], "model": row["model"]}
        for name in ("goald_stored_model_tokens", "goald_model_tokens_total"):  # equal before any pruning
            assert series(metrics, name, kind="input", **where) == row["input"]
            assert series(metrics, name, kind="output", **where) == row["output"]
        for name in ("goald_stored_model_cost", "goald_model_cost_total"):
            assert series(metrics, name, **where) == pytest.approx(row["cost"], abs=1e-9)
    per_provider: dict[str, int] = defaultdict(int)
    for row in calls:
        per_provider[row["provider"]] += row["calls"]
    for provider, n in per_provider.items():
        assert series(metrics, "goald_model_calls_total", provider=provider) == n


async def test_metrics_match_goal_list_and_the_model_calls_table(tmp_path: Path) -> None:
    port = free_port()
    prom = tmp_path / "textfile" / "goald.prom"
    prom.parent.mkdir()
    # An HTTP provider (never called here) has a circuit breaker from the start; scripted ones have none.
    remote = {"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "api_key": "unused"}
    daemon = Daemon(
        tmp_path / "state",
        config={
            "providers": {**TEST_MODELS["providers"], "remote": remote},
            "metrics": {"file": str(prom), "listen": f"127.0.0.1:{port}", "interval_seconds": 0.2},
        },
    )
    try:
        daemon.start()
        ids = []
        for n in (2, 1):
            created = await daemon.acli_json(
                "goal", "add", f"write rounds [rounds={n} delay=0.01]", "--model", "test:worker"
            )
            ids.append(created["goalId"])
        for goal_id in ids:
            await wait_goal(daemon.socket_path, goal_id, {"completed"})
        goals = (await rpc(daemon.socket_path, "goal/list", {}))["goals"]
        assert {g["status"] for g in goals} == {"completed"}
        metrics = parse(await scrape("127.0.0.1", port))
        check_against_store(metrics, goals, daemon.state_dir / "goald.db")
        assert series(metrics, "goald_breaker_state", provider="remote", state="closed") == 1
        assert series(metrics, "goald_breaker_state", provider="remote", state="open") == 0
        assert series(metrics, "goald_turns_waiting_for_slot") == 0
        assert series(metrics, "goald_database_bytes") > 0
        assert series(metrics, "goald_event_loop_lag_seconds") >= 0
        assert series(metrics, "goald_notification_backlog") >= 0
        # The build and the process, under the client library's names, from the daemon's own process.
        assert series(metrics, "goald_build_info", version=__version__) == 1
        assert daemon.proc is not None
        assert series(metrics, "process_cpu_seconds_total") > 0
        assert series(metrics, "process_resident_memory_bytes") > 2**20
        assert series(metrics, "process_open_fds") >= 3
        assert 0 < time.time() - series(metrics, "process_start_time_seconds") < 120
        # Anything but /metrics is not found; the file is world-readable, replaced whole.
        with pytest.raises(ConnectionError, match="404"):
            await scrape("127.0.0.1", port, "/other")
        assert prom.stat().st_mode & 0o777 == 0o644
        assert daemon.terminate() == 0
        # The last write at stop holds the same figures.
        check_against_store(parse(prom.read_text()), goals, daemon.state_dir / "goald.db")
        assert not list(prom.parent.glob(".*.tmp"))
    finally:
        daemon.close()


async def test_turns_waiting_for_a_slot_and_series_independent_of_goal_count(tmp_path: Path) -> None:
    # 1,000 goals on a real store: tests/daemon/test_metrics_labels.py (creating them through a
    # daemon would make this test long); here the live figures of a daemon with one turn slot.
    port = free_port()
    daemon = Daemon(
        tmp_path / "state",
        config={**TEST_MODELS, "max_concurrent_turns": 1, "metrics": {"listen": f"127.0.0.1:{port}"}},
    )
    try:
        daemon.start()
        await daemon.acli_json(
            "goal", "add", "hold the slot [rounds=1 hold_round=1 hold=100]", "--model", "test:worker"
        )
        daemon.calls.wait("worker round=1")
        small = parse(await scrape("127.0.0.1", port))
        async with await Connection.connect(daemon.socket_path) as client:
            for i in range(20):
                await client.call("goal/create", {"objective": f"wait [rounds=1] {i}", "model": "test:worker"})
        big = parse(await scrape("127.0.0.1", port))
        assert series(big, "goald_goals", status="active") == 21
        assert series(big, "goald_turns_waiting_for_slot") > 0
        keys = {(name, tuple(sorted(lab.items()))) for name, samples in big.items() for lab, _ in samples}
        small_keys = {(name, tuple(sorted(lab.items()))) for name, samples in small.items() for lab, _ in samples}
        assert keys == small_keys, keys ^ small_keys
        assert not any(v.startswith(("goal_", "ses_")) for _, lab in keys for _, v in lab)
    finally:
        daemon.close()


async def scrape_when_served(port: int, limit: float = 30.0) -> str:
    """The first scrape that connects: the endpoint opens after ``READY=1`` (daemon/ready_services.py)."""
    deadline = time.monotonic() + limit
    while True:
        try:
            return await scrape("127.0.0.1", port)
        except OSError:  # refused: not listening yet
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


def counters(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of every counter family in ``text`` (prometheus_client's parser)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): float(s.value)
        for fam in text_string_to_metric_families(text)
        if fam.type == "counter" and fam.name.startswith("goald_")
        for s in fam.samples
    }


def never_lower(before: dict[Any, float], after: dict[Any, float]) -> None:
    for key, value in before.items():
        assert key in after, f"{key} went missing"
        assert after[key] >= value, f"{key} went down: {value} -> {after[key]}"


async def test_counters_survive_retention_and_a_restart(tmp_path: Path) -> None:
    port = free_port()
    retention = {"history_seconds": 0.001, "keep_events": 2, "interval_seconds": 0, "workdir_seconds": 0}
    daemon = Daemon(
        tmp_path / "state",
        config={**TEST_MODELS, "retention": retention, "metrics": {"listen": f"127.0.0.1:{port}"}},
    )
    try:
        daemon.start()
        first = await daemon.acli_json("goal", "add", "write rounds [rounds=4 delay=0.01]", "--model", "test:worker")
        await wait_goal(daemon.socket_path, first["goalId"], {"completed"})
        text = await scrape("127.0.0.1", port)
        before, stored_before = counters(text), parse(text)
        where = {"provider": "test", "model": "worker"}
        tokens = series(stored_before, "goald_model_tokens_total", kind="input", **where)
        assert tokens > 0 and series(stored_before, "goald_model_calls_total", provider="test") >= 4
        assert series(stored_before, "goald_stored_model_tokens", kind="input", **where) == tokens

        code, out, err = await daemon.acli("store", "compact", "--json")
        assert code == 0, err
        assert json.loads(out)["goalsPruned"] == 1
        text = await scrape("127.0.0.1", port)
        pruned, stored_after = counters(text), parse(text)
        # The stored sum went down with the pruned calls; the counters did not move.
        left = [v for lab, v in stored_after.get("goald_stored_model_tokens", []) if lab.get("kind") == "input"]
        assert sum(left) < tokens
        assert pruned == before

        assert daemon.terminate() == 0
        daemon.start()
        text = await scrape_when_served(port)
        restarted = counters(text)
        assert restarted == before
        metrics = parse(text)
        assert series(metrics, "goald_build_info", version=__version__) == 1
        for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"):
            assert series(metrics, name) > 0
        assert series(metrics, "process_start_time_seconds") > 0

        second = await daemon.acli_json("goal", "add", "write rounds [rounds=1 delay=0.01]", "--model", "test:worker")
        await wait_goal(daemon.socket_path, second["goalId"], {"completed"})
        later = counters(await scrape("127.0.0.1", port))
        never_lower(restarted, later)
        assert (
            series(parse(await scrape("127.0.0.1", port)), "goald_model_tokens_total", kind="input", **where) > tokens
        )
    finally:
        daemon.close()
