"""The metrics' label sets stay bounded: 1,000 goals on a real store give the series 60 goals give.

Goals, their guards, sessions and model calls are written through the owners' functions (as the
engine and the driver write them) into a real SQLite file; three providers, two models, three
schedules. The collector's text is read with ``prometheus_client``'s parser: the series are keyed
by provider, model, schedule, status and error class, none by goal or session, and the sums equal
the table's.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent import Limits, Store, TurnId, Tx, Usage, create_guard, create_session
from agent.calls import CallId, reserve_call, settle_call
from daemon.metrics import Metrics, SlotSemaphore, render
from daemon.metrics_service import MetricsSettings, split_listen
from daemon.schedule.store import MIGRATIONS as SCHEDULE_MIGRATIONS
from goals import Budgets, Goal, GoalId, GoalStatus, StopRules
from goals.store import MIGRATIONS as GOAL_MIGRATIONS
from goals.store import insert_goal

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
PROVIDERS = ("alpha", "beta", "gamma")
MODELS = ("small", "large")
SCHEDULES = ("sch_01JAAAAAAAAAAAAAAAAAAAAAAA", "sch_01JBBBBBBBBBBBBBBBBBBBBBBB", "sch_01JCCCCCCCCCCCCCCCCCCCCCCC")
STATUSES = (GoalStatus.ACTIVE, GoalStatus.PAUSED, GoalStatus.COMPLETED, GoalStatus.CANCELLED)


def add_goal(tx: Tx, i: int, workdir: Path) -> None:
    guard = create_guard(tx, Limits())
    sid = create_session(tx, workdir=str(workdir / str(i)), guard_id=guard, config={"goal": True})
    schedule = SCHEDULES[i % 3] if i % 4 == 0 else None
    goal = Goal(
        id=GoalId.new(),
        title=f"goal {i}",
        objective=f"goal {i}.",
        status=STATUSES[i % len(STATUSES)],
        session_id=sid,
        guard_id=guard,
        workdir=str(workdir / str(i)),
        idempotency_key=f"{schedule}@2026-03-01T00:00:{i % 60:02d}+00:00#{i}" if schedule else None,
        budgets=Budgets(max_rounds=5),
        verify=[],
        rules=StopRules(),
        rounds=i % 5,
        active_since=T0,
        created_at=T0,
        updated_at=T0,
    )
    insert_goal(tx, goal)
    turn = TurnId.new()
    for attempt, (provider, model) in enumerate([(PROVIDERS[i % 3], MODELS[i % 2]), (PROVIDERS[(i + 1) % 3], "large")]):
        call = CallId.new()
        reserve_call(
            tx,
            call_id=call,
            session_id=sid,
            turn_id=turn,
            guard_id=guard,
            provider=provider,
            model=model,
            attempt=attempt,
            tokens=100,
            cost=0.01,
        )
        usage = Usage(input_tokens=10 + i % 7, output_tokens=3, cache_read_tokens=i % 2, cache_write_tokens=0)
        error = ("rate_limit", "server")[i % 2] if attempt == 1 and i % 5 == 0 else None
        settle_call(tx, call, usage, 0.001 * (i % 3), error_class=error)


async def collect(tmp_path: Path, n: int) -> tuple[dict[tuple[str, tuple[tuple[str, str], ...]], float], Path]:
    db = tmp_path / f"goald-{n}.db"
    async with await Store.open(db) as store:
        await store.migrate("goals", GOAL_MIGRATIONS)
        await store.migrate("schedules", SCHEDULE_MIGRATIONS)
        for start in range(0, n, 250):
            chunk = range(start, min(n, start + 250))
            await store.transact(lambda tx, chunk=chunk: [add_goal(tx, i, tmp_path / "w") for i in chunk])
        text = await Metrics(store, healths={}, slots=SlotSemaphore(2)).text()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out, db


async def test_1000_goals_give_the_series_60_goals_give(tmp_path: Path) -> None:
    few, _ = await collect(tmp_path, 60)
    many, db = await collect(tmp_path, 1000)
    stored = {"goald_database_bytes", "goald_metrics_collect_seconds"}
    assert {k for k in many if k[0] not in stored} == {k for k in few if k[0] not in stored}
    assert len(many) < 160  # the counters by provider and model beside the stored sums by schedule
    values = {v for _, labels in many for _, v in labels}
    assert not any(v.startswith(("goal_", "ses_", "grd_", "turn_")) for v in values)
    assert {
        v for name, labels in many if name == "goald_stored_model_tokens" for k, v in labels if k == "schedule"
    } == {
        "",
        *SCHEDULES,
    }

    # The sums are the table's and the goals'.
    conn = sqlite3.connect(db)
    try:
        for provider, model, tokens_in, cost in conn.execute(
            "SELECT provider, model, SUM(input_tokens), SUM(cost) FROM model_calls GROUP BY provider, model"
        ):
            got = [
                v
                for (name, labels), v in many.items()
                if name == "goald_stored_model_tokens"
                and ("provider", provider) in labels
                and ("model", model) in labels
                if ("kind", "input") in labels
            ]
            assert sum(got) == tokens_in
            # The counters hold the same before any pruning (by provider and model, not schedule).
            assert many[
                ("goald_model_tokens_total", (("kind", "input"), ("model", model), ("provider", provider)))
            ] == (tokens_in)
            paid = [
                v
                for (name, labels), v in many.items()
                if name == "goald_stored_model_cost" and ("provider", provider) in labels and ("model", model) in labels
            ]
            assert sum(paid) == pytest.approx(cost)
        for provider, error_class, n in conn.execute(
            "SELECT provider, error_class, COUNT(*) FROM model_calls WHERE error_class IS NOT NULL"
            " GROUP BY provider, error_class"
        ):
            assert many[("goald_model_call_errors_total", (("class", error_class), ("provider", provider)))] == n
        for status, n, rounds in conn.execute("SELECT status, COUNT(*), SUM(rounds) FROM goals GROUP BY status"):
            assert many[("goald_goals", (("status", status),))] == n
            assert many[("goald_goal_rounds", (("status", status),))] == rounds
    finally:
        conn.close()
    assert many[("goald_goals", (("status", "failed"),))] == 0


def test_label_values_are_escaped_and_numbers_exact() -> None:
    from daemon.metrics import Family

    fam = Family("goald_x", "An example.")
    fam.add(3, name='a "quoted"\\ value\nnext')
    fam.add(0.25, name="plain")
    (parsed,) = text_string_to_metric_families(render([fam]))
    assert [(s.labels["name"], s.value) for s in parsed.samples] == [('a "quoted"\\ value\nnext', 3.0), ("plain", 0.25)]


@pytest.mark.parametrize(
    ("listen", "allowed", "error"),
    [
        ("127.0.0.1:9464", False, None),
        ("[::1]:9464", False, None),
        ("localhost:0", False, None),
        ("0.0.0.0:9464", False, "not a loopback address"),
        ("192.0.2.7:9464", False, "not a loopback address"),
        ("0.0.0.0:9464", True, None),
        ("9464", False, "must be HOST:PORT"),
        ("127.0.0.1:http", False, "is not a number"),
        ("127.0.0.1:70000", False, "0..65535"),
    ],
)
def test_listen_is_loopback_unless_allowed(listen: str, allowed: bool, error: str | None) -> None:
    if error is None:
        settings = MetricsSettings(listen=listen, allow_remote=allowed)
        assert split_listen(settings.listen or "")[1] >= 0
    else:
        with pytest.raises(ValueError, match=error):
            MetricsSettings(listen=listen, allow_remote=allowed)
