"""Subagents: the ``delegate`` tool runs a task in an isolated child session and owns its whole life.

A ``delegate(task, tools?)`` call creates a fresh child session (``parent_session_id``, depth one
more than the parent's), queues the task there as its only message, waits for the child's
whole-agent idle and returns the child's final response (or its error) as the tool result. That
is an owned interval (docs/architecture.md#invariants: 7): from the event that records the task as queued to
the first idle status event after it. Only the call writes to the child, so the interval is the
child's whole life and its result belongs to the call; the result is still read from the interval
(the last committed assistant text, the last turn's end), never from the task message.

What the child gets, never more than the parent has:

* the parent's model, work directory, driver settings and spend guard (a budget binds the parent
  and its children together);
* the parent's own tool instances — so whatever sandbox they carry — and its redactor, under the
  parent's tool policy, narrowed to ``tools`` when given, without the tools bound to their own
  session (a tool class may say so with ``subagent_inherits = False``; the goal tools do), and without
  ``delegate`` at the depth limit. The child's session config copies the parent's (its policy
  among it) except what makes the parent a goal's session, and records the tool names, so that
  even a child loaded later by the resolver gets no more;
* no concurrency slot of its own: its turns run while the parent's turn, which holds a slot, waits
  in this call, so parents can never deadlock waiting for slots their children need.

Spend: the goal engine counts a goal's tokens and cost from its session's events, and the child's
calls are its own session's events. When the call ends, one transaction records the child's whole
spend in the parent session as a ``model/charged`` event (``subagentSessionId``) and marks the
child settled, so the goal's counters agree with the shared guard.

Cancellation: when the call is cancelled (the parent's turn interrupted, the tool's timeout, a
shutdown that ran out of grace), the child's queued task is discarded, its running turn is
interrupted (its own children with it), and its spend is charged to the parent before the cancel
goes on. After a crash no call is alive to own a child: :func:`settle_orphans` (run when the
runtime opens, after crash repair) cancels every unsettled child's queued input and charges its
spend to its parent, so an orphan never runs on its own.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from loguru import logger
from pydantic import BaseModel, Field

from agent.driver import Agent
from agent.events import EventType
from agent.inbox import cancel_all, enqueue
from agent.interval import watch_interval
from agent.messages import Content, Source, SourceKind, parse_content
from agent.payloads import (
    AssistantMessage,
    ContextCompacted,
    EndReason,
    ModelCharged,
    ModelFailed,
    TurnEnded,
    parse_payload,
)
from agent.store import Store
from agent.tools.base import Tool, ToolContext, ToolOutput, ToolRegistry
from agent.tx import Tx

if TYPE_CHECKING:
    from agent.runtime import Runtime

#: The deepest a child may be: sessions at a lower depth may delegate.
DEFAULT_MAX_DEPTH = 2
#: Why an orphaned child's queued input is cancelled when the runtime opens.
ORPHANED = "orphaned: the delegating call ended with the process"
#: Why a child's queued input is cancelled when the delegating call is cancelled.
ABANDONED = "the delegating call was cancelled"
#: How long cleaning up after a cancelled call may take.
ABANDON_TIMEOUT = 30.0
#: Event kinds that carry spend, as the goal engine counts them.
_SPEND_TYPES = (
    EventType.ASSISTANT_MESSAGE,
    EventType.MODEL_ERROR,
    EventType.MODEL_CHARGED,
    EventType.CONTEXT_COMPACTED,
)


class DelegateArgs(BaseModel):
    """Arguments of ``delegate``."""

    task: str = Field(
        min_length=1,
        max_length=100_000,
        description="The task, self-contained: the subagent sees nothing of this conversation.",
    )
    tools: list[str] | None = Field(
        default=None,
        description="Names of your tools the subagent may use; omit to give it all of them.",
    )


@dataclass(frozen=True)
class ChildRun:
    """What the owned interval of a child showed, with the spend charged to its parent.

    ``final_response`` is the text of the last committed assistant message with text (interrupted
    partial text excluded); ``last_end`` the interval's last ``turn/end``, a run-level observation
    (see :class:`agent.interval.RunFacts`).
    """

    session_id: str
    final_response: str | None
    last_end: TurnEnded | None
    tokens: int
    cost: float


class Delegate(Tool[DelegateArgs]):
    """Run a task in a subagent (an isolated child session) and return its final response."""

    name = "delegate"
    description = (
        "Hand a self-contained task to a subagent: a fresh agent in the same work directory with your "
        "tools (or the ones you name) and a shared budget. It runs the task to the end and its final "
        "answer comes back as this tool's result. Give it everything it needs in the task text."
    )
    Args = DelegateArgs
    #: Running it again starts a second child that redoes the work.
    repeat_safe = False

    def __init__(self, *, max_depth: int = DEFAULT_MAX_DEPTH, timeout: float = 3600.0) -> None:
        if max_depth < 1:
            raise ValueError("max_depth must be at least 1")
        self.max_depth = max_depth
        self.timeout = timeout

    async def run(self, args: DelegateArgs, ctx: ToolContext) -> ToolOutput:
        rt: Runtime | None = ctx.extra.get("runtime")
        parent = rt.live_agents.get(ctx.session_id) if rt is not None else None
        if rt is None or parent is None:
            return ToolOutput("delegate is unavailable here: the session has no runtime to start a subagent", True)
        row = await rt.session(ctx.session_id)
        if row.depth >= self.max_depth:
            return ToolOutput(f"delegate refused: the subagent depth limit is {self.max_depth}", True)
        tools = child_tools(parent.tools, args.tools, row.depth + 1, self.max_depth)
        if isinstance(tools, str):
            return ToolOutput(tools, True)
        content = parse_content(args.task)
        # The parent's settings (driver settings, tool policy, ...) carry over; being a goal's session does not.
        config = {k: v for k, v in row.config.items() if k not in ("goal", "subagent")}
        config["subagent"] = {"tools": tools.names, "parentTurnId": ctx.turn_id, "parentToolUseId": ctx.call_id}
        child = await rt.create_child(ctx.session_id, tools=tools, config=config)
        try:
            run = await run_child(
                rt.store, child, content, ref=f"{ctx.session_id}/{ctx.call_id}", parent_turn_id=ctx.turn_id
            )
        except BaseException:
            # Cancelled (or failed) while the child works: it must not go on without its owner.
            await asyncio.shield(abandon(rt, child, ctx.turn_id))
            raise
        await rt.unload(child.session_id)
        return render(run)


def child_tools(parent: ToolRegistry, wanted: list[str] | None, depth: int, max_depth: int) -> ToolRegistry | str:
    """The child's tools: the parent's instances under the parent's policy, narrowed to ``wanted``;
    a problem as a string."""
    policy = parent.policy
    names = [n for n in parent.names if policy is None or policy.allows_tool(n)]
    if wanted is not None:
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            return f"delegate refused: you have no tool named {', '.join(unknown)}; yours are {', '.join(names)}"
        names = [n for n in names if n in set(wanted)]
    chosen: list[Tool[Any]] = []
    for name in names:
        tool = parent.get(name)
        if tool is None or not getattr(tool, "subagent_inherits", True):
            continue
        if isinstance(tool, Delegate) and depth >= min(max_depth, tool.max_depth):
            continue
        chosen.append(tool)
    # The same redaction: a secret the parent's tools may see (a goal's, in the shared sandbox)
    # must not reach the child's stored results in the clear.
    unavailable = {n: why for n, why in parent.unavailable.items() if wanted is None or n in wanted}
    return ToolRegistry(chosen, policy=policy, redactor=parent.redactor, unavailable=unavailable)


async def run_child(store: Store, child: Agent, content: Content, *, ref: str, parent_turn_id: str | None) -> ChildRun:
    """Queue the task in the child, watch its interval to idle, and charge its spend to the parent."""
    receipt = await store.transact(
        partial(enqueue, session_id=child.session_id, content=content, source=Source(kind=SourceKind.SUBAGENT, ref=ref))
    )
    run = await watch_interval(store, child.session_id, receipt.message_id, receipt.seq)
    tokens, cost = await store.transact(partial(settle_child, child_id=child.session_id, turn_id=parent_turn_id))
    return ChildRun(child.session_id, run.facts.final_response, run.facts.last_end, tokens, cost)


async def abandon(rt: Runtime, child: Agent, parent_turn_id: str | None) -> None:
    """The delegating call was cancelled: discard the child's queued input, end its running turn,
    charge its spend to the parent and unload it (bounded; a child that will not stop is left to
    crash repair and :func:`settle_orphans`)."""
    store = rt.store
    try:
        async with asyncio.timeout(ABANDON_TIMEOUT):
            # Nothing is queued after this (only the call writes to the child), and a turn the driver
            # committed just before it has its task by the time ``interrupt`` looks.
            await store.transact(partial(cancel_all, session_id=child.session_id, reason=ABANDONED))
            await child.interrupt(discard_queued=True)
            await store.transact(partial(settle_child, child_id=child.session_id, turn_id=parent_turn_id))
            await rt.unload(child.session_id, grace=0.0)
    except Exception:
        logger.exception("subagent {} could not be settled after its call ended", child.session_id)


def render(run: ChildRun) -> ToolOutput:
    """The tool result for a child's interval."""
    end = run.last_end
    reason = end.reason if end is not None else None
    answer = run.final_response
    if reason is EndReason.END_TURN:
        return ToolOutput(answer if answer is not None else "(the subagent finished without a text answer)")
    if reason in (EndReason.MAX_TOKENS, EndReason.MAX_STEPS):
        note = f"[the subagent stopped early: {reason}]"
        return ToolOutput(f"{answer}\n{note}" if answer is not None else note)
    if reason is None:
        text = "the subagent ran no turn"
    else:
        error = end.error if end is not None else None
        text = f"the subagent's run ended {reason}" + (f": {error}" if error else "")
    if answer is not None:
        text += f"\nits last answer was:\n{answer}"
    return ToolOutput(text, True)


def session_spend(tx: Tx, session_id: str) -> tuple[int, float]:
    """Tokens and cost a session's events record, counted as the goal engine counts them."""
    tokens, cost = 0, 0.0
    marks = ",".join("?" * len(_SPEND_TYPES))
    for row in tx.all(
        f"SELECT type, data FROM events WHERE session_id=? AND type IN ({marks})", (session_id, *_SPEND_TYPES)
    ):
        match parse_payload(row["type"], json.loads(row["data"])):
            case ModelCharged() as charged:
                tokens, cost = tokens + charged.tokens, cost + charged.cost
            case AssistantMessage() | ModelFailed() as call:
                tokens += call.usage.total if call.usage is not None else 0
                cost += call.cost
            case ContextCompacted() as compacted:
                # A compaction's summary call is charged like any other call.
                tokens += compacted.usage.total if compacted.usage is not None else 0
                cost += compacted.cost
            case _:
                pass
    return tokens, cost


def settle_child(tx: Tx, child_id: str, turn_id: str | None) -> tuple[int, float]:
    """Charge a child's whole spend to its parent session and mark the child settled (once)."""
    # The config is read and written whole, not with SQLite's json_set (PostgreSQL has none by that
    # name); the write runs in the same transaction as the read.
    row = tx.one("SELECT parent_session_id, config FROM sessions WHERE id=?", (child_id,))
    if row is None or row["parent_session_id"] is None:
        return 0, 0.0
    config = json.loads(row["config"] or "{}")
    subagent = config.get("subagent")
    if isinstance(subagent, dict) and subagent.get("settled"):
        return 0, 0.0
    tokens, cost = session_spend(tx, child_id)
    if tokens or cost:
        tx.emit(
            row["parent_session_id"],
            EventType.MODEL_CHARGED,
            {
                "turnId": turn_id,
                "callIds": [],
                "tokens": tokens,
                "cost": cost,
                "subagentSessionId": child_id,
                "reason": "the spend of a subagent",
            },
        )
    if subagent is None or isinstance(subagent, dict):
        config["subagent"] = {**(subagent or {}), "settled": True}
        tx.execute("UPDATE sessions SET config=? WHERE id=?", (json.dumps(config), child_id))
    return tokens, cost


def settle_orphans(tx: Tx, with_work: list[str], sessions: Sequence[str] | None = None) -> list[str]:
    """At open, after crash repair: settle every child whose delegating call died with the process.

    Its queued input is cancelled (it must not run with no one to read its result) and its spend
    charged to its parent, the deepest children first so that a grandchild's spend reaches the
    root. Returns ``with_work`` without the orphans.
    """
    scope, params = "", tuple(sessions or ())
    if sessions is not None:
        if not sessions:
            return with_work
        scope = f" AND id IN ({','.join('?' * len(sessions))})"  # a taken-over session's subagents
    rows = tx.all(
        "SELECT id FROM sessions WHERE parent_session_id IS NOT NULL"
        " AND json_extract(config, '$.subagent') IS NOT NULL"
        " AND json_extract(config, '$.subagent.settled') IS NULL" + scope + " ORDER BY depth DESC, id",
        params,
    )
    orphans = {str(r["id"]) for r in rows}
    for r in rows:
        cancel_all(tx, r["id"], ORPHANED)
        settle_child(tx, r["id"], None)
    return [sid for sid in with_work if sid not in orphans]
