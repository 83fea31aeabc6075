"""The shipped example configuration documents every settings key, and it loads (once its placeholder
``default_model`` is set) as it stands and with every commented-out key switched on; as shipped,
``goald config check`` refuses it, naming the placeholder."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

from harness import child_env, goald_argv
from pydantic import BaseModel

from agent.secret import SecretSource
from agent.spend import Price
from agent.tools.policy import ToolPolicy
from daemon.cluster.settings import ClusterSettings
from daemon.settings import (
    GoalSandbox,
    McpServerSettings,
    ModelLimits,
    ProviderSettings,
    RetentionSettings,
    Settings,
    StorageSettings,
    load_settings,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "goald.example.toml"
#: What an operator sets in place of the example's placeholder.
MODEL = 'default_model = "openai:gpt-4o-mini"'
_TABLE = re.compile(r'\[\[?([A-Za-z_][A-Za-z0-9_."-]*)\]\]?\s*(#.*)?$')  # a table, or an array of tables


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
        SecretSource,
        GoalSandbox,
        RetentionSettings,
        StorageSettings,
        ClusterSettings,
        ToolPolicy,
        Price,
    ]
    missing = {f"{m.__name__}.{name}" for m in models for name in m.model_fields if name not in documented}
    assert not missing, f"keys the example does not document: {sorted(missing)}"


def _with_model(text: str) -> str:
    """The example with its placeholder model set, as the operator is told to."""
    placeholder = 'default_model = "CHANGE-ME:model"'
    assert text.count(placeholder) == 1
    return text.replace(placeholder, MODEL)


def test_the_example_loads_as_it_stands_once_its_model_is_set(tmp_path: Path) -> None:
    path = tmp_path / "goald.toml"
    path.write_text(_with_model(EXAMPLE.read_text()))
    settings = load_settings(path, state_dir=tmp_path)
    assert settings.durability == "normal"
    assert settings.max_concurrent_turns == 4
    assert settings.default_model == "openai:gpt-4o-mini"


def test_config_check_refuses_the_example_until_its_model_is_set(tmp_path: Path) -> None:
    argv = [*goald_argv(), "config", "check", "--config", str(EXAMPLE)]
    done = subprocess.run(argv, env=child_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 78 and done.stdout == "", done
    assert "default_model" in done.stderr and "placeholder 'CHANGE-ME:model'" in done.stderr, done.stderr
    assert "set the model goals use" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_the_example_loads_with_every_commented_key_switched_on(tmp_path: Path) -> None:
    # Uncomment every "# key = value" and "# [table]" line; what is prose stays a comment.
    lines = []
    for line in EXAMPLE.read_text().splitlines():
        body = line[2:] if line.startswith("# ") else None
        if body is not None and (_TABLE.match(body) or re.match(r"[A-Za-z_][A-Za-z0-9_]*\s*=", body)):
            lines.append(body)
        else:
            lines.append(line)
    text = _with_model("\n".join(lines))
    tomllib.loads(text)  # valid TOML first, so a failure below is about the settings
    full = tmp_path / "full.toml"
    full.write_text(text)
    settings = load_settings(full, state_dir=tmp_path)
    assert set(settings.providers) >= {"openai", "anthropic", "ollama", "mine"}
    assert settings.providers["anthropic"].prices["claude-sonnet-4-5"].cache_write == 3.75
    assert settings.mcp_servers["files"].network is False
    assert settings.goal_sandbox["nightly-report"].secrets["GIT_TOKEN"].credential == "git-token"
    assert settings.tool_policy is not None and "shell" in settings.tool_policy.allow
