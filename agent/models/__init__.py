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
