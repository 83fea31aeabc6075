"""A step's tool calls: run, their results committed and added to the view.

Several calls of one step run in parallel, at most ``max_parallel_tools`` at once
(:class:`~agent.config.AgentConfig`; the others wait their turn, started in the order the model
asked for them), and each result is committed as it comes; a step's only call has its result
committed with the driver's next write (:mod:`agent.writer` says why that is as safe as its own
commit). However many run, a goal's caps on processes and memory bind them together
(:mod:`agent.limits`). The tools, the work directory and what the runtime hands every call
are read from the agent live (:class:`ToolOwner`: the ACP bridge wraps the tools).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Protocol

from agent.config import AgentConfig
from agent.events import EventType
from agent.history import History
from agent.messages import ToolResultBlock, ToolUseBlock
from agent.models.base import ConvMessage
from agent.store import Store
from agent.tools.base import ToolContext, ToolRegistry
from agent.turns import OpenedTurn
from agent.tx import Tx
from agent.writer import DriverWriter


class ToolOwner(Protocol):
    """What running a step's tool calls reads of the agent."""

    store: Store
    session_id: str
    tools: ToolRegistry
    workdir: Path | None
    tool_extra: dict[str, Any]
    config: AgentConfig


class ToolCalls:
    """Runs the tool calls of one session's steps (see the module docstring)."""

    def __init__(self, owner: ToolOwner, writer: DriverWriter, history: History) -> None:
        self._owner = owner
        self._writer = writer
        self._history = history

    async def run(self, turn: OpenedTurn, uses: list[ToolUseBlock]) -> None:
        """Run a step's calls (in parallel when there are several, at most ``max_parallel_tools``
        at once, the others started in order as those end) and commit their results."""
        if len(uses) == 1:
            await self._run_one(turn, uses[0], defer=True)
            return
        # Tasks start in the order they are made and each asks the semaphore first, whose waiters
        # go in turn: the calls start in the order asked.
        gate = asyncio.Semaphore(self._owner.config.max_parallel_tools)
        async with asyncio.TaskGroup() as tg:
            for use in uses:
                tg.create_task(self._run_gated(gate, turn, use))

    async def _run_gated(self, gate: asyncio.Semaphore, turn: OpenedTurn, use: ToolUseBlock) -> None:
        async with gate:
            await self._run_one(turn, use)

    async def _run_one(self, turn: OpenedTurn, use: ToolUseBlock, *, defer: bool = False) -> None:
        owner = self._owner
        session_id = owner.session_id
        ctx = ToolContext(
            session_id=session_id,
            turn_id=turn.turn_id,
            call_id=use.id,
            workdir=owner.workdir,
            store=owner.store,
            extra=dict(owner.tool_extra),
            write=self._writer.write,
        )
        out = await owner.tools.call(use.name, use.input, ctx)

        def run(tx: Tx) -> None:
            tx.emit(
                session_id,
                EventType.TOOL_RESULT,
                {
                    "turnId": turn.turn_id,
                    "toolUseId": use.id,
                    "name": use.name,
                    "content": out.content,
                    "isError": out.is_error,
                },
            )
            if out.denied is not None:
                tx.emit(
                    session_id,
                    EventType.TOOL_DENIED,
                    {"turnId": turn.turn_id, "toolUseId": use.id, "name": use.name, "reason": out.denied},
                )

        if defer:
            self._writer.defer(run)  # committed with the next write (see agent.writer)
        else:
            await self._writer.write(run)
        block = ToolResultBlock(tool_use_id=use.id, content=out.content, is_error=out.is_error)
        self._history.append(ConvMessage(role="tool", content=[block]))
