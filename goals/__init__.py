"""goald's goal engine: durable goals that advance at whole-agent idle, exactly once.

``goals`` imports ``agent`` and never the reverse; it knows nothing of sockets. Its public names
are re-exported here.

It owns the ``goals`` table (and its work-directory lock triggers): its schema (``schema``), the
mapping of a goal to a row (``rows``), the reads (``queries``) and the writes (``store``, which
re-exports the rest), and other packages read goals only through those functions (counts by
status, the live goals, the live goal of a session or of a subagent's chain of sessions). It reaches the
runtime's tables only through the runtime's functions (enqueue and cancel by pending key, attach a
guard and settings to a session). Errors derive from :class:`~goals.errors.GoalError`.

Modules: the goal and its lifecycle (``model``), the engine's loop (``engine``) and its parts
(``facts``: an interval's events read into facts; ``measure``: the work directory and the goal's
commands; ``policy``: the pure decision, with its input and output types in ``decision`` and the
budget arithmetic in ``budgets``; ``evaluations``: one evaluation per goal at a time, retried;
``timers``; ``creation``; ``operations``: a person's pause, resume, cancel, edit and delete;
``requests``: the engine's person-facing methods; ``following``: the goals it follows), the
continuation text (``continuation``), the goal tools and tool policy (``tools``), verification and
fingerprints (``verify``), work-directory claims (``locks``), the ``goals`` table (``schema``,
``rows``, ``queries``, ``store``), event payloads (``payloads``), pruning (``retention``), why a goal
stands where it stands in plain words (``why``) and errors (``errors``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from goals.continuation import quote, render, stable_part
    from goals.engine import GoalEngine
    from goals.errors import GoalConflict, GoalError, GoalNotFound, InvalidGoal, InvalidGoalTransition, StaleDecision
    from goals.facts import interval_facts
    from goals.fingerprint_limits import FingerprintLimits, size_text
    from goals.locks import CLAIMS, check_nesting, claim_workdir
    from goals.model import (
        Budgets,
        Goal,
        GoalId,
        GoalMemory,
        GoalSpec,
        GoalStatus,
        StopReason,
        StopRules,
        VerifyCommand,
        VerifyResult,
        transition,
    )
    from goals.payloads import (
        GOAL_PAYLOADS,
        GoalBlockedReported,
        GoalChanged,
        GoalClaimed,
        GoalCounted,
        GoalEdited,
        GoalFingerprinted,
        GoalProgressNoted,
        GoalVerified,
    )
    from goals.policy import (
        Claim,
        ContinuationFate,
        Decision,
        DecisionKind,
        Interval,
        PolicyInput,
        budget_spent,
        decide,
        guard_limits,
    )
    from goals.sandbox_spec import SandboxSpec
    from goals.store import (
        GOAL_BLOCKED,
        GOAL_CHANGED,
        GOAL_CLAIM,
        GOAL_COUNTED,
        GOAL_EDITED,
        GOAL_FINGERPRINT,
        GOAL_PROGRESS,
        GOAL_VERIFIED,
        MIGRATIONS,
        goal_by_key,
        goal_counts,
        goal_from_row,
        latest_goal_of_session,
        list_goals,
        live_goal_of_chain,
        live_goal_of_session,
        live_goal_sandboxes_with_secrets,
        live_goals,
        load_goal,
        pending_key,
        schedule_of,
    )
    from goals.tools import (
        GOAL_TOOL_NAMES,
        GoalBlocked,
        GoalComplete,
        GoalProgress,
        approver_for_session,
        goal_policy,
        goal_tools,
        policy_for_session,
        tools_for_goal_sessions,
    )
    from goals.verify import CommandRunner, progress_digest, run_all, run_command, sandboxed_runner
    from goals.workdir_fingerprint import fingerprint

#: Where each name lives, imported on first use: a narrow import (``goals.model``, ``goals.why``)
#: loads its module, not the engine.
_HOMES: dict[str, str] = {
    "Budgets": "goals.model",
    "Claim": "goals.policy",
    "CommandRunner": "goals.verify",
    "ContinuationFate": "goals.policy",
    "Decision": "goals.policy",
    "DecisionKind": "goals.policy",
    "FingerprintLimits": "goals.fingerprint_limits",
    "GOAL_BLOCKED": "goals.store",
    "GOAL_CHANGED": "goals.store",
    "GOAL_CLAIM": "goals.store",
    "GOAL_COUNTED": "goals.store",
    "GOAL_EDITED": "goals.store",
    "GOAL_FINGERPRINT": "goals.store",
    "GOAL_PAYLOADS": "goals.payloads",
    "GOAL_PROGRESS": "goals.store",
    "GOAL_TOOL_NAMES": "goals.tools",
    "GOAL_VERIFIED": "goals.store",
    "Goal": "goals.model",
    "GoalBlocked": "goals.tools",
    "GoalBlockedReported": "goals.payloads",
    "GoalChanged": "goals.payloads",
    "GoalClaimed": "goals.payloads",
    "GoalComplete": "goals.tools",
    "GoalConflict": "goals.errors",
    "GoalCounted": "goals.payloads",
    "GoalEdited": "goals.payloads",
    "GoalEngine": "goals.engine",
    "GoalError": "goals.errors",
    "GoalFingerprinted": "goals.payloads",
    "GoalId": "goals.model",
    "GoalMemory": "goals.model",
    "GoalNotFound": "goals.errors",
    "GoalProgress": "goals.tools",
    "GoalProgressNoted": "goals.payloads",
    "GoalSpec": "goals.model",
    "GoalStatus": "goals.model",
    "GoalVerified": "goals.payloads",
    "Interval": "goals.policy",
    "InvalidGoal": "goals.errors",
    "InvalidGoalTransition": "goals.errors",
    "MIGRATIONS": "goals.store",
    "PolicyInput": "goals.policy",
    "SandboxSpec": "goals.sandbox_spec",
    "StaleDecision": "goals.errors",
    "StopReason": "goals.model",
    "StopRules": "goals.model",
    "VerifyCommand": "goals.model",
    "VerifyResult": "goals.model",
    "budget_spent": "goals.policy",
    "CLAIMS": "goals.locks",
    "check_nesting": "goals.locks",
    "claim_workdir": "goals.locks",
    "decide": "goals.policy",
    "fingerprint": "goals.workdir_fingerprint",
    "goal_by_key": "goals.store",
    "goal_counts": "goals.store",
    "goal_from_row": "goals.store",
    "goal_policy": "goals.tools",
    "goal_tools": "goals.tools",
    "guard_limits": "goals.policy",
    "interval_facts": "goals.facts",
    "latest_goal_of_session": "goals.store",
    "list_goals": "goals.store",
    "live_goal_of_chain": "goals.store",
    "live_goal_of_session": "goals.store",
    "live_goal_sandboxes_with_secrets": "goals.store",
    "live_goals": "goals.store",
    "load_goal": "goals.store",
    "pending_key": "goals.store",
    "policy_for_session": "goals.tools",
    "progress_digest": "goals.verify",
    "quote": "goals.continuation",
    "render": "goals.continuation",
    "run_all": "goals.verify",
    "run_command": "goals.verify",
    "sandboxed_runner": "goals.verify",
    "schedule_of": "goals.store",
    "size_text": "goals.fingerprint_limits",
    "stable_part": "goals.continuation",
    "tools_for_goal_sessions": "goals.tools",
    "approver_for_session": "goals.tools",
    "transition": "goals.model",
}

if not TYPE_CHECKING:  # (mypy reads the imports above; a module ``__getattr__`` would make every name Any)
    from agent.lazy import lazy_exports

    __getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())


__all__ = [
    "CLAIMS",
    "GOAL_BLOCKED",
    "GOAL_CHANGED",
    "GOAL_CLAIM",
    "GOAL_COUNTED",
    "GOAL_EDITED",
    "GOAL_FINGERPRINT",
    "GOAL_PAYLOADS",
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
    "FingerprintLimits",
    "Goal",
    "GoalBlocked",
    "GoalBlockedReported",
    "GoalChanged",
    "GoalClaimed",
    "GoalComplete",
    "GoalConflict",
    "GoalCounted",
    "GoalEdited",
    "GoalEngine",
    "GoalError",
    "GoalFingerprinted",
    "GoalId",
    "GoalMemory",
    "GoalNotFound",
    "GoalProgress",
    "GoalProgressNoted",
    "GoalSpec",
    "GoalStatus",
    "GoalVerified",
    "Interval",
    "InvalidGoal",
    "InvalidGoalTransition",
    "PolicyInput",
    "SandboxSpec",
    "StaleDecision",
    "StopReason",
    "StopRules",
    "VerifyCommand",
    "VerifyResult",
    "approver_for_session",
    "budget_spent",
    "check_nesting",
    "claim_workdir",
    "decide",
    "fingerprint",
    "goal_by_key",
    "goal_counts",
    "goal_from_row",
    "goal_policy",
    "goal_tools",
    "guard_limits",
    "interval_facts",
    "latest_goal_of_session",
    "list_goals",
    "live_goal_of_chain",
    "live_goal_of_session",
    "live_goal_sandboxes_with_secrets",
    "live_goals",
    "load_goal",
    "pending_key",
    "policy_for_session",
    "progress_digest",
    "quote",
    "render",
    "run_all",
    "run_command",
    "sandboxed_runner",
    "schedule_of",
    "size_text",
    "stable_part",
    "tools_for_goal_sessions",
    "transition",
]
