"""goald's goal engine: durable goals that advance at whole-agent idle, exactly once.

``goals`` imports ``agent`` and never the reverse; it knows nothing of sockets. Its public names
are re-exported here.
"""

from goals.continuation import quote, render, stable_part
from goals.engine import (
    GoalEngine,
    goal_policy,
    guard_limits,
    interval_facts,
    policy_for_session,
    tools_for_goal_sessions,
)
from goals.locks import claim_workdir, workdir_holder
from goals.model import (
    Budgets,
    Goal,
    GoalId,
    GoalMemory,
    GoalSpec,
    GoalStatus,
    SandboxSpec,
    SecretSource,
    StopReason,
    StopRules,
    VerifyCommand,
    VerifyResult,
    transition,
)
from goals.policy import Claim, ContinuationFate, Decision, DecisionKind, Interval, PolicyInput, budget_spent, decide
from goals.store import (
    GOAL_BLOCKED,
    GOAL_CHANGED,
    GOAL_CLAIM,
    GOAL_PROGRESS,
    GOAL_VERIFIED,
    MIGRATIONS,
    StaleDecision,
    goal_from_row,
    live_goal_of_session,
    load_goal,
    pending_key,
)
from goals.tools import GOAL_TOOL_NAMES, GoalBlocked, GoalComplete, GoalProgress, goal_tools
from goals.verify import CommandRunner, fingerprint, progress_digest, run_all, run_command, sandboxed_runner

__all__ = [
    "GOAL_BLOCKED",
    "GOAL_CHANGED",
    "GOAL_CLAIM",
    "GOAL_PROGRESS",
    "GOAL_TOOL_NAMES",
    "GOAL_VERIFIED",
    "MIGRATIONS",
    "Budgets",
    "Claim",
    "CommandRunner",
    "ContinuationFate",
    "Decision",
    "DecisionKind",
    "Goal",
    "GoalBlocked",
    "GoalComplete",
    "GoalEngine",
    "GoalId",
    "GoalMemory",
    "GoalProgress",
    "GoalSpec",
    "GoalStatus",
    "Interval",
    "PolicyInput",
    "SandboxSpec",
    "SecretSource",
    "StaleDecision",
    "StopReason",
    "StopRules",
    "VerifyCommand",
    "VerifyResult",
    "budget_spent",
    "claim_workdir",
    "decide",
    "fingerprint",
    "goal_from_row",
    "goal_policy",
    "goal_tools",
    "guard_limits",
    "interval_facts",
    "live_goal_of_session",
    "load_goal",
    "pending_key",
    "policy_for_session",
    "progress_digest",
    "quote",
    "render",
    "run_all",
    "run_command",
    "sandboxed_runner",
    "stable_part",
    "tools_for_goal_sessions",
    "transition",
    "workdir_holder",
]
