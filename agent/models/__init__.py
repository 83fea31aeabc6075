"""Model providers: the interface, the shipped scripted model, and the registry of models by spec."""

from typing import TYPE_CHECKING

from agent.models.base import (
    ConvMessage,
    DeltaCallback,
    FinishReason,
    Model,
    ModelError,
    ModelErrorKind,
    ModelRequest,
    ModelResponse,
    ToolSpec,
)
from agent.models.scripted import Reply, ScriptedCall, ScriptedModel, ToolCall

__all__ = [
    "ConvMessage",
    "DeltaCallback",
    "FinishReason",
    "Model",
    "ModelError",
    "ModelErrorKind",
    "ModelRequest",
    "ModelResponse",
    "Reply",
    "ScriptedCall",
    "ScriptedModel",
    "ToolCall",
    "ToolSpec",
]

from agent.models.breaker import CircuitBreaker
from agent.models.health import GuardedModel, ProviderHealth
from agent.models.ratelimit import RateLimiter
from agent.models.registry import ModelRegistry, echo_model

__all__ += ["AnthropicModel", "CircuitBreaker", "GuardedModel", "OpenAIModel", "ProviderHealth", "RateLimiter"]
__all__ += ["ModelRegistry", "echo_model"]

# The provider classes load on first use, not with the package: the daemon reaches READY=1 without
# them (it imports the configured providers' modules when it builds its model registry), and they
# bring the HTTP layer with them. Their SDKs load later still, in their constructors.
if TYPE_CHECKING:
    from agent.models.anthropic import AnthropicModel
    from agent.models.openai import OpenAIModel

_LAZY = {"AnthropicModel": "agent.models.anthropic", "OpenAIModel": "agent.models.openai"}

if not TYPE_CHECKING:
    from agent.lazy import lazy_exports

    __getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
