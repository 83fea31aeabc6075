"""What the model calls used, summed for reporting (the daemon's metrics).

The runtime owns ``model_calls``; a reader elsewhere gets these sums instead of its own SQL. Sums
are grouped by spend guard (a goal's budget, shared by its sessions and their subagents), provider
and model, so a caller can label them by something the runtime does not know (the schedule that
started a goal) and still keep the label set bounded: the rows are one per guard and model, the
labels the caller derives are few. What retention pruned is no longer counted (see
:mod:`agent.retention`): these are sums over the calls still stored.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.db import Conn


@dataclass(frozen=True)
class GuardUsage:
    """The stored model calls of one guard (``None``: calls of sessions without one) on one model."""

    guard_id: str | None
    provider: str
    model: str
    calls: int
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cost: float


@dataclass(frozen=True)
class CallCount:
    """Stored model calls of one provider that ended with one error class (``None``: no error)."""

    provider: str
    error_class: str | None
    calls: int


def usage_by_guard(conn: Conn) -> list[GuardUsage]:
    """Tokens and cost of the stored model calls, by guard, provider and model (in a read)."""
    rows = conn.execute(
        "SELECT guard_id, provider, model, COUNT(*), SUM(input_tokens), SUM(output_tokens),"
        " SUM(cache_read_tokens), SUM(cache_write_tokens), SUM(cost)"
        " FROM model_calls GROUP BY guard_id, provider, model"
    ).fetchall()
    return [
        GuardUsage(r[0], str(r[1]), str(r[2]), int(r[3]), int(r[4]), int(r[5]), int(r[6]), int(r[7]), float(r[8]))
        for r in rows
    ]


def call_counts(conn: Conn) -> list[CallCount]:
    """Stored model calls by provider and error class (in a read)."""
    rows = conn.execute(
        "SELECT provider, error_class, COUNT(*) FROM model_calls GROUP BY provider, error_class"
    ).fetchall()
    return [CallCount(str(r[0]), r[1], int(r[2])) for r in rows]
