"""The disk-limit rule of the goal policy, as a table (issue 24, "Disk"): a work directory that holds
more on disk than the goal's limit pauses the goal ``disk_limit`` with the figures in plain words;
at or under the limit, or with no limit or no measure, nothing changes. Its precedence against every
other fact is pinned in ``test_goal_policy_pairs.py``."""

from __future__ import annotations

import pytest
from test_goal_policy import NOW, make_goal, make_interval

from daemon.display import reason_text
from goals import DecisionKind, GoalStatus, PolicyInput, StopReason, decide
from goals.policy import disk_over

KIB, MIB, GIB = 1024, 1024**2, 1024**3


@pytest.mark.parametrize(
    ("disk_bytes", "limit", "reason"),
    [
        (int(1.2 * GIB), GIB, "disk_limit: the work directory holds 1.2 GiB, over its 1 GiB limit"),
        (GIB + 1, GIB, "disk_limit: the work directory holds 1 GiB, over its 1 GiB limit"),
        (300 * MIB, 256 * MIB, "disk_limit: the work directory holds 300 MiB, over its 256 MiB limit"),
        (54 * MIB + 512 * KIB, 16 * MIB, "disk_limit: the work directory holds 54.5 MiB, over its 16 MiB limit"),
        (GIB, GIB, None),  # at the limit: not over it
        (10, GIB, None),
        (5 * GIB, None, None),  # no limit
        (None, GIB, None),  # not measured (no work directory)
    ],
)
def test_a_work_directory_over_its_disk_limit_pauses_the_goal_with_the_figures(
    disk_bytes: int | None, limit: int | None, reason: str | None
) -> None:
    assert disk_over(disk_bytes, limit) == reason
    decision = decide(PolicyInput(make_goal(), make_interval(), NOW, disk_bytes=disk_bytes, disk_limit=limit))
    if reason is None:
        assert decision.kind is DecisionKind.CONTINUE
        return
    assert decision.kind is DecisionKind.PAUSE and decision.continuation is None
    assert decision.goal.status is GoalStatus.PAUSED and decision.goal.status_reason == reason
    assert reason.startswith(StopReason.DISK_LIMIT + ": ")
    # In plain words wherever a status is shown.
    assert reason_text(reason) == "disk limit: " + reason.removeprefix("disk_limit: ")
    assert reason_text(StopReason.DISK_LIMIT) == "disk limit reached"


def test_a_paused_goal_over_its_disk_limit_only_counts() -> None:
    goal = make_goal(status=GoalStatus.PAUSED)
    decision = decide(PolicyInput(goal, make_interval(), NOW, disk_bytes=2 * GIB, disk_limit=GIB))
    assert decision.kind is DecisionKind.BOOKKEEP and decision.goal.status_reason == goal.status_reason
