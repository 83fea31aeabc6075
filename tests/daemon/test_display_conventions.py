"""The CLI's conventions as pure functions: one wording per reason, local times with their offset
(or UTC), relative ages, a goal table with a header, exits in words."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from daemon.display import age, exit_text, goal_table, reason_text, use_utc, when
from daemon.rpc.views import GoalView
from goals.why import span

NOW = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("stored", "shown"),
    [
        ("by_request", "by request"),
        ("cancelled by request", "by request"),  # an older goald's spelling reads the same
        ("no_verification", "unverified: no verification"),
        ("auth_error", "authentication failed"),
        ("cost_budget", "cost budget spent"),
        ("model_error: server: boom", "model error: server: boom"),
        ("blocked: needs a person", "blocked: needs a person"),
        ("continuation cancelled: gone", "continuation cancelled: gone"),
        (None, ""),
    ],
)
def test_one_wording_per_reason(stored: str | None, shown: str) -> None:
    assert reason_text(stored) == shown


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (45, "45s"), (60, "1m"), (80, "1m20s"), (600, "10m"), (3600, "1h"), (3900, "1h05m"), (93600, "1d2h")],
)
def test_spans(seconds: float, text: str) -> None:
    assert span(seconds) == text


def test_ages_and_times() -> None:
    assert age(NOW - timedelta(minutes=3), NOW) == "3m ago"
    assert age(NOW + timedelta(seconds=80), NOW) == "in 1m20s"
    assert age(NOW, NOW) == "now" and age(None) == "-"
    try:
        use_utc(True)
        assert when("2026-05-01T12:00:00.123456+02:00") == "2026-05-01 10:00:00+00:00"
    finally:
        use_utc(False)
    local = when("2026-05-01T12:00:00+00:00")
    offset = datetime(2026, 5, 1, 12, tzinfo=UTC).astimezone().strftime("%z")
    assert local.endswith(f"{offset[:3]}:{offset[3:]}") and "." not in local


def test_exits_in_words() -> None:
    assert exit_text({"exitCode": 127}) == "exit 127 (command not found)"
    assert exit_text({"exit_code": 126}) == "exit 126 (not executable)"
    assert exit_text({"exitCode": 1}) == "exit 1"
    assert exit_text({"exitCode": None, "timedOut": True}) == "timed out"


#: A well-formed goal id.
GID = "goal_" + "0" * 25 + "1"


def _view(fields: dict[str, object]) -> GoalView:
    """A goal view as ``goal/list`` sends one, with ``fields`` (the fields a goal must have besides)."""
    now = datetime.now(UTC).isoformat()
    required = {"objective": "o", "title": "t", "sessionId": "ses_1", "guardId": "guard_1", "updatedAt": now}
    return GoalView.model_validate({**required, **fields})


def test_goal_table_has_a_header_and_aligned_columns() -> None:
    g = {
        "id": GID,
        "key": None,
        "status": "paused",
        "statusReason": "by_request",
        "createdAt": (datetime.now(UTC) - timedelta(minutes=5)).isoformat(),
        "rounds": 2,
        "budgets": {"maxRounds": 10},
        "tokens": 12345,
        "cost": 0.5,
        "model": "test:worker",
    }
    header, row = goal_table([_view(g)])
    columns = ["ID", "KEY", "STATUS", "REASON", "ACTIVITY", "AGE", "ROUNDS", "TOKENS", "COST", "MODEL", "LAST", "ERROR"]
    assert header.split() == columns
    assert row.split("  ")[0] == GID and "by request" in row and "5m ago" in row
    assert row[header.index("LAST ERROR") :] == "-"  # a pause by request has no error behind it
    assert row.index("test:worker") == header.index("MODEL")
    assert row.index("12,345") + len("12,345") == header.index("TOKENS") + len("TOKENS")


def test_goal_list_shows_what_an_active_goal_is_doing() -> None:
    base = {"id": GID, "status": "active", "createdAt": datetime.now(UTC).isoformat(), "rounds": 1,
            "budgets": {}, "tokens": 0, "cost": 0.0}  # fmt: skip
    until = datetime(2026, 5, 1, 12, 3, tzinfo=UTC)
    use_utc(True)
    try:
        for activity, shown in [
            ({"state": "turn_running"}, "turn running"),
            ({"state": "waiting_provider"}, "waiting for provider"),
            ({"state": "waiting_provider", "until": until.isoformat()}, "waiting for provider until 12:03"),
            ({"state": "backoff", "until": until.isoformat()}, "backoff until 12:03"),
            ({"state": "waiting_slot"}, "waiting for a slot"),
            ({"state": "paused"}, "-"),
            (None, "-"),
        ]:
            header, row = goal_table([_view({**base, "activity": activity})])
            start = header.index("ACTIVITY")
            assert row[start:].startswith(shown + "  "), (activity, row)
    finally:
        use_utc(False)
