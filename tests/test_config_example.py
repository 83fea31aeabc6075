"""The shipped example configuration documents every settings key, and it loads as it stands and
with every commented-out key switched on."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from pydantic import BaseModel

from agent.spend import Price
from agent.tools.policy import ToolPolicy
from daemon.settings import (
    GoalSandbox,
    McpServerSettings,
    ModelLimits,
    ProviderSettings,
    RetentionSettings,
    SecretRef,
    Settings,
    load_settings,
)

EXAMPLE = Path(__file__).resolve().parent.parent / "config" / "goald.example.toml"
_TABLE = re.compile(r'\[([A-Za-z_][A-Za-z0-9_."-]*)\]\s*(#.*)?$')


def _documented_keys(text: str) -> set[str]:
    keys: set[str] = set()
    for line in text.splitlines():
        line = line.lstrip("# ").strip()
        keys.update(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*=", line))
        if m := _TABLE.match(line):
            keys.update(part.strip('"') for part in m.group(1).split("."))
    return keys


def test_every_settings_key_is_documented_in_the_example() -> None:
    documented = _documented_keys(EXAMPLE.read_text())
    models: list[type[BaseModel]] = [
        Settings,
        ProviderSettings,
        McpServerSettings,
        ModelLimits,
        SecretRef,
        GoalSandbox,
        RetentionSettings,
        ToolPolicy,
        Price,
    ]
    missing = {f"{m.__name__}.{name}" for m in models for name in m.model_fields if name not in documented}
    assert not missing, f"keys the example does not document: {sorted(missing)}"


def test_the_example_loads_as_it_stands(tmp_path: Path) -> None:
    settings = load_settings(EXAMPLE, state_dir=tmp_path)
    assert settings.durability == "normal"
    assert settings.max_concurrent_turns == 4


def test_the_example_loads_with_every_commented_key_switched_on(tmp_path: Path) -> None:
    # Uncomment every "# key = value" and "# [table]" line; what is prose stays a comment.
    lines = []
    for line in EXAMPLE.read_text().splitlines():
        body = line[2:] if line.startswith("# ") else None
        if body is not None and (_TABLE.match(body) or re.match(r"[A-Za-z_][A-Za-z0-9_]*\s*=", body)):
            lines.append(body)
        else:
            lines.append(line)
    text = "\n".join(lines)
    tomllib.loads(text)  # valid TOML first, so a failure below is about the settings
    full = tmp_path / "full.toml"
    full.write_text(text)
    settings = load_settings(full, state_dir=tmp_path)
    assert set(settings.providers) >= {"openai", "anthropic", "ollama", "mine"}
    assert settings.providers["anthropic"].prices["claude-sonnet-4-5"].cache_write == 3.75
    assert settings.mcp_servers["files"].network is False
    assert settings.goal_sandbox["nightly-report"].secrets["GIT_TOKEN"].credential == "git-token"
    assert settings.tool_policy is not None and "shell" in settings.tool_policy.allow
