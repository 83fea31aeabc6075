"""Start-up work does not grow with the store: pinned by counting SQL statements, never by time.

What the daemon does before ``READY=1`` is the engine's deferred start (migrations, a listener, a
timer) and one indexed read of the live goals' secrets; loading the live goals and making their
pending decisions happen after, in :meth:`GoalEngine.follow_live_goals`. Here two stores, one with
2 goals and one with 12, are reopened: each start runs the same number of statements and has
loaded no goal (a statement that returns every goal would not show in the count, the goals it
built would). The deferred load still follows every goal afterwards. The durable step's write set is
pinned too: every query on ``model_calls`` finds its rows through an index, and no index is there
that no query uses (each one is a page in the write-ahead log per step).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from agent import ModelRegistry, Reply, Runtime, ScriptedModel, ToolRegistry, file_tools
from agent.schema import MIGRATIONS
from agent.secret import SecretSource
from goals import (
    GoalEngine,
    GoalSpec,
    SandboxSpec,
    StopRules,
    live_goal_sandboxes_with_secrets,
    tools_for_goal_sessions,
)


def _registry() -> tuple[ModelRegistry, Any]:
    model = ScriptedModel(lambda _request: Reply.say("working on it"), name="startup")
    registry = ModelRegistry({model.spec: model}, default=model.spec)

    def tools(row: Any) -> ToolRegistry:
        return ToolRegistry(list(file_tools()) + tools_for_goal_sessions(row.config))

    return registry, tools


async def _store_with_goals(db: Path, goals: int) -> None:
    registry, tools = _registry()
    async with Runtime.open(db, models=registry, tools=tools, grace=0.5) as rt:
        async with GoalEngine.running(rt) as engine:
            for i in range(goals):
                secrets = {"TOKEN": SecretSource(env="GOALD_TEST_TOKEN")} if i == 0 else {}
                await engine.create(
                    GoalSpec(
                        objective=f"goal {i}",
                        rules=StopRules(stall_rounds=10**6),
                        sandbox=SandboxSpec(secrets=secrets),
                    )
                )


async def _deferred_start_statements(db: Path) -> tuple[int, int, list[SandboxSpec]]:
    """Statements run by a deferred engine start and the secrets read, then the goals followed."""
    registry, tools = _registry()
    statements: list[str] = []
    async with Runtime.open(db, models=registry, tools=tools, grace=0.5, resume=False) as rt:
        await rt.store.trace(statements.append)
        engine = GoalEngine(rt)
        await engine.start(defer=True)
        with_secrets = await rt.store.read(live_goal_sandboxes_with_secrets)
        await rt.store.trace(None)
        counted = len(statements)
        assert engine.live_goal_count == 0, "goals were loaded on the way to READY=1"
        try:
            live = await engine.follow_live_goals(decide=False)
        finally:
            await engine.stop()
        assert engine.live_goal_count == live
    return counted, live, with_secrets


async def test_the_work_before_ready_does_not_grow_with_the_number_of_goals(tmp_path: Path) -> None:
    small, big = tmp_path / "small.db", tmp_path / "big.db"
    await _store_with_goals(small, 2)
    await _store_with_goals(big, 12)

    small_count, small_live, small_secrets = await _deferred_start_statements(small)
    big_count, big_live, big_secrets = await _deferred_start_statements(big)

    assert (small_live, big_live) == (2, 12)  # the deferred load follows every live goal
    assert small_count == big_count, "a statement per goal crept onto the way to READY=1"
    # Only the goal that names a secret is read, in both stores.
    assert [list(s.secrets) for s in small_secrets] == [["TOKEN"]]
    assert [list(s.secrets) for s in big_secrets] == [["TOKEN"]]


def test_every_query_on_model_calls_uses_an_index_and_every_index_is_used() -> None:
    conn = sqlite3.connect(":memory:")
    for migration in MIGRATIONS:
        conn.executescript(migration.sql)
    # The statements of agent.calls, agent.turns and agent.spend on the table (crash repair included).
    queries = {
        "UPDATE model_calls SET state='settled' WHERE id=? AND state='reserved'": "sqlite_autoindex_model_calls_1",
        "UPDATE model_calls SET state='charged_in_full' WHERE session_id=? AND state='reserved'": "model_calls_open",
        "SELECT DISTINCT session_id FROM model_calls WHERE state='reserved'": "model_calls_open",
        "SELECT SUM(cost) FROM model_calls WHERE guard_id=?": "model_calls_guard",
    }
    used = set()
    for sql, index in queries.items():
        plan = " ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, (1,) * sql.count("?")))
        assert f"INDEX {index}" in plan, f"{sql}: {plan}"
        used.add(index)
    indexes = {
        r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index' AND tbl_name='model_calls'")
    }
    assert indexes == used, f"indexes no query uses: {sorted(indexes - used)}"


def test_event_payload_models_are_built_on_first_use_not_at_import() -> None:
    probe = (
        "import json, agent.payloads as a, goals.payloads as g\n"
        "from agent.payloads import Payload\n"
        "def subs(c):\n"
        "    for s in c.__subclasses__():\n"
        "        yield s\n"
        "        yield from subs(s)\n"
        "kinds = list(subs(Payload))\n"
        "built = sorted(k.__qualname__ for k in kinds if k.__dict__.get('__pydantic_complete__'))\n"
        "print(json.dumps({'kinds': len(kinds), 'built': built}))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    found = json.loads(out.stdout)
    assert found["kinds"] >= 10  # the probe saw the payload kinds of both packages
    assert found["built"] == []
