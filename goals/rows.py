"""A goal as a ``goals`` row and back: the column list, the JSON of its nested fields.

One place maps the :class:`~goals.model.Goal` model to its columns, so a new field is added here
and in a migration (:mod:`goals.schema`) and nowhere else; the queries and the writes build goals
only through :func:`goal_from_row` and store them only through :func:`row_values`.
"""

from __future__ import annotations

import json
from typing import Any

from agent import Tx
from agent.db import Conn
from goals.model import Budgets, Goal, GoalMemory, SandboxSpec, StopRules, VerifyCommand

#: Every column of ``goals``, in the order the inserts name them.
COLUMNS = (
    "id", "key", "idempotency_key", "title", "objective", "status", "status_reason", "session_id", "guard_id",
    "workdir", "model", "tools", "budgets", "verify", "rules", "rounds", "tokens", "cost", "refused_claims",
    "stall_streak", "error_streak", "blocked_streak", "wall_used", "active_since", "continuation_id",
    "continuation_round", "evaluated_seq", "not_before", "memory", "result_summary", "evidence", "created_at",
    "updated_at", "revision", "progress", "sandbox", "keep_workdir", "node_label", "infra_streak", "infra_rounds",
    "interrupted_tokens",
)  # fmt: skip


def goal_from_row(row: Any | dict[str, Any]) -> Goal:
    """Build a :class:`Goal` from a ``goals`` row."""
    d = dict(row)
    d["budgets"] = Budgets.model_validate_json(d["budgets"])
    d["verify"] = [VerifyCommand.model_validate(v) for v in json.loads(d["verify"])]
    d["rules"] = StopRules.model_validate_json(d["rules"])
    d["memory"] = GoalMemory.model_validate_json(d["memory"])
    d["tools"] = json.loads(d["tools"]) if d["tools"] else None
    d["progress"] = VerifyCommand.model_validate_json(d["progress"]) if d.get("progress") else None
    d["sandbox"] = SandboxSpec.model_validate_json(d.get("sandbox") or "{}")
    d["keep_workdir"] = bool(d.get("keep_workdir") or 0)
    return Goal.model_validate(d)


def row_values(goal: Goal) -> dict[str, Any]:
    """The column values of ``goal``, nested fields as JSON."""
    return {
        "id": goal.id,
        "key": goal.key,
        "idempotency_key": goal.idempotency_key,
        "title": goal.title,
        "objective": goal.objective,
        "status": goal.status.value,
        "status_reason": goal.status_reason,
        "session_id": goal.session_id,
        "guard_id": goal.guard_id,
        "workdir": goal.workdir,
        "model": goal.model,
        "tools": json.dumps(goal.tools) if goal.tools is not None else None,
        "budgets": goal.budgets.model_dump_json(),
        "verify": json.dumps([v.model_dump() for v in goal.verify]),
        "rules": goal.rules.model_dump_json(),
        "rounds": goal.rounds,
        "tokens": goal.tokens,
        "cost": goal.cost,
        "refused_claims": goal.refused_claims,
        "stall_streak": goal.stall_streak,
        "error_streak": goal.error_streak,
        "blocked_streak": goal.blocked_streak,
        "wall_used": goal.wall_used,
        "active_since": goal.active_since.isoformat() if goal.active_since else None,
        "continuation_id": goal.continuation_id,
        "continuation_round": goal.continuation_round,
        "evaluated_seq": goal.evaluated_seq,
        "not_before": goal.not_before.isoformat() if goal.not_before else None,
        "memory": goal.memory.model_dump_json(exclude_defaults=True),
        "result_summary": goal.result_summary,
        "evidence": goal.evidence,
        "created_at": goal.created_at.isoformat(),
        "updated_at": goal.updated_at.isoformat(),
        "revision": goal.revision,
        "progress": goal.progress.model_dump_json() if goal.progress is not None else None,
        "sandbox": goal.sandbox.model_dump_json(exclude_defaults=True),
        "keep_workdir": int(goal.keep_workdir),
        "node_label": goal.node_label,
        "infra_streak": goal.infra_streak,
        "infra_rounds": goal.infra_rounds,
        "interrupted_tokens": goal.interrupted_tokens,
    }


def conn_of(tx_or_conn: Tx | Conn) -> Conn:
    """The connection of a transaction, or the connection itself (the queries take either)."""
    return tx_or_conn.conn if isinstance(tx_or_conn, Tx) else tx_or_conn


__all__ = ["COLUMNS", "conn_of", "goal_from_row", "row_values"]
