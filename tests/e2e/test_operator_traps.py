"""What an operator trips over in the first week (issue 27, "Traps"), each through the real ``goald``
command and daemon (``tests/harness.py``).

A past ``--deadline`` is refused at ``goal add`` and ``goal edit``, naming the field (it would
exhaust the goal at once); the deadline a goal already has is kept by an edit of another budget.
``goal export`` takes a goal key and an id prefix, as its help and every other goal verb do.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from harness import Daemon, wait_goal

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
