"""Model providers: the interface and the shipped scripted model."""

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

# The real providers import their SDKs lazily (in their constructors), so importing them is cheap.
from agent.models.anthropic import AnthropicModel
from agent.models.health import CircuitBreaker, GuardedModel, ProviderHealth, RateLimiter
from agent.models.openai import OpenAIModel

__all__ += ["AnthropicModel", "CircuitBreaker", "GuardedModel", "OpenAIModel", "ProviderHealth", "RateLimiter"]
