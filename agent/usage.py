"""What the model calls used, summed for reporting (the daemon's metrics).

The runtime owns ``model_calls``; a reader elsewhere gets these sums instead of its own SQL. Sums
are grouped by spend guard (a goal's budget, shared by its sessions and their subagents), provider
and model, so a caller can label them by something the runtime does not know (the schedule that
started a goal) and still keep the label set bounded: the rows are one per guard and model, the
labels the caller derives are few. What retention pruned is no longer counted (see
:mod:`agent.retention`): these are sums over the calls still stored.

``usage_totals`` holds the counters: every call is added, once, in the transaction that settles or
charges it (:func:`add_ended_call`, or :func:`end_calls` with the ending update itself), by provider,
model and error class; retention never lowers them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.db import Conn, PgConn


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


@dataclass(frozen=True)
class UsageTotal:
    """Every model call this store ever settled or charged, on one model with one error class
    (``None``: no error): a counter, never lowered by retention."""

    provider: str
    model: str
    error_class: str | None
    calls: int
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cost: float


#: Adds one ended call to its totals row (both databases take ``ON CONFLICT ... DO UPDATE``).
_ADD = (
    "INSERT INTO usage_totals(provider, model, error_class, calls, input_tokens, output_tokens,"
    " cache_read_tokens, cache_write_tokens, cost) VALUES (?,?,?,1,?,?,?,?,?)"
    " ON CONFLICT (provider, model, error_class) DO UPDATE SET calls = usage_totals.calls + 1,"
    " input_tokens = usage_totals.input_tokens + excluded.input_tokens,"
    " output_tokens = usage_totals.output_tokens + excluded.output_tokens,"
    " cache_read_tokens = usage_totals.cache_read_tokens + excluded.cache_read_tokens,"
    " cache_write_tokens = usage_totals.cache_write_tokens + excluded.cache_write_tokens,"
    " cost = usage_totals.cost + excluded.cost"
)


def add_ended_call(tx: Any, row: Mapping[str, Any]) -> None:
    """Count one call that just ended (settled or charged in full) into the totals, in the
    transaction that ended it. ``row`` is the call's row as that write returned it."""
    tx.write(
        _ADD,
        (
            row["provider"],
            row["model"],
            row["error_class"] or "",
            int(row["input_tokens"]),
            int(row["output_tokens"]),
            int(row["cache_read_tokens"]),
            int(row["cache_write_tokens"]),
            float(row["cost"]),
        ),
    )


#: The columns :func:`add_ended_call` reads, for the ending write's ``RETURNING``.
ENDED_COLUMNS = "provider, model, error_class, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost"
#: PostgreSQL: the calls an update ended (``{update}``), counted in the same statement.
_END_AND_ADD = (
    f"WITH ended AS ({{update}} RETURNING {ENDED_COLUMNS}) INSERT INTO usage_totals(provider, model,"
    " error_class, calls, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, cost)"
    " SELECT provider, model, COALESCE(error_class, ''), 1, input_tokens, output_tokens, cache_read_tokens,"
    " cache_write_tokens, cost FROM ended" + _ADD[_ADD.index(" ON CONFLICT") :]
)


def end_calls(tx: Any, update: str, params: tuple[Any, ...]) -> None:
    """Run ``update`` (of ``model_calls``, ending the calls it matches, no ``RETURNING``) and count
    each call it ended (:func:`add_ended_call`). On PostgreSQL one statement whose result nobody
    reads, sent with the next (:meth:`agent.tx.Tx.write`); SQLite has no update in a ``WITH``, so
    there the update returns its rows and each is counted."""
    if isinstance(tx.conn, PgConn):
        tx.write(_END_AND_ADD.format(update=update), params)
        return
    for row in tx.all(f"{update} RETURNING {ENDED_COLUMNS}", params):
        add_ended_call(tx, row)


def usage_totals(conn: Conn) -> list[UsageTotal]:
    """The totals of every call ever ended (in a read)."""
    rows = conn.execute(
        "SELECT provider, model, error_class, calls, input_tokens, output_tokens, cache_read_tokens,"
        " cache_write_tokens, cost FROM usage_totals"
    ).fetchall()
    return [
        UsageTotal(
            str(r[0]), str(r[1]), str(r[2]) or None, int(r[3]), int(r[4]), int(r[5]), int(r[6]), int(r[7]), float(r[8])
        )
        for r in rows
    ]
