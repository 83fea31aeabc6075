"""One ACP session: a goald session, the pump that streams its events as updates, and its slot.

The pump is the only writer of a session's updates, so they reach the editor in event order.
Committed events (a store listener, in commit order) and streamed text (the agent's delta
listener) go into one queue as they happen, so text streamed by a model step is sent before that
step's committed message and everything after it. A prompt settles only after the pump has sent
the updates of every event up to the interval's idle (see :mod:`daemon.acp.prompt`).

Opening a session registers both listeners *before* reading where the session stands; a replay
(``session/load``) then sends the stored history up to that point and drops what the queue holds
from before it, so nothing is missed or sent twice.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from loguru import logger

from agent import Agent, Event, NotFound, Store
from daemon.acp.prompt import PromptSlot
from daemon.acp.updates import Projector, Update
from goals import Goal

Send = Callable[[str, Update], Awaitable[None]]
GoalLookup = Callable[[str], Awaitable[Goal]]


@dataclass(frozen=True)
class Delta:
    """Text a model streamed (ephemeral, never stored)."""

    turn_id: str
    text: str


class AcpSession:
    """The bridge's view of one goald session (see the module docstring)."""

    def __init__(self, store: Store, agent: Agent, send: Send, goal: GoalLookup) -> None:
        self.store = store
        self.agent = agent
        self.session_id = agent.session_id
        self._send = send
        self._goal = goal
        self.projector = Projector()
        #: The in-flight prompt, if any (at most one).
        self.slot: PromptSlot | None = None
        #: Every event up to this sequence number has had its updates sent.
        self.sent_seq = 0
        self._queue: asyncio.Queue[Event | Delta] = asyncio.Queue()
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._removers: list[Callable[[], None]] = []
        self._task: asyncio.Task[None] | None = None
        self._failed: BaseException | None = None

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self, *, replay: bool) -> None:
        """Listen, then stream from now on (``replay``: after sending the stored history first).

        Returns once every stored event has had its updates sent.
        """
        sid = self.session_id
        queue = self._queue

        def on_event(event: Event) -> None:
            if event.session_id == sid:
                queue.put_nowait(event)

        def on_delta(turn_id: str, text: str) -> None:
            queue.put_nowait(Delta(turn_id, text))

        self._removers.append(self.store.hub.add_listener(on_event))
        self._removers.append(self.agent.add_delta_listener(on_delta))
        upto = (await self.store.session_state(sid)).last_seq
        if not replay:
            self.sent_seq = upto
        self._task = asyncio.get_running_loop().create_task(self._pump(upto), name=f"acp pump {sid}")
        await self.reached(upto)

    async def close(self) -> None:
        """Stop streaming; an in-flight prompt settles as cancelled."""
        for remove in self._removers:
            remove()
        self._removers.clear()
        if self.slot is not None:
            self.slot.dispose()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def reached(self, seq: int) -> None:
        """Wait until the updates of every event up to ``seq`` were sent."""
        if self._failed is not None:
            raise ConnectionError("the session's update stream stopped") from self._failed
        if self.sent_seq >= seq:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((seq, fut))
        await fut

    # -- the pump --------------------------------------------------------------------------

    async def _pump(self, upto: int) -> None:
        try:
            if self.sent_seq < upto:
                await self._replay(upto)
            # What the queue holds up to the last event already sent is stale (streamed text included).
            held: list[Event | Delta] = []
            while not self._queue.empty():
                held.append(self._queue.get_nowait())
            stale = [i for i, item in enumerate(held) if isinstance(item, Event) and item.seq <= upto]
            for item in held[stale[-1] + 1 if stale else 0 :]:
                await self._item(item)
            while True:
                await self._item(await self._queue.get())
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning("ACP updates of session {} stopped: {}", self.session_id, exc)
            self._fail(exc)

    async def _replay(self, upto: int) -> None:
        cursor = self.sent_seq
        while cursor < upto:
            page = await self.store.events_after(self.session_id, cursor, limit=500, upto=upto)
            if not page:
                break
            for event in page:
                await self._take(event, replay=True)
                cursor = event.seq
        for update in self.projector.flush_plan():
            await self._send(self.session_id, update)
        self._advance(upto)

    async def _item(self, item: Event | Delta) -> None:
        if isinstance(item, Delta):
            for update in self.projector.delta(item.turn_id, item.text):
                await self._send(self.session_id, update)
            return
        if item.seq <= self.sent_seq:
            return
        if item.seq > self.sent_seq + 1:
            # Never expected (the listener sees every commit in order); refill from the store.
            for missed in await self.store.events_after(self.session_id, self.sent_seq, upto=item.seq - 1):
                await self._take(missed, replay=False)
        await self._take(item, replay=False)

    async def _take(self, event: Event, *, replay: bool) -> None:
        goal_id = self.projector.wants_goal(event)
        if goal_id is not None:
            with contextlib.suppress(NotFound):
                self.projector.seed_goal(await self._goal(goal_id))
        for update in self.projector.event(event, replay=replay):
            await self._send(self.session_id, update)
        # The slot is read after the sends: a prompt reserved meanwhile sees its own events.
        slot = self.slot
        if slot is not None:
            slot.observe(event)
        if not replay:
            self._advance(event.seq)

    def _advance(self, seq: int) -> None:
        self.sent_seq = max(self.sent_seq, seq)
        keep: list[tuple[int, asyncio.Future[None]]] = []
        for wanted, fut in self._waiters:
            if fut.done():
                continue
            if wanted <= self.sent_seq:
                fut.set_result(None)
            else:
                keep.append((wanted, fut))
        self._waiters = keep

    def _fail(self, exc: BaseException) -> None:
        self._failed = exc
        for _, fut in self._waiters:
            if not fut.done():
                fut.set_exception(ConnectionError("the session's update stream stopped"))
        self._waiters.clear()
        if self.slot is not None:
            self.slot.dispose()
