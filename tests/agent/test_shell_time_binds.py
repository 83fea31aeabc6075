"""A shell command is bound by its session's time, not only by its own timeout.

* End to end (a real daemon, bubblewrap, a scripted model): a goal with a 3 s wall-time budget
  whose model runs ``sleep 30`` in ``shell`` (timeout 60 s): the command is killed when the wall
  time runs out, the tool result says so, the goal ends ``exhausted`` for its wall time having used
  little more than its budget.
* Unit (real bubblewrap, a real spend guard): with no time left the command is not run; with more
  time left than the timeout the timeout is what binds, and the result says ``timed out``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from harness import Daemon, all_events, rpc, wait_goal
from sandboxkit import sandbox_in

from agent import Sandbox, SpendGuard
from agent.spend import Limits
from agent.tools.base import GUARD_KEY, ToolContext
from agent.tools.shell import TIME_RAN_OUT, Shell, ShellArgs

pytestmark = pytest.mark.needs_bwrap

BUDGET = 3.0
CONFIG: dict[str, Any] = {
    "model_call_min_seconds": 0.5,
    "providers": {"gs": {"kind": "scripted", "script": "goal_scripts:models"}},
}


async def test_a_command_running_when_the_wall_time_runs_out_is_stopped(tmp_path: Path) -> None:
    d = Daemon(tmp_path / "state", config=CONFIG)
    try:
        d.start()
        started = time.monotonic()
        goal = await rpc(
            d.socket_path,
            "goal/create",
            {"objective": "Sleep.", "model": "gs:sleeper", "budgets": {"maxWallSeconds": BUDGET}},
        )
        final = await wait_goal(d.socket_path, goal["goalId"], {"exhausted", "paused", "failed", "completed"}, 25)
        elapsed = time.monotonic() - started
        events = await all_events(d.socket_path, goal["sessionId"])
    finally:
        d.close()

    results = [e["data"] for e in events if e["type"] == "tool/result"]
    assert len(results) == 1, results
    assert results[0]["isError"] and results[0]["content"].startswith(f"stopped: {TIME_RAN_OUT} after")
    assert (final["status"], final["statusReason"]) == ("exhausted", "wall_time"), final
    # Cut at the wall time, not after the 30 s of the sleep nor the 60 s of its own timeout (bounds
    # far inside those, not a speed check a loaded machine could fail; the overshoot is printed).
    assert final["wallUsed"] < 15, final["wallUsed"]
    assert elapsed < 15, elapsed
    print(f"\nwallUsed {final['wallUsed']:.3f}s of a {BUDGET:g}s budget with `sleep 30` in shell")


def sandbox(workdir: Path) -> Sandbox:
    return sandbox_in(workdir)


def guarded(workdir: Path, limits: Limits) -> ToolContext:
    guard = SpendGuard(id=None, limits=limits, wall_started_at=datetime.now(UTC))
    return ToolContext(session_id="s", turn_id="t", call_id="c", workdir=workdir, extra={GUARD_KEY: guard})


async def test_with_no_time_left_the_command_is_not_run(tmp_path: Path) -> None:
    shell = Shell(sandbox(tmp_path))
    marker = tmp_path / "ran"
    passed = Limits(deadline=datetime.now(UTC) - timedelta(seconds=1))
    out = await shell.run(ShellArgs(command=f"touch {marker}"), guarded(tmp_path, passed))
    assert out.is_error and out.content == f"not run: {TIME_RAN_OUT}"
    assert not marker.exists()


async def test_the_deadline_stops_a_command_and_the_own_timeout_still_binds_first(tmp_path: Path) -> None:
    shell = Shell(sandbox(tmp_path))
    soon = Limits(deadline=datetime.now(UTC) + timedelta(seconds=1), max_wall_seconds=600)
    started = time.monotonic()
    out = await shell.run(ShellArgs(command="sleep 30", timeout_seconds=60), guarded(tmp_path, soon))
    assert time.monotonic() - started < 10
    assert out.is_error and out.content.startswith(f"stopped: {TIME_RAN_OUT} after"), out.content

    later = Limits(max_wall_seconds=600)
    out = await shell.run(ShellArgs(command="sleep 30", timeout_seconds=0.5), guarded(tmp_path, later))
    assert out.is_error and out.content.startswith("timed out after 0.5s"), out.content
    out = await shell.run(ShellArgs(command="echo hi"), guarded(tmp_path, later))
    assert not out.is_error and "hi" in out.content
