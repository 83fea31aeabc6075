"""Start-up stays lean: what the daemon imports on its way to ``READY=1`` is pinned by count, not time.

The provider modules (and their SDKs and HTTP stack) load when a configured provider is built,
APScheduler when the first schedule is armed, the RPC params and schedule models are built on
first use; a fresh interpreter shows whether an import crept back onto the start-up path.
"""

from __future__ import annotations

import json
import subprocess
import sys

# What `goald serve` imports before it serves (the CLI, settings, the host and its services).
SERVE_PATH = "import daemon.cli, daemon.settings, daemon.host, daemon.schedule.service, daemon.rpc.methods"

PROBE = f"""
import json, sys
{SERVE_PATH}
from pydantic import BaseModel
import daemon.rpc.params, daemon.schedule.model

def subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from subclasses(sub)

built = sorted(
    {{m.__module__ + "." + m.__qualname__ for m in subclasses(BaseModel)
      if m.__module__ in ("daemon.rpc.params", "daemon.schedule.model") and m.__dict__.get("__pydantic_complete__")}}
)
print(json.dumps({{"modules": sorted(sys.modules), "built": built}}))
"""

#: Loaded only when a provider, an MCP client, the HTTP stack or a schedule's timer is actually used.
NOT_AT_START = (
    "openai",
    "anthropic",
    "mcp",
    "httpx",
    "httpx2",
    "agent.models.openai",
    "agent.models.anthropic",
    "apscheduler",
)


def _probe() -> dict[str, list[str]]:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True)
    result: dict[str, list[str]] = json.loads(out.stdout)
    return result


def test_the_serve_path_loads_no_provider_module_sdk_or_http_stack() -> None:
    modules = set(_probe()["modules"])
    assert "daemon.host" in modules  # the probe did import the serve path
    loaded = sorted(name for name in NOT_AT_START if name in modules)
    assert loaded == [], f"imported on the way to READY=1: {loaded}"


def test_rpc_params_and_schedule_models_are_not_built_at_import() -> None:
    assert _probe()["built"] == []


def test_the_provider_classes_still_import_from_the_package() -> None:
    from agent.models import AnthropicModel, OpenAIModel
    from agent.models.anthropic import AnthropicModel as Direct

    assert AnthropicModel is Direct
    assert OpenAIModel.__name__ == "OpenAIModel"
