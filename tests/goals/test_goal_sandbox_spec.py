"""A goal's own sandbox settings: validation with clear errors, and how they merge with the config's."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from agent.limits import MIB
from agent.sandbox import Network, SandboxPolicy, SandboxProfile
from daemon.goal_sandbox import check_spec, goal_policy
from daemon.settings import Settings
from goals import Budgets, Goal, GoalId, GoalStatus, SandboxSpec, StopRules

T0 = datetime(2025, 3, 1, tzinfo=UTC)


def goal(key: str | None, spec: SandboxSpec) -> Goal:
    return Goal(id=GoalId.new(), key=key, title="t", objective="o", status=GoalStatus.ACTIVE, session_id="ses_x",
                guard_id="grd_x", budgets=Budgets(), verify=[], rules=StopRules(), sandbox=spec, created_at=T0,
                updated_at=T0)  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ({"read_only_paths": ["opt/tool"]}, "must be absolute"),
        ({"read_only_paths": ["/"]}, "whole host"),
        ({"read_only_paths": ["/opt/../root"]}, "'..'"),
        ({"max_processes": 2}, "greater than or equal to 8"),
        ({"max_memory_mb": 1}, "greater than or equal to 16"),
        ({"secrets": {"bad-name": {"env": "X"}}}, "not a valid environment variable name"),
        ({"secrets": {"PATH": {"env": "X"}}}, "set by the sandbox"),
        ({"secrets": {"T": {"env": "X", "credential": "c"}}}, "exactly one"),
        ({"secrets": {"T": {"credential": "../etc/shadow"}}}, "file name"),
        ({"network": True, "extra": 1}, "Extra inputs"),
    ],
)
def test_bad_sandbox_settings_are_refused_saying_why(raw: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        SandboxSpec.model_validate(raw)


def test_the_spec_and_the_config_entry_merge_field_by_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPEC_TEST_TOKEN", "spec-token-value")
    configured = SandboxPolicy(network=True, secrets={"SHARED": "from-config"}, read_only=(Path("/opt/a"),),
                               max_processes=100, max_memory_bytes=512 * MIB)  # fmt: skip
    profile = SandboxProfile(policies={"k": configured})
    spec = SandboxSpec.model_validate(
        {
            "network": False,
            "read_only_paths": ["/opt/b", "/opt/a"],
            "max_processes": 200,
            "max_memory_mb": 256,
            "secrets": {"OWN": {"env": "SPEC_TEST_TOKEN"}, "SHARED": {"env": "SPEC_TEST_TOKEN"}},
        }
    )
    merged = goal_policy(profile, goal("k", spec))
    assert merged.network == Network("off")  # an explicit false ("off") wins
    assert merged.read_only == (Path("/opt/a"), Path("/opt/b"))
    assert (merged.max_processes, merged.max_memory_bytes) == (100, 256 * MIB)  # the smaller caps
    assert dict(merged.secrets) == {"OWN": "spec-token-value", "SHARED": "from-config"}
    # Only the spec: its own values; neither: the config entry (or nothing) as before.
    alone = goal_policy(profile, goal(None, SandboxSpec(network=True)))
    assert alone.network == Network("host") and alone.max_processes is None
    assert goal_policy(profile, goal("k", SandboxSpec())) is configured
    assert goal_policy(profile, goal("k", SandboxSpec(network=True))).network == Network("host")
    # An allow list on either side is stricter than "host"; with "off" on the other, "off".
    listed = SandboxSpec.model_validate({"network": {"allow": ["pypi.org"]}})
    assert goal_policy(profile, goal("k", listed)).network == Network("allow", ("pypi.org",))
    assert goal_policy(
        SandboxProfile(policies={"k": SandboxPolicy(network=Network("off"))}), goal("k", listed)
    ).network == Network("off")


def test_a_spec_may_not_hand_a_provider_key_to_commands() -> None:
    settings = Settings(providers={"oa": {"kind": "openai", "api_key_env": "OA_KEY"}})
    spec = SandboxSpec.model_validate({"secrets": {"T": {"env": "OA_KEY"}}})
    with pytest.raises(ValueError, match="provider's API key"):
        check_spec(settings, spec)
    check_spec(settings, SandboxSpec.model_validate({"secrets": {"T": {"env": "OTHER"}}}))
