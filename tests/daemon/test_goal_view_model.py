"""A goal view read back into a model (:class:`daemon.rpc.views.GoalView`): what a client reads as
attributes is what the daemon's goal was, field for field (its memory aside, which the view leaves
out), and the view's own keys come along."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from daemon.rpc.views import GoalView, goal_view
from goals import Budgets, Goal, GoalId, GoalMemory, GoalStatus, SandboxSpec, StopRules, VerifyCommand, VerifyResult

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def _goal() -> Goal:
    return Goal(
        id=GoalId.new(),
        key="nightly",
        idempotency_key="sch_x@2026-01-02T03:04:05+00:00",
        title="t",
        objective="o",
        status=GoalStatus.PAUSED,
        status_reason="stalled",
        session_id="ses_x",
        guard_id="grd_x",
        workdir="/w",
        model="m",
        tools=["read"],
        budgets=Budgets(max_rounds=3, max_cost=2.0, deadline=NOW),
        verify=[VerifyCommand(cmd="make test", timeout=60)],
        rules=StopRules(stall_rounds=2, infra_retries=4),
        progress=VerifyCommand(cmd="git rev-parse HEAD"),
        sandbox=SandboxSpec.model_validate(
            {"network": {"allow": ["pypi.org"]}, "read_only_paths": ["/opt"], "secrets": {"GIT_TOKEN": {"env": "GT"}}}
        ),
        keep_workdir=True,
        node_label="gpu",
        rounds=2,
        tokens=1234,
        cost=0.5,
        infra_rounds=1,
        interrupted_tokens=7,
        wall_used=3.5,
        not_before=NOW,
        memory=GoalMemory(
            notes=["tried x"],
            last_error="e",
            verify_results=[VerifyResult(cmd="make test", exit_code=2, output_tail="FAILED")],
        ),
        result_summary=None,
        created_at=NOW,
        updated_at=NOW,
        revision=5,
    )


def test_a_goal_view_reads_back_as_the_goal_it_shows() -> None:
    goal = _goal()
    wire = json.loads(json.dumps(goal_view(goal, NOW)))  # as a client receives it
    view = GoalView.model_validate(wire)
    for name in Goal.model_fields:
        if name != "memory":
            assert getattr(view, name) == getattr(goal, name), name
    assert view.session_id == "ses_x" and view.budgets.max_rounds == 3 and view.rules.infra_retries == 4
    assert view.notes == ["tried x"] and view.last_error == "e" and view.why == wire["why"] and view.why
    assert view.last_verification == [wire["lastVerification"][0]] and view.last_verification[0]["exitCode"] == 2


def test_keys_a_newer_daemon_adds_are_ignored() -> None:
    wire = json.loads(json.dumps(goal_view(_goal(), NOW)))
    view = GoalView.model_validate({**wire, "activity": {"state": "paused"}, "colour": "red"})
    assert view.activity == {"state": "paused"} and not hasattr(view, "colour")
