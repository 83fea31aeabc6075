"""The runtime: a store, its sessions and their live agents, under one task group.

Opening a runtime opens the store, repairs whatever a dead process left mid-turn, and starts a
driver for each session that still has a waking message queued. Agents are loaded lazily: the
first committed waking message of a session without a live agent loads one. A ``resolver`` turns a
session row into its model, tools and settings, so packages above decide those (the goal engine
adds goal tools; the daemon resolves model specs from its configuration).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from loguru import logger

from agent.calls import usage_of_guard
from agent.driver import Agent, AgentConfig, SlotFactory
from agent.errors import InvalidInput, NotFound, StoreClosed
from agent.events import Event, EventType
from agent.ids import GuardId, SessionId
from agent.models.base import Model
from agent.models.scripted import Reply, ScriptedModel
from agent.payloads import MessageQueued
from agent.sessions import SessionRow, create_session, list_sessions, load_session
from agent.spend import Limits, SpendGuard
from agent.store import Durability, Store, Tx
from agent.subagents import settle_orphans
from agent.tools.base import GUARD_KEY, ToolRegistry
from agent.turns import repair


@dataclass
class SessionSetup:
    """What an agent needs beyond its row: a model, tools and driver settings."""

    model: Model
    tools: ToolRegistry = field(default_factory=ToolRegistry)
    config: AgentConfig = field(default_factory=AgentConfig)
    slot: SlotFactory | None = None


Resolver = Callable[[SessionRow], "SessionSetup | Awaitable[SessionSetup]"]


def create_guard(tx: Tx, limits: Limits, guard_id: GuardId | None = None) -> GuardId:
    """Insert a spend guard row."""
    gid = guard_id or GuardId.new()
    tx.execute(
        "INSERT INTO guards(id, max_tokens, max_cost, deadline, max_wall_seconds, wall_started_at, created_at)"
        " VALUES (?,?,?,?,?,?,?)",
        (
            gid,
            limits.max_tokens,
            limits.max_cost,
            limits.deadline.isoformat() if limits.deadline else None,
            limits.max_wall_seconds,
            tx.now,
            tx.now,
        ),
    )
    return gid


def update_guard(tx: Tx, guard_id: str, limits: Limits) -> None:
    """Change a guard's limits."""
    cur = tx.execute(
        "UPDATE guards SET max_tokens=?, max_cost=?, deadline=?, max_wall_seconds=? WHERE id=?",
        (
            limits.max_tokens,
            limits.max_cost,
            limits.deadline.isoformat() if limits.deadline else None,
            limits.max_wall_seconds,
            guard_id,
        ),
    )
    if cur.rowcount == 0:
        raise NotFound(f"no spend guard {guard_id}")


def echo_model() -> ScriptedModel:
    """A scripted model that answers every prompt by echoing its last user text."""

    def rule(request: Any) -> Reply:
        last = request.messages[-1] if request.messages else None
        text = "".join(getattr(b, "text", "") for b in last.content) if last is not None else ""
        return Reply.say(f"echo: {text}")

    return ScriptedModel(rule, name="echo", record=False)


class ModelRegistry:
    """Model instances by ``PROVIDER:MODEL`` spec (shared by every session that names them)."""

    def __init__(
        self,
        models: dict[str, Model] | None = None,
        default: str = "scripted:echo",
        factory: Callable[[str], Model | None] | None = None,
    ) -> None:
        self._models: dict[str, Model] = dict(models or {})
        self.default = default
        self._factory = factory
        self._models.setdefault("scripted:echo", echo_model())

    def add(self, model: Model, spec: str | None = None) -> None:
        """Register a model under its spec (or ``spec``)."""
        self._models[spec or model.spec] = model

    def get(self, spec: str | None) -> Model:
        """The model for ``spec`` (the default when ``None``)."""
        key = spec or self.default
        model = self._models.get(key)
        if model is None and self._factory is not None:
            model = self._factory(key)
            if model is not None:
                self._models[key] = model
        if model is None:
            known = ", ".join(sorted(self._models))
            raise InvalidInput(f"unknown model {key!r}; known: {known}")
        return model


class Runtime:
    """Sessions and agents over one store. Use ``async with Runtime.open(...) as rt``."""

    def __init__(self, store: Store, resolver: Resolver, tg: asyncio.TaskGroup) -> None:
        self.store = store
        self._resolver = resolver
        self._tg = tg
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
        resolver: Resolver | None = None,
        models: ModelRegistry | None = None,
        tools: Callable[[SessionRow], ToolRegistry] | None = None,
        grace: float = 10.0,
        resume: bool = True,
    ) -> AsyncIterator[Runtime]:
        """Open the store at ``path``, repair it, resume sessions with queued work, and yield.

        Either pass a ``resolver`` or a ``models`` registry (and optionally a ``tools`` factory).
        On exit every driver stops (running turns get ``grace`` seconds) and the store closes.
        With ``resume=False`` the sessions with queued work wait for :meth:`resume` (a daemon
        calls it once it serves, so that a big backlog does not delay its readiness).
        """
        if resolver is None:
            registry = models or ModelRegistry()
            tool_factory = tools or (lambda row: ToolRegistry())

            def default_resolver(row: SessionRow) -> SessionSetup:
                return SessionSetup(
                    model=registry.get(row.model),
                    tools=tool_factory(row),
                    config=AgentConfig.model_validate(row.config.get("agent", {})),
                )

            resolver = default_resolver
        store = await Store.open(path, durability=durability)
        try:
            # A child whose delegating call died with the process must not run on its own.
            with_work = await store.transact(lambda tx: settle_orphans(tx, repair(tx)))
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
        fut: asyncio.Future[Agent] = asyncio.get_running_loop().create_future()
        self._loading[session_id] = fut
        self._buffers[session_id] = []
        try:
            row = await self.session(session_id)
            state = await self.store.session_state(row.id)
            if setup is None:
                resolved = self._resolver(row)
                setup = await resolved if inspect.isawaitable(resolved) else resolved
                assert isinstance(setup, SessionSetup)
                allowed = row.config.get("subagent", {}).get("tools")
                if allowed is not None:
                    # A subagent loaded without its delegating call still gets no more than it was given.
                    kept = [setup.tools.get(n) for n in setup.tools.names if n in allowed]
                    setup.tools = ToolRegistry(
                        [t for t in kept if t is not None],
                        policy=setup.tools.policy,
                        redactor=setup.tools.redactor,
                        unavailable={n: why for n, why in setup.tools.unavailable.items() if n in allowed},
                    )
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
        return await self.agent(sid, setup=SessionSetup(model=parent.model, tools=tools, config=parent.config))

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

        def run(tx: Tx) -> SpendGuard:
            row = tx.one("SELECT * FROM guards WHERE id=?", (guard_id,))
            if row is None:
                raise NotFound(f"no spend guard {guard_id}")
            tokens, cost = usage_of_guard(tx, guard_id)
            limits = Limits(
                max_tokens=row["max_tokens"],
                max_cost=row["max_cost"],
                deadline=datetime.fromisoformat(row["deadline"]) if row["deadline"] else None,
                max_wall_seconds=row["max_wall_seconds"],
            )
            started = datetime.fromisoformat(row["wall_started_at"]) if row["wall_started_at"] else None
            return SpendGuard(
                id=GuardId(guard_id), limits=limits, spent_tokens=tokens, spent_cost=cost, wall_started_at=started
            )

        loaded = await self.store.transact(run)
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
