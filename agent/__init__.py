"""goald's agent runtime: durable inbox, race-free driver, event log, spend guard.

``agent`` knows nothing of goals or sockets. The names other packages commonly need are
re-exported here (every one is imported through here somewhere: ``tests/test_import_layers.py``);
a package that needs one narrow part imports its module (``agent.db`` for transaction functions,
``agent.sandbox.*``, ``agent.models.*``). This is a convenience, not an enforced facade
(``docs/architecture.md#packages-and-the-import-direction`` says why).

It owns the tables ``sessions``, ``inbox``, ``turns``, ``events``, ``guards``, ``model_calls`` and
``schema_versions``; other packages read and change them only through its functions (e.g.
:func:`cancel_pending`, :func:`is_pending`, :func:`update_session`, :func:`list_sessions`,
:func:`session_chain`, :func:`first_kept_seq`), never with SQL of their own. Errors derive from
:class:`AgentError`.
"""

from agent import retention
from agent.background import TaskSet
from agent.calls import CallId, usage_of_guard
from agent.config import AgentConfig, RetryPolicy
from agent.driver import Agent, StatusSnapshot
from agent.errors import (
    AgentError,
    Conflict,
    InvalidInput,
    InvalidTransition,
    NotFound,
    SchemaTooNew,
    StorageUnavailable,
    StoreClosed,
)
from agent.eventlog import first_kept_seq, read_events
from agent.events import Event, EventHub, EventType, Subscription
from agent.guards import create_guard, update_guard
from agent.ids import MessageId, SessionId, TurnId, TypedId
from agent.inbox import (
    Enqueued,
    cancel_pending,
    enqueue,
    get_message,
    is_pending,
)
from agent.interval import IntervalWatcher, RunFacts, is_idle, watch_interval
from agent.limits import CommandLimits
from agent.messages import (
    MAX_MESSAGE_BYTES,
    CancelReason,
    Delivery,
    Fate,
    Source,
    SourceKind,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    parse_content,
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
from agent.models.registry import ModelRegistry, echo_model
from agent.payloads import (
    AgentStatus,
    AssistantMessage,
    ContextCompacted,
    EndReason,
    MessageAdmitted,
    MessageCancelled,
    MessageQueued,
    ModelCharged,
    ModelFailed,
    OtherPayload,
    Payload,
    SessionCreated,
    StatusChanged,
    ToolResult,
    TurnEnded,
    TurnStarted,
    parse_payload,
    register_payloads,
)
from agent.redact import Redactor
from agent.runtime import Runtime
from agent.sandbox import (
    Bwrap,
    Sandbox,
    SandboxPolicy,
    SandboxProfile,
    SandboxUnavailable,
    detect_bwrap,
)
from agent.schema import Migration
from agent.sessions import (
    SessionRow,
    create_session,
    delete_session,
    list_sessions,
    load_session,
    session_chain,
    sessions_with_workdir,
    update_session,
)
from agent.setup import SessionSetup
from agent.spend import Limits, Price, PromptEstimator, Refusal, SpendGuard, Usage, estimator_for
from agent.store import Durability, Store
from agent.subagents import DEFAULT_MAX_DEPTH, Delegate
from agent.tools import (
    FunctionTool,
    McpServer,
    McpServers,
    McpUnavailable,
    Shell,
    Tool,
    ToolContext,
    ToolOutput,
    ToolPolicy,
    ToolRegistry,
    file_tools,
)
from agent.turns import OUTCOME_UNKNOWN, take_or_idle
from agent.tx import SessionState, Tx

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "MAX_MESSAGE_BYTES",
    "OUTCOME_UNKNOWN",
    "Agent",
    "AgentConfig",
    "AgentError",
    "AgentStatus",
    "AssistantMessage",
    "Bwrap",
    "CallId",
    "CancelReason",
    "CommandLimits",
    "Conflict",
    "ContextCompacted",
    "ConvMessage",
    "Delegate",
    "Delivery",
    "Durability",
    "EndReason",
    "Enqueued",
    "Event",
    "EventHub",
    "EventType",
    "Fate",
    "FinishReason",
    "FunctionTool",
    "IntervalWatcher",
    "InvalidInput",
    "InvalidTransition",
    "Limits",
    "McpServer",
    "McpServers",
    "McpUnavailable",
    "MessageAdmitted",
    "MessageCancelled",
    "MessageId",
    "MessageQueued",
    "Migration",
    "Model",
    "ModelCharged",
    "ModelError",
    "ModelErrorKind",
    "ModelFailed",
    "ModelRegistry",
    "ModelRequest",
    "ModelResponse",
    "NotFound",
    "OtherPayload",
    "Payload",
    "Price",
    "PromptEstimator",
    "Redactor",
    "Refusal",
    "Reply",
    "RetryPolicy",
    "RunFacts",
    "Runtime",
    "Sandbox",
    "SandboxPolicy",
    "SandboxProfile",
    "SandboxUnavailable",
    "SchemaTooNew",
    "ScriptedModel",
    "SessionCreated",
    "SessionId",
    "SessionRow",
    "SessionSetup",
    "SessionState",
    "Shell",
    "Source",
    "SourceKind",
    "SpendGuard",
    "StatusChanged",
    "StatusSnapshot",
    "StorageUnavailable",
    "Store",
    "StoreClosed",
    "Subscription",
    "TaskSet",
    "TextBlock",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolOutput",
    "ToolPolicy",
    "ToolRegistry",
    "ToolResult",
    "ToolResultBlock",
    "ToolSpec",
    "ToolUseBlock",
    "TurnEnded",
    "TurnId",
    "TurnStarted",
    "Tx",
    "TypedId",
    "Usage",
    "cancel_pending",
    "create_guard",
    "create_session",
    "delete_session",
    "detect_bwrap",
    "echo_model",
    "enqueue",
    "estimator_for",
    "file_tools",
    "first_kept_seq",
    "get_message",
    "is_idle",
    "is_pending",
    "list_sessions",
    "load_session",
    "parse_content",
    "parse_payload",
    "read_events",
    "register_payloads",
    "retention",
    "session_chain",
    "sessions_with_workdir",
    "take_or_idle",
    "transition_fate",
    "update_guard",
    "update_session",
    "usage_of_guard",
    "watch_interval",
]
