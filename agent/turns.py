"""Turns: the end-reason lifecycle and the transaction functions that open, close and repair them.

A turn opens in the same transaction that admits its waking batch, and closes in one that also
decides whether the session goes idle. Crash repair closes a turn left open by a dead process as
``interrupted``, gives every tool call without a result the "outcome unknown" result, and charges
every reservation left open in full; queued messages stay queued for the next turn.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from agent.errors import StaleOpening
from agent.events import EventType
from agent.ids import TurnId
from agent.inbox import Admitted, admit, admitted_of, queued, settle_idle, wakes
from agent.messages import ToolUseBlock
from agent.payloads import AgentStatus, AssistantMessage, EndReason, ToolResult, parse_payload
from agent.tx import SessionState, Tx
from agent.usage import ENDED_COLUMNS, add_ended_call

OUTCOME_UNKNOWN = "interrupted: outcome unknown — verify before retrying"
#: Text given to tool calls left without a result when a turn is cancelled or runs out of time.
CANCELLED_TOOL_TEXT = "cancelled: the turn was interrupted before this call finished"


class TurnEnd(BaseModel):
    """How a turn ended, as recorded in ``turn/end``."""

    model_config = ConfigDict(frozen=True)

    reason: EndReason
    error: str | None = None
    error_kind: str | None = None
    model_finish: str | None = None
    steps: int = 0
    #: Who asked for the interrupt that ended the turn, when a person did: the caller's ``uid`` and
    #: ``pid`` on the control socket, or ``web`` (the status page token's name); kept in the event.
    caller: Mapping[str, int | str] | None = None


class OpenedTurn(BaseModel):
    """A turn the driver opened, with its admitted batch. A turn the driver planned
    (:func:`plan_opening`) gets its numbers and the admitted messages' ids when its opening runs
    (:func:`open_planned`), in the transaction that opens it, before anything else of the turn."""

    turn_id: TurnId
    start_seq: int
    admitted: list[Admitted]


def take_or_idle(tx: Tx, session_id: str, turn_id: TurnId | None = None) -> OpenedTurn | None:
    """Open a turn (``turn_id``, else a new id) admitting every queued message if one of them wakes;
    else commit idle."""
    st = tx.state(session_id)
    if st.open_turn is not None:
        raise RuntimeError(f"session {session_id} already has an open turn {st.open_turn}")
    rows = queued(tx, session_id)  # one read: whether one wakes, and what the turn admits
    if not wakes(rows):
        settle_idle(tx, session_id, none_waking=True)
        return None
    turn_id = turn_id or TurnId.new()
    tx.set_status(session_id, AgentStatus.RUNNING)
    data: dict[str, Any] = {"turnId": turn_id}
    if tx.store.kind == "postgresql":
        data["node"] = tx.store.node_id  # which node ran it (one node at a time: daemon.cluster)
    start = tx.emit(session_id, EventType.TURN_START, data)
    tx.write(
        "INSERT INTO turns(id, session_id, start_seq, started_at) VALUES (?,?,?,?)",
        (turn_id, session_id, start.seq, tx.now),
    )
    st.open_turn = turn_id
    admitted = admit(tx, session_id, turn_id, waking=True, rows=rows)
    return OpenedTurn(turn_id=turn_id, start_seq=start.seq, admitted=admitted)


def plan_opening(state: SessionState | None, then: Sequence[Mapping[str, Any]] = ()) -> OpenedTurn | None:
    """The turn :func:`take_or_idle` would open on ``state`` (the session's as this node last
    committed it: :meth:`agent.store.Store.known_state`) once the messages ``then`` are queued (rows
    as :func:`agent.inbox.queued` reads them, their ids still to be given: a write handed to the
    driver queues them first, :meth:`agent.driver.Agent.open_after`); ``None`` when ``state`` does not
    tell (no state or queue known, a turn open, nothing waking).

    The driver builds the turn's first request on the plan and opens it in its next write, the one
    that reserves the first call (:func:`open_planned`): one round trip less per turn, and the
    admission is still durable before any model sees it."""
    if state is None or state.queue is None or state.open_turn is not None:
        return None
    rows = [*state.queue, *then]
    if not wakes(rows):
        return None
    return OpenedTurn(turn_id=TurnId.new(), start_seq=0, admitted=[admitted_of(row, 0) for row in rows])


def open_planned(tx: Tx, session_id: str, plan: OpenedTurn) -> None:
    """Open the turn :func:`plan_opening` planned: the messages it admits must be the plan's (the
    same deliveries, sources and contents, in the same order: what the request built on the plan
    holds), and the plan then gets the opening's numbers and ids. Anything else (a message queued or
    cancelled since, another node's write) raises :class:`~agent.errors.StaleOpening`, which rolls
    back the whole transaction: the turn is not open, and nothing the driver decided on the plan
    (the call's reservation) is written."""
    opened = take_or_idle(tx, session_id, turn_id=plan.turn_id)
    if opened is None or [_seen(a) for a in opened.admitted] != [_seen(a) for a in plan.admitted]:
        raise StaleOpening(f"session {session_id} changed since its turn {plan.turn_id} was planned")
    plan.start_seq, plan.admitted = opened.start_seq, opened.admitted


def _seen(a: Admitted) -> tuple[Any, ...]:
    """What of an admitted message a request holds."""
    return a.delivery, a.source, a.content


def end_turn(tx: Tx, session_id: str, turn_id: str, end: TurnEnd) -> bool:
    """Close the turn and commit idle unless a waking message is queued; returns "more work"."""
    st = tx.state(session_id)
    if st.open_turn != turn_id:
        raise RuntimeError(f"turn {turn_id} is not the open turn of session {session_id}")
    data: dict[str, Any] = {"turnId": turn_id, "reason": end.reason.value, "steps": end.steps}
    if end.error is not None:
        data["error"] = end.error
    if end.error_kind is not None:
        data["errorKind"] = end.error_kind
    if end.model_finish is not None:
        data["modelFinish"] = end.model_finish
    if end.caller:
        data.update({k: v for k, v in end.caller.items() if k not in data})
    event = tx.emit(session_id, EventType.TURN_END, data)
    tx.write(
        "UPDATE turns SET end_seq=?, end_reason=?, error=?, steps=?, ended_at=? WHERE id=?",
        (event.seq, end.reason.value, end.error, end.steps, tx.now, turn_id),
    )
    st.open_turn = None
    return not settle_idle(tx, session_id)


def close_open_tool_calls(tx: Tx, session_id: str, turn_id: str, start_seq: int, text: str) -> int:
    """Give every tool call of the turn that has no result the result ``text``; returns how many."""
    rows = tx.all(
        "SELECT type, data FROM events WHERE session_id=? AND seq>=? AND type IN (?, ?) ORDER BY seq",
        (session_id, start_seq, EventType.ASSISTANT_MESSAGE.value, EventType.TOOL_RESULT.value),
    )
    wanted: dict[str, str] = {}
    for row in rows:
        match parse_payload(row["type"], json.loads(row["data"])):
            case AssistantMessage() as answer:
                wanted.update((b.id, b.name) for b in answer.content if isinstance(b, ToolUseBlock))
            case ToolResult() as result:
                wanted.pop(result.tool_use_id, None)
            case _:
                pass
    for use_id, name in wanted.items():
        tx.emit(
            session_id,
            EventType.TOOL_RESULT,
            {"turnId": turn_id, "toolUseId": use_id, "name": name, "content": text, "isError": True},
        )
    return len(wanted)


def charge_open_reservations(
    tx: Tx, session_id: str, turn_id: str | None = None, error_class: str = "interrupted"
) -> list[str]:
    """Charge every reservation still open for the session in full; returns the call ids.

    A ``model/charged`` event records what was charged, so that whoever sums a session's spend
    from its events (the goal engine) agrees with the spend guard. ``error_class`` says why the
    call's outcome is unknown (``interrupted``; ``deadline`` for a call cut at the end of its time).
    """
    rows = tx.all(
        "UPDATE model_calls SET state='charged_in_full', cost=reserved_cost, ended_at=?,"
        " error_class=COALESCE(error_class, ?) WHERE session_id=? AND state='reserved'"
        f" RETURNING id, reserved_tokens, reserved_cost, {ENDED_COLUMNS}",
        (tx.now, error_class, session_id),
    )
    for row in rows:
        add_ended_call(tx, row)
    if rows:
        tx.emit(
            session_id,
            EventType.MODEL_CHARGED,
            {
                "turnId": turn_id,
                "callIds": [r["id"] for r in rows],
                "tokens": sum(int(r["reserved_tokens"]) for r in rows),
                "cost": sum(float(r["reserved_cost"]) for r in rows),
                "reason": "outcome unknown: the reservation is charged in full",
            },
        )
    return [str(r["id"]) for r in rows]


def repair(tx: Tx, sessions: Sequence[str] | None = None) -> list[str]:
    """Repair every session a dead process left mid-turn; returns the sessions that still have work.

    Runs once when the runtime opens the store, before any driver starts; in a cluster, for the
    ``sessions`` a node has just taken over (a session and its subagents) before it drives them.
    """
    scope, params = "", tuple(sessions or ())
    if sessions is not None:
        if not sessions:
            return []
        scope = f" AND session_id IN ({','.join('?' * len(sessions))})"
    # What needs repair and what has work, read together (one round trip on PostgreSQL): the repairs
    # change no inbox row, and a session's reservations are charged by whichever repair comes first.
    open_turns, reserved, queued = tx.reads(
        ("SELECT id, session_id, start_seq FROM turns WHERE end_reason IS NULL" + scope, params),
        ("SELECT DISTINCT session_id FROM model_calls WHERE state='reserved'" + scope, params),
        (
            "SELECT DISTINCT session_id FROM inbox WHERE fate='queued' AND delivery IN ('followup', 'steer')" + scope,
            params,
        ),
    )
    touched: list[str] = []
    for row in open_turns:
        session_id = row["session_id"]
        closed = close_open_tool_calls(tx, session_id, row["id"], row["start_seq"], OUTCOME_UNKNOWN)
        charged = charge_open_reservations(tx, session_id, row["id"])
        end_turn(
            tx,
            session_id,
            row["id"],
            TurnEnd(reason=EndReason.INTERRUPTED, error="the process ended during the turn"),
        )
        touched.append(session_id)
        del closed, charged
    # Reservations left open outside a turn (never expected) are charged too.
    for row in reserved:
        if row["session_id"] not in touched:  # a repaired turn's session had its reservations charged
            charge_open_reservations(tx, row["session_id"], None)
    with_work = [str(r["session_id"]) for r in queued]
    # A session whose status says running with no turn and no waking message goes idle.
    for session_id in touched:
        if tx.state(session_id).status != AgentStatus.IDLE and session_id not in with_work:
            settle_idle(tx, session_id)
    return with_work
