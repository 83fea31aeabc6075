"""The runtime: a store, its sessions and their live agents, under one task group.

Opening a runtime opens the store, repairs whatever a dead process left mid-turn, and starts a
driver for each session that still has a waking message queued. Agents are loaded lazily: the
first committed waking message of a session without a live agent loads one. A ``resolver`` turns a
session row into its model, tools and settings, so packages above decide those (the goal engine
adds goal tools; the daemon resolves model specs from its configuration).

Besides the live agents it keeps one in-memory :class:`~agent.spend.SpendGuard` per guard, shared
by every session under it. What an agent is built from is :mod:`agent.setup`; the rows of
sessions and guards are :mod:`agent.sessions` and :mod:`agent.guards`; the model registry is
:mod:`agent.models.registry`. Their names are re-exported here for the callers that import them
from this module.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, Protocol

from loguru import logger

from agent.backends import DEFAULT_CONNECTIONS
from agent.driver import Agent
from agent.errors import HeldElsewhere, LeaseLost, NotFound, StorageUnavailable, StoreClosed
from agent.events import Event, EventType
from agent.guards import create_guard, load_guard, update_guard
from agent.ids import GuardId, MessageId, SessionId
from agent.inbox import cancel, enqueue
from agent.messages import CancelReason, Content, Delivery, Source, parse_content, parse_delivery
from agent.models.registry import ModelRegistry, echo_model
from agent.payloads import MessageQueued
from agent.sessions import SessionRow, create_session, list_sessions, load_session
from agent.setup import Resolver, SessionSetup, default_resolver, resolve_setup
from agent.spend import Limits, SpendGuard
from agent.store import Durability, Store
from agent.subagents import settle_orphans
from agent.tools.base import GUARD_KEY, ToolRegistry
from agent.turns import repair


class Leases(Protocol):
    """Which sessions this process may drive, where several share one database (a cluster's lease
    manager); without one, every session is this process's."""

    async def acquire(self, session_id: str) -> str | None:
        """Hold ``session_id`` (already held, or claimed now): ``None``; else who drives it."""
        ...

    def holds(self, session_id: str) -> bool:
        """Whether this process holds ``session_id`` now."""
        ...


class Runtime:
    """Sessions and agents over one store. Use ``async with Runtime.open(...) as rt``."""

    def __init__(self, store: Store, resolver: Resolver, tg: asyncio.TaskGroup) -> None:
        self.store = store
        self._resolver = resolver
        self._tg = tg
        #: Set by a cluster: an agent is loaded (and so driven) only for a session it holds.
        self.leases: Leases | None = None
        # Other nodes' commits are read back only for the sessions this process has a use for.
        store.interest = self._interested
        #: More interest in other nodes' commits (the goal engine: the sessions of goals it follows).
        self.watchers: list[Callable[[str], bool]] = []
        self._agents: dict[str, Agent] = {}
        self._loading: dict[str, asyncio.Future[Agent]] = {}
        self._buffers: dict[str, list[Event]] = {}
        self._guards: dict[str, SpendGuard] = {}
        self._closing = False
        self._pending_resume: list[str] = []
        self._remove_listener = store.hub.add_listener(self._on_event)

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        path: str | Path,
        *,
        durability: Durability = "normal",
        connections: int = DEFAULT_CONNECTIONS,
        resolver: Resolver | None = None,
        models: ModelRegistry | None = None,
        tools: Callable[[SessionRow], ToolRegistry] | None = None,
        grace: float = 10.0,
        resume: bool = True,
        repair_all: bool = True,
    ) -> AsyncIterator[Runtime]:
        """Open the store at ``path``, repair it, resume sessions with queued work, and yield.

        Either pass a ``resolver`` or a ``models`` registry (and optionally a ``tools`` factory).
        On exit every driver stops (running turns get ``grace`` seconds) and the store closes.
        With ``resume=False`` the sessions with queued work wait for :meth:`resume` (a daemon
        calls it once it serves, so that a big backlog does not delay its readiness). With
        ``repair_all=False`` (a node of a cluster) nothing is repaired or resumed here: other nodes
        drive their sessions, and this one repairs each session it takes over when it takes it.
        """
        if resolver is None:
            resolver = default_resolver(models or ModelRegistry(), tools)
        store = await Store.open(path, durability=durability, connections=connections)
        try:
            # A child whose delegating call died with the process must not run on its own.
            with_work = await store.transact(lambda tx: settle_orphans(tx, repair(tx))) if repair_all else []
            async with asyncio.TaskGroup() as tg:
                rt = cls(store, resolver, tg)
                rt._pending_resume = with_work
                try:
                    if resume:
                        await rt.resume()
                    yield rt
                finally:
                    await rt._shutdown(grace)
        finally:
            await store.close()

    async def resume(self) -> int:
        """Start the drivers of the sessions that had queued work when the store opened."""
        pending, self._pending_resume = self._pending_resume, []
        for sid in pending:
            if self._closing:
                break
            # One session that cannot load (say its model is gone) must not stop the rest.
            await self._load_quietly(sid)
        return len(pending)

    # -- sessions --------------------------------------------------------------------------

    async def create_session(
        self,
        *,
        model: str | None = None,
        workdir: str | Path | None = None,
        parent_session_id: str | None = None,
        guard_id: str | None = None,
        config: dict[str, Any] | None = None,
    ) -> SessionId:
        """Create a session (no agent is loaded until it has work)."""
        return await self.store.transact(
            lambda tx: create_session(
                tx,
                model=model,
                workdir=str(workdir) if workdir is not None else None,
                parent_session_id=parent_session_id,
                guard_id=guard_id,
                config=config,
            )
        )

    async def session(self, session_id: str) -> SessionRow:
        """The stored session row. Raises ``NotFound``."""
        sid = SessionId.parse(session_id)
        return await self.store.read(lambda conn: load_session(conn, sid))

    async def sessions(self, prefix: str = SessionId.prefix, limit: int = 100) -> list[SessionRow]:
        """Stored sessions whose id starts with ``prefix``, newest first, at most ``limit``."""
        return await self.store.read(lambda conn: list_sessions(conn, prefix, limit))

    async def agent(self, session_id: str, *, setup: SessionSetup | None = None) -> Agent:
        """The live agent of a session, loading it (and starting its driver) if needed.

        ``setup``, when given, is used instead of the resolver if the agent is not loaded yet.
        """
        live = self._agents.get(session_id)
        if live is not None:
            return live
        if self._closing:
            raise StoreClosed("the runtime is shutting down; it loads no more sessions")
        pending = self._loading.get(session_id)
        if pending is not None:
            return await asyncio.shield(pending)
        if self.leases is not None and (holder := await self.leases.acquire(session_id)) is not None:
            raise HeldElsewhere(f"session {session_id} is driven by {holder}; ask that node")
        live = self._agents.get(session_id)  # loaded while the lease was being taken
        if live is not None:
            return live
        pending = self._loading.get(session_id)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[Agent] = asyncio.get_running_loop().create_future()
        self._loading[session_id] = fut
        self._buffers[session_id] = []
        try:
            row = await self.session(session_id)
            state = await self.store.session_state(row.id)
            if setup is None:
                # A subagent loaded without its delegating call still gets no more than it was given.
                setup = await resolve_setup(self._resolver, row)
            guard = await self.guard(row.guard_id)
            agent = Agent(
                store=self.store,
                session_id=row.id,
                model=setup.model,
                tools=setup.tools,
                guard=guard,
                config=setup.config,
                state=state,
                workdir=Path(row.workdir) if row.workdir else None,
                slot=setup.slot,
                tool_extra={"runtime": self, GUARD_KEY: guard},
                summary_model=setup.summary_model,
            )
            for event in self._buffers.pop(session_id, []):
                if event.seq > state.last_seq:
                    agent.on_event(event)
            if self._closing:
                raise StoreClosed("the runtime is shutting down; it loads no more sessions")
            self._agents[session_id] = agent
            agent.start(self._spawn)
            fut.set_result(agent)
            return agent
        except BaseException as exc:
            self._buffers.pop(session_id, None)
            fut.set_exception(exc)
            fut.exception()  # mark retrieved; the caller gets the exception below
            raise
        finally:
            self._loading.pop(session_id, None)

    async def enqueue(
        self,
        session_id: str,
        content: str | Content | Any,
        *,
        delivery: Delivery | str = Delivery.FOLLOWUP,
        message_id: MessageId | str | None = None,
        source: Source | None = None,
    ) -> MessageId:
        """Validate and enqueue a message on any session, live here or not (its driver, wherever it
        runs, is woken by the commit); returns the message's id once it is durable as queued."""
        blocks = parse_content(content)
        how = parse_delivery(delivery)
        mid = MessageId.parse(message_id) if message_id is not None else MessageId.new()
        sid = SessionId.parse(session_id)
        await self.store.transact(
            lambda tx: enqueue(tx, sid, blocks, delivery=how, message_id=mid, source=source), session=sid
        )
        return mid

    async def cancel_message(
        self,
        session_id: str,
        message_id: MessageId | str,
        reason: str = CancelReason.CANCELLED,
        caller: Mapping[str, int | str] | None = None,
    ) -> None:
        """Cancel a queued message of any session (``caller``: who asked, kept in the event). Raises
        ``InvalidTransition`` if it was admitted."""
        mid = MessageId.parse(message_id)
        sid = SessionId.parse(session_id)
        await self.store.transact(lambda tx: cancel(tx, sid, mid, reason, caller), session=sid)

    def _interested(self, session_id: str) -> bool:
        # On the store thread: reads of dicts the loop changes (a stale answer costs one read or one
        # event the next commit brings).
        return (
            session_id in self._agents
            or session_id in self._loading
            or (self.leases is not None and self.leases.holds(session_id))
            or self.store.hub.watches(session_id)
            or any(w(session_id) for w in self.watchers)
        )

    def wake(self, session_id: str) -> None:
        """Load the session's agent in the background (it has queued work), quietly if it cannot."""
        if session_id not in self._agents:
            self.spawn(self._load_quietly(session_id))

    async def create_child(self, parent_id: str, *, tools: ToolRegistry, config: dict[str, Any]) -> Agent:
        """Create a child session of a live parent and load its agent (see :mod:`agent.subagents`).

        The child gets the parent's model, work directory, spend guard and driver settings, the
        given ``tools`` (the caller narrows the parent's), and no concurrency slot: its turns run
        while the parent's turn, which holds one, waits for it.
        """
        parent = self._agents.get(parent_id)
        if parent is None:
            raise NotFound(f"session {parent_id} has no live agent to delegate from")
        row = await self.session(parent_id)
        sid = await self.create_session(
            model=row.model, workdir=row.workdir, parent_session_id=parent_id, guard_id=row.guard_id, config=config
        )
        setup = SessionSetup(model=parent.model, tools=tools, config=parent.config, summary_model=parent.summary_model)
        return await self.agent(sid, setup=setup)

    async def unload(self, session_id: str, grace: float = 10.0) -> None:
        """Stop a live agent's driver and forget it; it loads again, through the resolver, when it next has work.

        A subagent is unloaded when its delegating call ends: a finished child holds no task and no
        history, and anything sent to it later runs as a session of its own.
        """
        agent = self._agents.pop(session_id, None)
        if agent is not None:
            await agent.stop(grace)

    @property
    def live_agents(self) -> dict[str, Agent]:
        """Agents loaded so far, by session id."""
        return dict(self._agents)

    # -- guards ----------------------------------------------------------------------------

    async def create_guard(self, limits: Limits) -> GuardId:
        """Create a spend guard."""
        return await self.store.transact(lambda tx: create_guard(tx, limits))

    async def guard(self, guard_id: str | None) -> SpendGuard:
        """The shared in-memory guard for ``guard_id`` (an unlimited private one for ``None``)."""
        if guard_id is None:
            return SpendGuard(id=None)
        live = self._guards.get(guard_id)
        if live is not None:
            return live

        loaded = await self.store.transact(lambda tx: load_guard(tx, guard_id))
        return self._guards.setdefault(guard_id, loaded)

    # -- internals -------------------------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``coro`` in the runtime's task group; an exception is logged, never spread to siblings."""
        task = self._tg.create_task(self._supervise(coro))
        # A task cancelled before its first step never awaits ``coro``; close it so it is not
        # reported as "never awaited" (closing a finished coroutine does nothing).
        task.add_done_callback(lambda t: coro.close() if t.cancelled() else None)
        return task

    _spawn = spawn

    async def _supervise(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except LeaseLost as exc:  # expected: the session's new holder drives it (one line, no traceback)
            logger.info("{} ended: {}", getattr(coro, "__qualname__", "a task"), exc)
        except StorageUnavailable as exc:  # expected (the store warns of the outage itself), yet it ended
            logger.warning("{} ended: {}", getattr(coro, "__qualname__", "a task"), exc.message)
        except Exception:
            # A driver bug must not take every other session down with it.
            logger.exception("an agent driver failed")

    def _on_event(self, event: Event) -> None:
        live = self._agents.get(event.session_id)
        if live is not None:
            live.on_event(event)
            return
        buffer = self._buffers.get(event.session_id)
        if buffer is not None:
            buffer.append(event)
            return
        if self.store.relaying and (self.leases is None or not self.leases.holds(event.session_id)):
            return  # another node's commit: the node it was made on claims the session if no one holds it
        if (
            not self._closing
            and event.type == EventType.MESSAGE_QUEUED
            and isinstance(queued := event.payload, MessageQueued)
            and queued.delivery.wakes
        ):
            self._tg.create_task(self._load_quietly(event.session_id))

    async def _load_quietly(self, session_id: str) -> None:
        try:
            await self.agent(session_id)
        except StoreClosed:
            pass
        except HeldElsewhere as exc:  # its holder (woken by the same commit) drives it
            logger.debug("{}", exc)
        except StorageUnavailable as exc:  # an outage, not a bug (the store warns of it): one line
            logger.warning("could not load the agent of session {} now: {}", session_id, exc.message)
        except Exception:
            logger.exception("could not load the agent of session {}", session_id)

    async def _shutdown(self, grace: float) -> None:
        self._closing = True
        self._remove_listener()
        # Loads in flight finish first (they see the runtime closing and start no driver).
        loading = list(self._loading.values())
        if loading:
            await asyncio.gather(*loading, return_exceptions=True)
        agents = list(self._agents.values())
        if agents:
            await asyncio.gather(*(a.stop(grace) for a in agents), return_exceptions=True)


__all__ = [
    "ModelRegistry",
    "Resolver",
    "Runtime",
    "SessionSetup",
    "create_guard",
    "echo_model",
    "update_guard",
]
