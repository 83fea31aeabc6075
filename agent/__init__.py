"""goald's agent runtime: durable inbox, race-free driver, event log, spend guard.

``agent`` knows nothing of goals or sockets. Its public names are re-exported here; other
packages import only these.
"""

from agent.calls import usage_of_guard
from agent.driver import Agent, AgentConfig, AgentStatus, CallId, RetryPolicy, StatusSnapshot, history_message
from agent.errors import AgentError, Conflict, InvalidInput, InvalidTransition, NotFound, SchemaTooNew, StoreClosed
from agent.events import HISTORY_TYPES, Event, EventHub, EventType, Subscription
from agent.ids import GuardId, MessageId, SessionId, TurnId, TypedId
from agent.inbox import Admitted, Enqueued, cancel, cancel_all, enqueue, get_message, has_waking, settle_idle
from agent.messages import (
    MAX_MESSAGE_BYTES,
    Block,
    CancelReason,
    Content,
    Delivery,
    Fate,
    InboxMessage,
    Source,
    SourceKind,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    content_text,
    parse_content,
    parse_delivery,
    transition_fate,
)
from agent.models import (
    ConvMessage,
    FinishReason,
    Model,
    ModelError,
    ModelErrorKind,
    ModelRequest,
    ModelResponse,
    Reply,
    ScriptedModel,
    ToolCall,
    ToolSpec,
)
from agent.runtime import (
    ModelRegistry,
    Resolver,
    Runtime,
    SessionRow,
    SessionSetup,
    create_guard,
    create_session,
    echo_model,
    update_guard,
)
from agent.spend import Limits, Price, PromptEstimator, Refusal, Reservation, SpendGuard, Usage, estimator_for
from agent.store import Durability, Migration, SessionState, Store, Tx, utcnow
from agent.tools import FunctionTool, Tool, ToolContext, ToolOutput, ToolRegistry, truncate
from agent.turns import OUTCOME_UNKNOWN, EndReason, OpenedTurn, TurnEnd, end_turn, repair, take_or_idle

__all__ = [
    "HISTORY_TYPES", "MAX_MESSAGE_BYTES", "OUTCOME_UNKNOWN", "Admitted", "Agent", "AgentConfig", "AgentError",
    "AgentStatus", "Block", "CallId", "CancelReason", "Conflict", "Content", "ConvMessage", "Delivery",
    "Durability", "EndReason", "Enqueued", "Event", "EventHub", "EventType", "Fate", "FinishReason",
    "FunctionTool", "GuardId", "InboxMessage", "InvalidInput", "InvalidTransition", "Limits", "MessageId",
    "Migration", "Model", "ModelError", "ModelErrorKind", "ModelRegistry", "ModelRequest", "ModelResponse",
    "NotFound", "OpenedTurn", "Price", "PromptEstimator", "Refusal", "Reply", "Reservation", "Resolver",
    "RetryPolicy", "Runtime", "SchemaTooNew", "ScriptedModel", "SessionId", "SessionRow", "SessionSetup",
    "SessionState", "Source", "SourceKind", "SpendGuard", "StatusSnapshot", "Store", "StoreClosed",
    "Subscription", "TextBlock", "Tool", "ToolCall", "ToolContext", "ToolOutput", "ToolRegistry",
    "ToolResultBlock", "ToolSpec", "ToolUseBlock", "TurnEnd", "TurnId", "Tx", "TypedId", "Usage",
    "cancel", "cancel_all", "content_text", "create_guard", "create_session", "echo_model", "end_turn",
    "enqueue", "estimator_for", "get_message", "has_waking", "history_message", "parse_content",
    "parse_delivery", "repair", "settle_idle", "take_or_idle", "transition_fate", "truncate", "update_guard",
    "usage_of_guard", "utcnow",
]
