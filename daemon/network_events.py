"""The network proxy's reports as session events: ``sandbox/network``.

A command whose network is an allow list reaches out only through the daemon's proxy
(:mod:`agent.sandbox.proxy`), which reports every attempt -- let through, refused, failed -- to
the command's gate. :class:`NetworkEvents` makes each report a durable ``sandbox/network`` event of
the session it belongs to (a shell call's session, with its call and turn; a goal's session for its
verification and progress commands), so ``goald log`` and the status page show what the command
tried. Reports are written in batches, one transaction per batch, off the proxy's path: a command
that tries many hosts slows nothing, and past the proxy's bound per command the rest are one
``omitted`` count.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from loguru import logger

from agent.events import EventType
from agent.sandbox.proxy import Attempt, Omitted, Report
from agent.store import Store
from agent.tx import Tx


def event_data(item: Attempt | Omitted, context: dict[str, str]) -> dict[str, Any]:
    """The stored object of one report (:class:`agent.payloads.SandboxNetwork`)."""
    if isinstance(item, Omitted):
        return {"omitted": item.count, **context}
    data: dict[str, Any] = {"host": item.host, "port": item.port, "method": item.method, "allowed": item.allowed}
    if item.reason is not None:
        data["reason"] = item.reason
    if item.address is not None:
        data["address"] = item.address
    return {**data, **context}


class NetworkEvents:
    """Writes the proxy's reports as ``sandbox/network`` events (see the module docstring)."""

    def __init__(self, store: Store, spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]]) -> None:
        self._store = store
        self._spawn = spawn
        self._pending: list[tuple[str, dict[str, Any]]] = []
        self._flushing: asyncio.Task[None] | None = None

    def reporter(self, session_id: str, **context: str | None) -> Report:
        """Where the attempts of a command of ``session_id`` go; ``context`` (``toolUseId``,
        ``turnId``, ``goalId``) is added to each event."""
        extra = {k: v for k, v in context.items() if v is not None}

        def report(item: Attempt | Omitted) -> None:
            self._pending.append((session_id, event_data(item, extra)))
            if self._flushing is None or self._flushing.done():
                self._flushing = self._spawn(self._flush())

        return report

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # let the reports of one burst gather
        while self._pending:
            batch, self._pending = self._pending, []

            def write(tx: Tx, batch: list[tuple[str, dict[str, Any]]] = batch) -> None:
                for session_id, data in batch:
                    tx.emit(session_id, EventType.SANDBOX_NETWORK, data)

            try:
                await self._store.transact(write)
            except Exception as exc:  # the attempts were made; only their record is lost, and said so
                logger.warning("{} sandbox network event(s) could not be recorded: {}", len(batch), exc)
