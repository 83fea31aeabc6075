"""A step's tool calls: run, their results committed and added to the view.

Several calls of one step run in parallel and each result is committed as it comes; a step's only
call has its result committed with the driver's next write (:mod:`agent.writer` says why that is
as safe as its own commit). The tools, the work directory and what the runtime hands every call
are read from the agent live (:class:`ToolOwner`: the ACP bridge wraps the tools).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Protocol

from agent.events import EventType
from agent.history import History
from agent.messages import ToolResultBlock, ToolUseBlock
from agent.models.base import ConvMessage
from agent.store import Store, Tx
from agent.tools.base import ToolContext, ToolRegistry
from agent.turns import OpenedTurn
from agent.writer import DriverWriter


class ToolOwner(Protocol):
    """What running a step's tool calls reads of the agent."""

    store: Store
    session_id: str
    tools: ToolRegistry
    workdir: Path | None
    tool_extra: dict[str, Any]


class ToolCalls:
    """Runs the tool calls of one session's steps (see the module docstring)."""

    def __init__(self, owner: ToolOwner, writer: DriverWriter, history: History) -> None:
        self._owner = owner
        self._writer = writer
        self._history = history

    async def run(self, turn: OpenedTurn, uses: list[ToolUseBlock]) -> None:
        """Run a step's calls (in parallel when there are several) and commit their results."""
        if len(uses) == 1:
            await self._run_one(turn, uses[0], defer=True)
            return
        async with asyncio.TaskGroup() as tg:
            for use in uses:
                tg.create_task(self._run_one(turn, use))

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
