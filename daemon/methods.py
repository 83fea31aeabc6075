"""The control protocol's methods (the canonical list is in the daemon issue and the README).

Every method validates its params with a pydantic model (camelCase on the wire) before it touches
anything, so bad input is answered with an error naming the field and changes nothing.
``session/prompt`` answers ``{messageId}`` as soon as the enqueue is durable — never a result;
there is no ``session.finished``: a client that wants a result subscribes and owns the interval
from its message's receipt to the next whole-agent idle.

A subscription may also ask for streamed text (``deltas: true``): ephemeral ``session.delta``
notifications, with no sequence number, sent only once the subscription is live (after the stored
events it asked for were replayed). They come from the session's live agent (its delta listener)
and go through the same queue as the committed events, so a step's text arrives before the
committed ``assistant/message`` that is the durable fact (the text of a failed attempt is followed
by a ``model/error`` event instead). Deltas are opt-in: most subscribers only want durable facts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from agent import Event, EventType, MessageId, SessionId, StatusChanged, Subscription, Tx, create_session
from daemon import __version__
from daemon.protocol import PROTOCOL_VERSION, Dispatcher, ErrorCode, InvalidField, Peer, RpcError
from goals import Budgets, Goal, GoalId, GoalSpec, GoalStatus, SandboxSpec, StopRules, VerifyCommand, check_nesting

if TYPE_CHECKING:
    from daemon.host import Host


class Params(BaseModel):
    """Base of every params model: camelCase on the wire, unknown fields refused."""

    # Built on first use, not at import: most methods are never called before READY=1.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", defer_build=True)


class BudgetsIn(Params):
    """Goal budgets on the wire."""

    max_rounds: int | None = Field(default=None, ge=1)
    max_tokens_total: int | None = Field(default=None, ge=1)
    max_cost: float | None = Field(default=None, gt=0)
    max_wall_seconds: float | None = Field(default=None, gt=0)
    deadline: datetime | None = None

    def to_budgets(self) -> Budgets:
        """As the goal model's budgets."""
        return Budgets.model_validate(self.model_dump())


class VerifyIn(Params):
    """One verification command on the wire."""

    cmd: str = Field(min_length=1)
    timeout: float = Field(default=300.0, gt=0, le=86_400)


class SecretIn(Params):
    """Where the daemon reads one secret of a goal's sandbox (never its value)."""

    credential: str | None = None
    env: str | None = None


class SandboxIn(Params):
    """A goal's own sandbox settings on the wire (merged with ``[goal_sandbox.<key>]``; see the README)."""

    network: bool | None = None
    read_only_paths: list[str] = []
    max_processes: int | None = None
    max_memory_mb: int | None = None
    secrets: dict[str, SecretIn] = {}

    def to_spec(self) -> SandboxSpec:
        """As the goal model's sandbox spec."""
        return SandboxSpec.model_validate(self.model_dump(exclude_unset=True))

    @model_validator(mode="after")
    def _valid(self) -> SandboxIn:
        try:
            self.to_spec()
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(to_camel(str(p)) if isinstance(p, str) else str(p) for p in first["loc"])
            raise ValueError(f"{where + ': ' if where else ''}{first['msg'].removeprefix('Value error, ')}") from None
        return self


class NoParams(Params):
    """No params."""


class SessionNew(Params):
    """``session/new``."""

    model: str | None = None
    workdir: str | None = None


class SessionRef(Params):
    """A session id."""

    session_id: SessionId


class Prompt(Params):
    """``session/prompt``."""

    session_id: SessionId
    text: str | None = None
    content: list[dict[str, Any]] | None = None
    delivery: Literal["followup", "steer", "context"] = "followup"
    message_id: MessageId | None = None

    @model_validator(mode="after")
    def _one_of(self) -> Prompt:
        if (self.text is None) == (self.content is None):
            raise ValueError("give exactly one of text or content")
        return self


class CancelMessage(Params):
    """``session/cancelMessage``."""

    session_id: SessionId
    message_id: MessageId


class Interrupt(Params):
    """``session/interrupt``."""

    session_id: SessionId
    discard_queued: bool = False


class Subscribe(Params):
    """``session/subscribe`` (no session: every session, live only)."""

    session_id: SessionId | None = None
    after_seq: int | None = Field(default=None, ge=0)
    #: Also send the session's streamed text as ephemeral ``session.delta`` notifications.
    deltas: bool = False

    @model_validator(mode="after")
    def _deltas_need_a_session(self) -> Subscribe:
        if self.deltas and self.session_id is None:
            raise ValueError("deltas are sent for one session: give sessionId")
        return self


class SessionList(Params):
    """``session/list``."""

    prefix: str | None = None
    limit: int = Field(default=100, ge=1, le=10_000)


class EventsPage(Params):
    """``session/events``."""

    session_id: SessionId
    after_seq: int = Field(default=0, ge=0)
    limit: int = Field(default=200, ge=1, le=10_000)


class GoalCreate(Params):
    """``goal/create``."""

    objective: str
    title: str | None = None
    key: str | None = None
    budgets: BudgetsIn | None = None
    verify: list[VerifyIn] = []
    model: str | None = None
    workdir: str | None = None
    tools: list[str] | None = None
    session_id: SessionId | None = None
    idempotency_key: str | None = None
    stall_rounds: int | None = Field(default=None, ge=1)
    #: A command whose changed output counts as the goal's progress (run in its sandbox).
    progress: VerifyIn | None = None
    sandbox: SandboxIn | None = None


class GoalRef(Params):
    """A goal id (or a unique prefix of one)."""

    goal_id: str = Field(min_length=len(GoalId.prefix))


class GoalResume(GoalRef):
    """``goal/resume``."""

    budgets: BudgetsIn | None = None


class GoalUpdate(GoalRef):
    """``goal/update``."""

    objective: str | None = None
    title: str | None = None
    budgets: BudgetsIn | None = None
    verify: list[VerifyIn] | None = None


class GoalList(Params):
    """``goal/list``."""

    status: GoalStatus | None = None


def checked_sandbox(host: Host, spec: SandboxSpec, on_existing_session: bool = False) -> None:
    """Refuse a goal's sandbox that names a provider's key, or secrets for a session that is already
    set up; otherwise let the daemon redact its secrets from the new session's tool output.

    Raises:
        InvalidField: naming what is wrong (nothing was written).
    """
    from daemon.goal_sandbox import check_spec

    try:
        check_spec(host.settings, spec)
    except ValueError as exc:
        raise InvalidField(str(exc), field="sandbox") from None
    if spec.secrets and on_existing_session:
        raise InvalidField("sandbox.secrets come with a goal's own session: leave out sessionId", field="sandbox")
    host.learn_secrets(spec)


def goal_view(goal: Goal) -> dict[str, Any]:
    """A goal as the protocol shows it."""
    data = goal.model_dump(mode="json", exclude={"memory"})
    out = {to_camel(k): v for k, v in data.items()}
    out["budgets"] = {to_camel(k): v for k, v in data["budgets"].items()}
    out["rules"] = {to_camel(k): v for k, v in data["rules"].items()}
    out["sandbox"] = {to_camel(k): v for k, v in data["sandbox"].items()}
    mem = goal.memory
    out["notes"] = mem.notes
    out["lastVerification"] = [r.model_dump(mode="json") for r in mem.verify_results]
    out["lastError"] = mem.last_error
    return out


def event_view(event: Event) -> dict[str, Any]:
    """An event as the protocol shows it."""
    return {"type": event.type, "data": event.data, "at": event.at}


def build_dispatcher(host: Host) -> Dispatcher:
    """Every method, bound to ``host``."""
    d = Dispatcher()

    def runtime() -> Any:
        if host.rt is None:
            raise RpcError(ErrorCode.SHUTTING_DOWN, "the daemon is not serving")
        return host.rt

    def engine() -> Any:
        if host.engine is None:
            raise RpcError(ErrorCode.SHUTTING_DOWN, "the daemon is not serving")
        return host.engine

    def taking_work() -> None:
        if host.state != "serving":
            raise RpcError(ErrorCode.SHUTTING_DOWN, f"the daemon is {host.state}; it takes no new work")

    @d.method("initialize", NoParams)
    async def initialize(p: NoParams, peer: Peer) -> dict[str, Any]:
        return {"serverInfo": {"name": "goald", "version": __version__}, "protocolVersion": PROTOCOL_VERSION}

    @d.method("session/new", SessionNew)
    async def session_new(p: SessionNew, peer: Peer) -> dict[str, Any]:
        taking_work()
        host.models.get(p.model)
        rt = runtime()
        sid = SessionId.new()
        workdir = host.workdir_for(p.workdir, sid)

        def create(tx: Tx) -> None:
            check_nesting(tx, str(workdir))  # no session in (or around) another's work directory
            create_session(tx, model=p.model, workdir=str(workdir), session_id=sid)

        await rt.store.transact(create)
        return {"sessionId": sid, "workdir": str(workdir)}

    @d.method("session/prompt", Prompt)
    async def session_prompt(p: Prompt, peer: Peer) -> dict[str, Any]:
        taking_work()
        agent = await runtime().agent(p.session_id)
        content: Any = p.text if p.text is not None else p.content
        mid = await agent.enqueue(content, delivery=p.delivery, message_id=p.message_id)
        return {"messageId": mid}

    @d.method("session/cancelMessage", CancelMessage)
    async def cancel_message(p: CancelMessage, peer: Peer) -> dict[str, Any]:
        agent = await runtime().agent(p.session_id)
        await agent.cancel_message(p.message_id)
        return {}

    @d.method("session/interrupt", Interrupt)
    async def interrupt(p: Interrupt, peer: Peer) -> dict[str, Any]:
        agent = await runtime().agent(p.session_id)
        await agent.interrupt(discard_queued=p.discard_queued)
        return {}

    @d.method("session/list", SessionList)
    async def session_list(p: SessionList, peer: Peer) -> dict[str, Any]:
        rows = await runtime().sessions(p.prefix or SessionId.prefix, p.limit)
        return {
            "sessions": [
                {
                    "sessionId": r.id,
                    "model": r.model,
                    "workdir": r.workdir,
                    "parentSessionId": r.parent_session_id,
                    "createdAt": r.created_at,
                }
                for r in rows
            ]
        }

    @d.method("agent/status", SessionRef)
    async def agent_status(p: SessionRef, peer: Peer) -> dict[str, Any]:
        rt = runtime()
        await rt.session(p.session_id)
        st = await rt.store.session_state(p.session_id)
        return {"sessionId": p.session_id, "status": st.status, "seq": st.status_seq, "lastSeq": st.last_seq}

    @d.method("session/events", EventsPage)
    async def session_events(p: EventsPage, peer: Peer) -> dict[str, Any]:
        rt = runtime()
        await rt.session(p.session_id)
        events = await rt.store.events_after(p.session_id, p.after_seq, limit=p.limit)
        return {
            "sessionId": p.session_id,
            "events": [{"seq": e.seq, **event_view(e)} for e in events],
            "lastSeq": events[-1].seq if events else p.after_seq,
        }

    @d.method("session/subscribe", Subscribe)
    async def subscribe(p: Subscribe, peer: Peer) -> dict[str, Any]:
        rt = runtime()
        if p.session_id is None:
            sub = rt.store.hub.open(None)
            _start(peer, _pump_all(sub, peer))
            return {"sessionId": None, "live": True}
        await rt.session(p.session_id)
        st = await rt.store.session_state(p.session_id)
        first = await rt.store.first_kept_seq(p.session_id)
        after = p.after_seq if p.after_seq is not None else st.last_seq
        if first is not None and after < first - 1:
            raise RpcError(
                ErrorCode.EVENTS_PRUNED, f"events before seq {first} are no longer kept", {"firstSeq": int(first)}
            )
        pump = _pump_with_deltas if p.deltas else _pump_session
        _start(peer, pump(rt, p.session_id, after, peer))
        return {"sessionId": p.session_id, "afterSeq": after}

    @d.method("goal/create", GoalCreate)
    async def goal_create(p: GoalCreate, peer: Peer) -> dict[str, Any]:
        taking_work()
        eng = engine()
        goal_id = GoalId.new()
        spec = GoalSpec(
            objective=p.objective,
            title=p.title,
            key=p.key,
            budgets=p.budgets.to_budgets() if p.budgets else Budgets(),
            verify=[VerifyCommand.model_validate(v.model_dump()) for v in p.verify],
            model=p.model or host.settings.default_model,
            workdir=None,
            tools=p.tools,
            session_id=p.session_id,
            idempotency_key=p.idempotency_key,
            rules=StopRules(stall_rounds=p.stall_rounds) if p.stall_rounds else StopRules(),
            progress=VerifyCommand.model_validate(p.progress.model_dump()) if p.progress is not None else None,
            sandbox=p.sandbox.to_spec() if p.sandbox is not None else SandboxSpec(),
        )
        host.models.get(spec.model)
        checked_sandbox(host, spec.sandbox, p.session_id is not None)
        if p.workdir is not None or p.session_id is None:
            workdir = host.workdir_for(p.workdir, goal_id)
            spec = spec.model_copy(update={"workdir": str(workdir)})
        elif (row := await runtime().session(p.session_id)).workdir is not None:
            # A goal on an existing session works, and is verified, in that session's directory
            # (without one, its verification commands would have nowhere to run).
            spec = spec.model_copy(update={"workdir": str(host.workdir_for(row.workdir, goal_id))})
        try:
            goal = await eng.create(spec, goal_id=goal_id)
        except BaseException:
            if p.workdir is None and p.session_id is None and spec.workdir is not None:
                # The directory made above for this goal id: a refused goal (e.g. a key that is
                # taken) leaves nothing behind. rmdir removes it only while it is still empty.
                with contextlib.suppress(OSError):
                    os.rmdir(spec.workdir)
            raise
        return {"goalId": goal.id, "sessionId": goal.session_id, "workdir": goal.workdir}

    @d.method("goal/list", GoalList)
    async def goal_list(p: GoalList, peer: Peer) -> dict[str, Any]:
        goals = await engine().list_goals(p.status)
        return {"goals": [goal_view(g) for g in goals]}

    @d.method("goal/get", GoalRef)
    async def goal_get(p: GoalRef, peer: Peer) -> dict[str, Any]:
        return goal_view(await engine().get(p.goal_id))

    @d.method("goal/pause", GoalRef)
    async def goal_pause(p: GoalRef, peer: Peer) -> dict[str, Any]:
        return goal_view(await engine().pause(p.goal_id))

    @d.method("goal/resume", GoalResume)
    async def goal_resume(p: GoalResume, peer: Peer) -> dict[str, Any]:
        taking_work()
        budgets = p.budgets.to_budgets() if p.budgets else None
        return goal_view(await engine().resume(p.goal_id, budgets))

    @d.method("goal/cancel", GoalRef)
    async def goal_cancel(p: GoalRef, peer: Peer) -> dict[str, Any]:
        return goal_view(await engine().cancel(p.goal_id))

    @d.method("goal/update", GoalUpdate)
    async def goal_update(p: GoalUpdate, peer: Peer) -> dict[str, Any]:
        goal = await engine().update(
            p.goal_id,
            objective=p.objective,
            title=p.title,
            budgets=p.budgets.to_budgets() if p.budgets else None,
            verify=[VerifyCommand.model_validate(v.model_dump()) for v in p.verify] if p.verify is not None else None,
        )
        return goal_view(goal)

    @d.method("daemon/health", NoParams)
    async def health(p: NoParams, peer: Peer) -> dict[str, Any]:
        return await host.health()

    @d.method("daemon/reload", NoParams)
    async def reload(p: NoParams, peer: Peer) -> dict[str, Any]:
        return await host.reload()

    @d.method("shutdown", NoParams)
    async def shutdown(p: NoParams, peer: Peer) -> dict[str, Any]:
        asyncio.get_running_loop().call_soon(host.request_stop)
        return {}

    from daemon.schedule_methods import register_schedule_methods

    register_schedule_methods(d, host)
    return d


def _start(peer: Peer, coro: Any) -> None:
    task = asyncio.get_running_loop().create_task(coro)
    peer.tasks.add(task)
    task.add_done_callback(peer.tasks.discard)


async def _send_event(peer: Peer, event: Event) -> None:
    await peer.notify("session.event", {"sessionId": event.session_id, "seq": event.seq, "event": event_view(event)})
    if event.type == EventType.STATUS and isinstance(changed := event.payload, StatusChanged):
        await peer.notify(
            "session.status", {"sessionId": event.session_id, "seq": event.seq, "status": changed.status.value}
        )


async def _pump_session(rt: Any, session_id: str, after: int, peer: Peer) -> None:
    # Let the subscribe response go out first.
    await asyncio.sleep(0)
    async for event in rt.store.hub.subscribe(rt.store, session_id, after):
        await _send_event(peer, event)


@dataclass(frozen=True)
class _Delta:
    """Streamed text of a turn (ephemeral)."""

    turn_id: str
    text: str


async def _pump_with_deltas(rt: Any, session_id: str, after: int, peer: Peer) -> None:
    """Like :func:`_pump_session`, and the session's streamed text as ``session.delta`` once live.

    Committed events (a store listener, in commit order) and deltas (the live agent's delta
    listener) share one queue, so text is sent in the order it was streamed relative to commits.
    The agent of a session can change (it is loaded when it has work, unloaded after): the delta
    listener follows it at each ``turn/start``, which only a loaded agent commits.
    """
    await asyncio.sleep(0)  # let the subscribe response go out first
    queue: asyncio.Queue[Event | _Delta] = asyncio.Queue()
    live = False
    attached: tuple[Any, Callable[[], None]] | None = None

    def on_delta(turn_id: str, text: str) -> None:
        queue.put_nowait(_Delta(turn_id, text))

    def attach() -> None:
        nonlocal attached
        agent = rt.live_agents.get(session_id)
        if attached is not None and attached[0] is agent:
            return
        if attached is not None:
            attached[1]()
            attached = None
        if agent is not None:
            attached = (agent, agent.add_delta_listener(on_delta))

    def on_event(event: Event) -> None:
        if event.session_id != session_id:
            return
        queue.put_nowait(event)
        if live and event.type == EventType.TURN_START:
            attach()

    remove = rt.store.hub.add_listener(on_event)
    try:
        last = after
        while True:  # the replay: stored events only
            page = await rt.store.events_after(session_id, last, limit=1000)
            for event in page:
                await _send_event(peer, event)
                last = event.seq
            if len(page) < 1000:
                break
        live = True
        attach()
        while True:
            item = await queue.get()
            if isinstance(item, _Delta):
                await peer.notify("session.delta", {"sessionId": session_id, "turnId": item.turn_id, "text": item.text})
                continue
            if item.seq <= last:
                continue
            if item.seq != last + 1:
                # Never expected (the listener sees every commit in order); refill from the store.
                for missed in await rt.store.events_after(session_id, last, limit=item.seq - last - 1):
                    await _send_event(peer, missed)
                    last = missed.seq
            await _send_event(peer, item)
            last = item.seq
    finally:
        remove()
        if attached is not None:
            attached[1]()


async def _pump_all(sub: Subscription, peer: Peer) -> None:
    try:
        while True:
            await _send_event(peer, await sub.queue.get())
    finally:
        sub.close()
