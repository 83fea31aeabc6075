"""What an operator trips over in the first week (issue 27, "Traps"), each through the real ``goald``
command and daemon (``tests/harness.py``).

A past ``--deadline`` is refused at ``goal add`` and ``goal edit``, naming the field (it would
exhaust the goal at once); the deadline a goal already has is kept by an edit of another budget.
``goal export`` takes a goal key and an id prefix, as its help and every other goal verb do.
A SIGHUP after ``goals_file`` was added to the configuration loads it, and the reload is logged.
"""

from __future__ import annotations

import asyncio
import json
import signal
from datetime import UTC, datetime, timedelta

import pytest
from harness import TEST_MODELS, Daemon, toml_text, wait_goal

pytestmark = pytest.mark.e2e


async def test_a_past_deadline_is_refused_at_goal_add_and_goal_edit(daemon: Daemon) -> None:
    d = daemon
    past = (datetime.now(UTC) - timedelta(hours=1)).isoformat(timespec="seconds")
    code, out, err = await d.acli("goal", "add", "x", "--model", "scripted:demo", "--deadline", past)
    assert code == 2, (code, out, err)
    assert "budgets.deadline" in err and "already past" in err, err
    assert (await d.acli_json("goal", "list")) == []  # nothing was written

    future = (datetime.now(UTC) + timedelta(days=1)).isoformat(timespec="seconds")
    made = await d.acli_json("goal", "add", "x", "--model", "scripted:demo", "--key", "later", "--deadline", future)
    code, out, err = await d.acli("goal", "edit", "later", "--deadline", past)
    assert code == 2, (code, out, err)
    assert "budgets.deadline" in err and "already past" in err, err
    kept = await d.acli_json("goal", "show", made["goalId"])
    assert datetime.fromisoformat(kept["budgets"]["deadline"]) == datetime.fromisoformat(future)


async def test_goal_export_takes_a_key_and_an_id_prefix(daemon: Daemon) -> None:
    d = daemon
    made = await d.acli_json("goal", "add", "x [rounds=1]", "--model", "test:worker", "--key", "rounds")
    goal_id = made["goalId"]
    await wait_goal(d.socket_path, goal_id, {"completed"})
    for ref in ("rounds", goal_id[:12], goal_id):
        code, out, err = await d.acli("goal", "export", ref)
        assert code == 0, (ref, code, err)
        assert json.loads(out)["goal"]["id"] == goal_id, ref
    code, _out, err = await d.acli("goal", "export", "nosuchkey")
    assert code == 3 and "no goal with key 'nosuchkey'" in err, (code, err)


def reload_status(d: Daemon) -> str:
    """The STATUS= of the READY=1 that ends a reload (systemd's reload protocol)."""
    d.wait_message("RELOADING=1")
    while True:
        fields = d.next_message(30, waiting_for="READY=1 after the reload").split("\n")
        if "READY=1" in fields:
            return next((f for f in fields if f.startswith("STATUS=")), "")


async def test_a_reload_that_adds_goals_file_loads_it_and_says_so(daemon: Daemon) -> None:
    d = daemon
    assert d.proc is not None
    goals = d.state_dir.parent / "goals.toml"
    goals.write_text('[[goal]]\nkey = "declared"\nobjective = "x [rounds=1]"\nmodel = "test:worker"\n')
    config = {"state_dir": str(d.state_dir), "log_level": "DEBUG", **TEST_MODELS, "goals_file": str(goals)}
    d.config_path.write_text(toml_text(config))
    d.proc.send_signal(signal.SIGHUP)
    status = await asyncio.to_thread(reload_status, d)
    assert "reloaded 1 goal(s), 0 schedule(s)" in status, status
    keys = [g["key"] for g in await d.acli_json("goal", "list")]
    assert keys == ["declared"], keys
    log = d.stderr()
    assert f"reload: goals_file is now {goals} (was None)" in log
    assert f"reload: applied {goals}: 1 goal(s), 0 schedule(s)" in log
