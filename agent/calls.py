"""The ``model_calls`` table: one row per model attempt, written before the attempt is made.

A failed attempt is settled to the usage it reported. One whose answer had started (a stream
dropped, timed out or malformed after a successful status) but that reported no usage — an
OpenAI-compatible stream reports it only in its last chunk — is settled to its prompt's estimate
instead (:func:`failed_usage`): the provider has likely billed the prompt, and charging nothing
would let a flaky stream spend a budget unseen. The estimate is the prompt's likely size (the
model's running ratio of reported calls), never more than the reservation's prompt part, so a
failure is charged what the server could have processed, not an upper bound; the row's error and
the ``model/error`` event say it is an estimate. An attempt that failed before any answer (a
refused connection, an error status, an HTTP 200 whose stream never began) is charged nothing.
"""

from __future__ import annotations

from typing import Any

from agent.errors import AgentError
from agent.events import EventType
from agent.ids import TypedId
from agent.messages import Block
from agent.models.base import ModelError
from agent.spend import Usage
from agent.tx import Tx
from agent.usage import end_calls


class CallId(TypedId):
    """Identity of one model attempt (a ``model_calls`` row)."""

    prefix = "mc_"


class OutOfTime(AgentError):
    """Control flow: the spend guard's time ran out during a model call, which was cancelled."""


def reserve_call(
    tx: Tx,
    *,
    call_id: str,
    session_id: str,
    turn_id: str,
    guard_id: str | None,
    provider: str,
    model: str,
    attempt: int,
    tokens: int,
    cost: float,
) -> None:
    """Make a reservation durable before the model is called."""
    tx.write(
        "INSERT INTO model_calls(id, session_id, turn_id, guard_id, provider, model, attempt, state,"
        " reserved_tokens, reserved_cost, started_at) VALUES (?,?,?,?,?,?,?,'reserved',?,?,?)",
        (call_id, session_id, turn_id, guard_id, provider, model, attempt, tokens, cost, tx.now),
    )


def settle_call(
    tx: Tx, call_id: str, usage: Usage, cost: float, *, error_class: str | None = None, error: str | None = None
) -> None:
    """Settle a reservation to the reported usage (zero if the attempt reported none)."""
    end_calls(
        tx,
        "UPDATE model_calls SET state='settled', input_tokens=?, output_tokens=?, cache_read_tokens=?,"
        " cache_write_tokens=?, cost=?, error_class=?, error=?, ended_at=? WHERE id=? AND state='reserved'",
        (
            usage.input_tokens,
            usage.output_tokens,
            usage.cache_read_tokens,
            usage.cache_write_tokens,
            cost,
            error_class,
            error,
            tx.now,
            call_id,
        ),
    )  # counted only if it was still reserved


#: Appended to the row's error when its usage is the prompt's estimate (see :func:`failed_usage`).
ESTIMATED_NOTE = " [no usage reported after the answer started: charged the prompt's estimate]"


def failed_usage(exc: ModelError, prompt_bound: int, prompt_estimate: int | None = None) -> tuple[Usage, bool]:
    """What a failed attempt is charged, and whether it is an estimate (see the module docstring).

    ``prompt_bound`` is the reservation's prompt part: the upper bound of the prompt's tokens;
    ``prompt_estimate`` the prompt's likely size (the model's calibrated running ratio), charged
    instead when given (never above the bound).
    """
    if exc.usage is not None:
        return exc.usage, False
    if exc.response_started:
        charged = prompt_bound if prompt_estimate is None else min(prompt_estimate, prompt_bound)
        return Usage(input_tokens=charged), True
    return Usage(), False


def commit_assistant(
    tx: Tx,
    *,
    session_id: str,
    turn_id: str,
    call_id: str,
    model: str,
    content: list[Block],
    finish: str,
    usage: Usage,
    cost: float,
) -> int:
    """Settle the call and append the assistant message to the session, in one transaction."""
    settle_call(tx, call_id, usage, cost)
    data: dict[str, Any] = {
        "turnId": turn_id,
        "content": [b.model_dump(mode="json") for b in content],
        "finishReason": finish,
        "model": model,
        "usage": usage.model_dump(),
        "cost": cost,
    }
    return tx.emit(session_id, EventType.ASSISTANT_MESSAGE, data).seq


def usage_of_guard(tx: Tx, guard_id: str) -> tuple[int, float]:
    """Tokens and cost charged to a guard so far (settled usage; reservations charged in full)."""
    return usage_of_row(tx.one(*guard_usage_query(guard_id)))


def guard_usage_query(guard_id: str) -> tuple[str, tuple[str]]:
    """The read of :func:`usage_of_guard` and its parameters, to send with other reads
    (:meth:`agent.tx.Tx.reads`); :func:`usage_of_row` reads its row."""
    sql = (
        "SELECT COALESCE(SUM(CASE state WHEN 'charged_in_full' THEN reserved_tokens"
        " WHEN 'settled' THEN input_tokens + output_tokens + cache_read_tokens + cache_write_tokens"
        " ELSE 0 END), 0) AS tokens, COALESCE(SUM(CASE state WHEN 'reserved' THEN 0 ELSE cost END), 0) AS cost"
        " FROM model_calls WHERE guard_id=?"
    )
    return sql, (guard_id,)


def usage_of_row(row: Any) -> tuple[int, float]:
    """Tokens and cost from the row of :func:`guard_usage_query` (an aggregate: always one row)."""
    assert row is not None
    return int(row["tokens"]), float(row["cost"])
