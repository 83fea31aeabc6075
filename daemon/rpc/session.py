"""The ``session/*`` and ``agent/status`` methods, and the subscription pumps that stream events.

``session/prompt`` answers ``{messageId}`` as soon as the enqueue is durable — never a result;
there is no ``session.finished``: a client that wants a result subscribes and owns the interval
from its message's receipt to the next whole-agent idle.

A subscription may also ask for streamed text (``deltas: true``): ephemeral ``session.delta``
notifications, with no sequence number, sent only once the subscription is live (after the stored
events it asked for were replayed). They come from the session's live agent (its delta listener)
and go through the same queue as the committed events, so a step's text arrives before the
committed ``assistant/message`` that is the durable fact (the text of a failed attempt is followed
by a ``model/error`` event instead). Deltas are opt-in: most subscribers only want durable facts.
A subscription is a task of the connection (``peer.tasks``), cancelled when the connection closes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict

from agent import (
    Agent,
    Event,
    EventType,
    Runtime,
    SessionId,
    SessionRow,
    Source,
    SourceKind,
    StatusChanged,
    Subscription,
    Tx,
    create_session,
)
from daemon.display import reason_text
from daemon.rpc.context import HostPort, engine, runtime, taking_work
from daemon.rpc.params import (
    CancelMessage,
    EventsPage,
    Interrupt,
    Prompt,
    SessionList,
    SessionNew,
    SessionRef,
    Subscribe,
)
from daemon.rpc.protocol import Dispatcher, ErrorCode, Peer, RpcError
from daemon.rpc.views import Empty, JsonObject, event_view
from goals import CLAIMS, Goal, GoalStatus, check_nesting, latest_goal_of_session


class SessionCreated(TypedDict):
    """``session/new``'s answer."""

    sessionId: str
    workdir: str


class Enqueued(TypedDict, total=False):
    """``session/prompt``'s answer: the message is durably queued (never a result).

    To a goal's session it also names the goal and its status once the message is queued
    (``paused``: the message runs one turn, charged to the goal, not counted as a round).
    """

    messageId: str
    goalId: str
    goalStatus: str


class SessionInfo(TypedDict):
    """One session of ``session/list``."""

    sessionId: str
    model: str | None
    workdir: str | None
    parentSessionId: str | None
    createdAt: str


class SessionListing(TypedDict):
    """``session/list``'s answer."""

    sessions: list[SessionInfo]


class AgentStatusView(TypedDict):
    """``agent/status``'s answer."""

    sessionId: str
    status: str
    seq: int
    lastSeq: int


class EventsPageView(TypedDict):
    """``session/events``'s answer."""

    sessionId: str
    events: list[JsonObject]
    lastSeq: int


class Subscribed(TypedDict, total=False):
    """``session/subscribe``'s answer (``live`` for every session; ``afterSeq`` for one)."""

    sessionId: str | None
    live: bool
    afterSeq: int


async def new_session(host: HostPort, p: SessionNew) -> SessionCreated:
    """``session/new``: a session of a known model, in a work directory of its own."""
    taking_work(host)
    host.models.get(p.model)
    rt = runtime(host)
    sid = SessionId.new()
    workdir = host.workdirs.resolve(p.workdir, sid)

    def create(tx: Tx) -> None:
        check_nesting(tx, str(workdir))  # no session in (or around) another's work directory
        create_session(tx, model=p.model, workdir=str(workdir), session_id=sid)

    await rt.store.transact(create, named=CLAIMS)  # one claim of a work directory at a time
    return {"sessionId": sid, "workdir": str(workdir)}


async def prompt(host: HostPort, p: Prompt, peer: Peer) -> Enqueued:
    """``session/prompt``: enqueue the message (after what it asks of the session's goal); the
    answer is its id once the enqueue is durable."""
    taking_work(host)
    rt = runtime(host)
    await rt.session(p.session_id)
    goal = await _goal_for_message(host, p, peer)
    content = p.text if p.text is not None else p.content
    assert content is not None  # the params model requires one of them
    source = Source(kind=SourceKind.USER, **peer.caller) if peer.caller else None
    # Enqueued here whichever node drives the session: the commit wakes its driver (agent.relay).
    mid = await rt.enqueue(p.session_id, content, delivery=p.delivery, message_id=p.message_id, source=source)
    if goal is None:
        return {"messageId": mid}
    return {"messageId": mid, "goalId": goal.id, "goalStatus": goal.status.value}


async def subscribe(host: HostPort, p: Subscribe, peer: Peer) -> Subscribed:
    """``session/subscribe``: start the connection's pump of one session's events after a sequence
    number (refused when those were pruned), or of every session's from now on."""
    rt = runtime(host)
    if p.session_id is None:
        sub = rt.store.hub.open(None)
        peer.tasks.spawn(_pump_all(sub, peer))
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
    peer.tasks.spawn(pump(rt, p.session_id, after, peer))
    return {"sessionId": p.session_id, "afterSeq": after}


def _session_info(r: SessionRow) -> SessionInfo:
    return {
        "sessionId": r.id,
        "model": r.model,
        "workdir": r.workdir,
        "parentSessionId": r.parent_session_id,
        "createdAt": r.created_at,
    }


def register(d: Dispatcher, host: HostPort) -> None:
    """Add the ``session/*`` and ``agent/status`` methods to ``d``."""

    @d.method("session/new", SessionNew)
    async def session_new(p: SessionNew, peer: Peer) -> SessionCreated:
        return await new_session(host, p)

    @d.method("session/prompt", Prompt)
    async def session_prompt(p: Prompt, peer: Peer) -> Enqueued:
        return await prompt(host, p, peer)

    @d.method("session/cancelMessage", CancelMessage)
    async def cancel_message(p: CancelMessage, peer: Peer) -> Empty:
        await runtime(host).cancel_message(p.session_id, p.message_id, caller=peer.caller)
        return {}

    @d.method("session/interrupt", Interrupt)
    async def interrupt(p: Interrupt, peer: Peer) -> Empty:
        agent = await runtime(host).agent(p.session_id)
        await agent.interrupt(discard_queued=p.discard_queued, caller=peer.caller)
        return {}

    @d.method("session/list", SessionList)
    async def session_list(p: SessionList, peer: Peer) -> SessionListing:
        rows = await runtime(host).sessions(p.prefix or SessionId.prefix, p.limit)
        return {"sessions": [_session_info(r) for r in rows]}

    @d.method("agent/status", SessionRef)
    async def agent_status(p: SessionRef, peer: Peer) -> AgentStatusView:
        rt = runtime(host)
        await rt.session(p.session_id)
        st = await rt.store.session_state(p.session_id)
        return {"sessionId": p.session_id, "status": st.status, "seq": st.status_seq, "lastSeq": st.last_seq}

    @d.method("session/events", EventsPage)
    async def session_events(p: EventsPage, peer: Peer) -> EventsPageView:
        rt = runtime(host)
        await rt.session(p.session_id)
        events = await rt.store.events_after(p.session_id, p.after_seq, limit=p.limit)
        return {
            "sessionId": p.session_id,
            "events": [{"seq": e.seq, **event_view(e)} for e in events],
            "lastSeq": events[-1].seq if events else p.after_seq,
        }

    @d.method("session/subscribe", Subscribe)
    async def session_subscribe(p: Subscribe, peer: Peer) -> Subscribed:
        return await subscribe(host, p, peer)


async def _goal_for_message(host: HostPort, p: Prompt, peer: Peer) -> Goal | None:
    """The goal of the session a message goes to, after what the message asked of it.

    A message to a goal whose status is ended (completed, failed, cancelled, exhausted) is refused
    (``-32002``, naming the status): it would run the model in the goal's work directory and spend
    against no budget. With ``reopen`` the goal is resumed with its budgets first. A paused goal
    stays paused (its one turn is charged to it at the next idle, not counted as a round) unless
    ``resume`` is given. The check runs before the enqueue, so a refused message changes nothing.
    """
    eng = engine(host)
    goal = await runtime(host).store.read(lambda conn: latest_goal_of_session(conn, p.session_id))
    if goal is None:
        return None
    if not goal.status.live:
        if not p.reopen:
            reason = f" ({reason_text(goal.status_reason)})" if goal.status_reason else ""
            raise RpcError(
                ErrorCode.INVALID_TRANSITION,
                f"goal {goal.id} of this session is {goal.status.value}{reason}: the message was not sent;"
                " give reopen (goald send --reopen) to resume the goal with its budgets first",
                {"goalId": goal.id, "status": goal.status.value, "reason": goal.status_reason},
            )
        return await eng.resume(goal.id, reopen=True, caller=peer.caller)
    if goal.status is GoalStatus.PAUSED and p.resume:
        return await eng.resume(goal.id, caller=peer.caller)
    return goal


async def _send_event(peer: Peer, event: Event) -> None:
    await peer.notify("session.event", {"sessionId": event.session_id, "seq": event.seq, "event": event_view(event)})
    if event.type == EventType.STATUS and isinstance(changed := event.payload, StatusChanged):
        await peer.notify(
            "session.status", {"sessionId": event.session_id, "seq": event.seq, "status": changed.status.value}
        )


async def _pump_session(rt: Runtime, session_id: str, after: int, peer: Peer) -> None:
    # Let the subscribe response go out first.
    await asyncio.sleep(0)
    async for event in rt.store.hub.subscribe(rt.store, session_id, after):
        await _send_event(peer, event)


@dataclass(frozen=True)
class _Delta:
    """Streamed text of a turn (ephemeral)."""

    turn_id: str
    text: str


class _Feed:
    """One subscription's queue: the session's committed events (a store listener, in commit order)
    and, once live, its live agent's deltas, so text is sent in the order it was streamed relative
    to commits. The agent of a session can change (it is loaded when it has work, unloaded after):
    the delta listener follows it at each ``turn/start``, which only a loaded agent commits."""

    def __init__(self, rt: Runtime, session_id: str) -> None:
        self.rt = rt
        self.session_id = session_id
        self.queue: asyncio.Queue[Event | _Delta] = asyncio.Queue()
        self.live = False
        self._attached: tuple[Agent, Callable[[], None]] | None = None

    def on_delta(self, turn_id: str, text: str) -> None:
        self.queue.put_nowait(_Delta(turn_id, text))

    def on_event(self, event: Event) -> None:
        if event.session_id != self.session_id:
            return
        self.queue.put_nowait(event)
        if self.live and event.type == EventType.TURN_START:
            self.attach()

    def go_live(self) -> None:
        """The replay is done: deltas are wanted from now on."""
        self.live = True
        self.attach()

    def attach(self) -> None:
        """Listen to the session's live agent's deltas (the one loaded now, if any)."""
        agent = self.rt.live_agents.get(self.session_id)
        if self._attached is not None and self._attached[0] is agent:
            return
        self.detach()
        if agent is not None:
            self._attached = (agent, agent.add_delta_listener(self.on_delta))

    def detach(self) -> None:
        if self._attached is not None:
            self._attached[1]()
            self._attached = None


async def _replay(rt: Runtime, session_id: str, after: int, peer: Peer) -> int:
    """Send the stored events after ``after``; returns the last sequence number sent."""
    last = after
    while True:
        page = await rt.store.events_after(session_id, last, limit=1000)
        for event in page:
            await _send_event(peer, event)
            last = event.seq
        if len(page) < 1000:
            return last


async def _pump_with_deltas(rt: Runtime, session_id: str, after: int, peer: Peer) -> None:
    """Like :func:`_pump_session`, and the session's streamed text as ``session.delta`` once live
    (see :class:`_Feed`)."""
    await asyncio.sleep(0)  # let the subscribe response go out first
    feed = _Feed(rt, session_id)
    remove = rt.store.hub.add_listener(feed.on_event)
    try:
        last = await _replay(rt, session_id, after, peer)  # stored events only
        feed.go_live()
        while True:
            item = await feed.queue.get()
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
        feed.detach()


async def _pump_all(sub: Subscription, peer: Peer) -> None:
    try:
        while True:
            await _send_event(peer, await sub.queue.get())
    finally:
        sub.close()
