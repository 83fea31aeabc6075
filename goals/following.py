"""Which goals the goal engine follows: the live goals of the sessions this node drives.

:class:`GoalFollowing` is that part of :class:`~goals.engine.GoalEngine` (which is one): the map from
a session to its live goal, each goal's durable timers (a waiting goal's question at its deadline and
its reminders among them), the committed idles that wake an evaluation,
and in a cluster the goals of sessions whose lease this node takes over (:meth:`~GoalFollowing.adopt`)
or gives up (:meth:`~GoalFollowing.drop`), and a cancel made on another node reaching the turn it
interrupts here.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from loguru import logger

from agent import Agent, Event, Runtime, SessionState, Store, is_idle
from agent.tx import Query
from goals.errors import StaleDecision
from goals.known import known_goal
from goals.model import Goal, GoalStatus
from goals.operations import log_change
from goals.payloads import Caller
from goals.queries import round_of_rows, round_queries
from goals.questions import QuestionClosed, question_due, remind
from goals.store import GOAL_CHANGED, live_goal_of_session
from goals.timers import GoalTimers, Reminders, due_of

#: What an evaluation decides from: the goal, its session's state at the idle, the interval's events.
Round = tuple[Goal, SessionState, list[Event]]


class GoalFollowing:
    """The goals the engine follows (mixed into :class:`~goals.engine.GoalEngine`)."""

    rt: Runtime
    store: Store
    owns: Callable[[str], bool] | None
    held: dict[str, str]
    _sessions: dict[str, str]
    #: The other way round: each followed goal's session.
    _followed: dict[str, str]
    #: Per session, what its goal's evaluation read with the commit of its last idle (_idle_read).
    _at_idle: dict[str, Round]
    _timers: GoalTimers
    reminders: Reminders | None
    clock: Callable[[], datetime]

    if TYPE_CHECKING:  # the engine's

        def kick(self, goal_id: str) -> None: ...

        async def _sync_guard(self, goal: Goal) -> None: ...

        async def _fail_if_faulty(self, goal: Goal) -> Goal: ...

        async def _change(
            self, goal_ref: str, status: GoalStatus, reason: str, cancel_reason: str, caller: Caller | None = None
        ) -> Goal: ...

    @property
    def live_goal_count(self) -> int:
        """How many goals the engine follows (the active and paused ones)."""
        return len(self._sessions)

    def follows(self, session_id: str) -> bool:
        """Whether the engine follows a live goal of ``session_id``."""
        return session_id in self._sessions

    async def adopt(self, session_id: str, *, check: Callable[[Goal], str | None] | None = None) -> Goal | None:
        """Follow the live goal of a session this node has just taken over (a cluster's lease), and
        make its pending decision; returns it (``None``: the session has no live goal).

        ``check`` may give a reason to pause the goal with instead (its work directory is not on
        this node: it must not start over in an empty one)."""
        goal = await self.store.read(lambda conn: live_goal_of_session(conn, session_id))
        if goal is None:
            return None
        goal = await self._fail_if_faulty(goal)
        missing_workdir = check(goal) if check is not None else None
        if missing_workdir is not None and goal.status is GoalStatus.ACTIVE:
            goal = await self._change(goal.id, GoalStatus.PAUSED, missing_workdir, "goal paused")
        self._track(goal)
        if goal.status is GoalStatus.ACTIVE:
            self.kick(goal.id)
        return goal

    def drop(self, session_id: str) -> None:
        """Stop following the goal of a session this node no longer holds."""
        goal_id = self._sessions.pop(session_id, None)
        self._at_idle.pop(session_id, None)
        if goal_id is not None:
            self._followed.pop(goal_id, None)
            self._timers.drop(goal_id)

    def _track(self, goal: Goal) -> None:
        if self.owns is not None and not self.owns(goal.session_id):
            self._forget(goal)  # another node follows it
            return
        if goal.status.live:
            before = self._sessions.get(goal.session_id)
            if before is not None and before != goal.id:
                self._followed.pop(before, None)  # one live goal per session: the one before has ended
            self._sessions[goal.session_id] = goal.id
            self._followed[goal.id] = goal.session_id
        else:
            self._forget(goal)
            return
        self._timers.set(goal.id, due_of(goal, self.reminders))

    def _idle_read(self, session_id: str, state: SessionState) -> tuple[list[Query], Callable[[Any], None]] | None:
        """On the store thread, in the transaction that commits ``session_id``'s idle (the store's
        ``at_idle``): what its goal's evaluation reads, sent with that ``COMMIT`` (no round trip of
        its own: :meth:`agent.tx.Tx.commit`) and kept for the evaluation of that idle (:meth:`_read_at_idle`)."""
        goal_id = self._sessions.get(session_id)
        if goal_id is None:
            return None

        def take(rows: Any) -> None:
            self._at_idle[session_id] = round_of_rows(goal_id, session_id, state, rows)

        return round_queries(goal_id, session_id, state.last_seq), take

    def _read_at_idle(self, goal_id: str, session_id: str) -> Round | None:
        """What was read with the commit of ``session_id``'s last idle, if that idle is still the
        session's state as this process last committed it and the goal is as this process last
        wrote it (else ``None``: the evaluation reads). Taken once."""
        got = self._at_idle.pop(session_id, None)
        if got is None:
            return None
        goal, st, _ = got
        known = self.store.known_state(session_id)
        if goal.id != goal_id or known is None or (known.status_seq, known.last_seq) != (st.status_seq, st.last_seq):
            return None
        written = known_goal(self.store, session_id)
        if written is not None and written.id == goal.id and written.revision != goal.revision:
            return None
        return got

    def _session_of(self, goal_id: str) -> str | None:
        """The session of a goal this engine follows (``None``: not followed)."""
        return self._followed.get(goal_id)

    def _forget(self, goal: Goal) -> None:
        self.held.pop(goal.id, None)
        if self._sessions.get(goal.session_id) == goal.id:
            del self._sessions[goal.session_id]
            self._at_idle.pop(goal.session_id, None)
        if self._followed.get(goal.id) == goal.session_id:
            del self._followed[goal.id]
        self._timers.drop(goal.id)

    def _on_event(self, event: Event) -> None:
        if event.type == GOAL_CHANGED and self.store.relaying:
            self._cancelled_elsewhere(event)
            return
        if not is_idle(event):
            return
        goal_id = self._sessions.get(event.session_id)
        if goal_id is not None:
            self.kick(goal_id)

    def _cancelled_elsewhere(self, event: Event) -> None:
        """A goal cancelled through another node (its ``goal/changed`` relayed here): when this node
        drives the goal's session, its running turn is interrupted, as :meth:`cancel` does on the
        node it is asked on."""
        if event.data.get("status") != GoalStatus.CANCELLED.value:
            return
        if self.owns is not None and not self.owns(event.session_id):
            return
        agent = self.rt.live_agents.get(event.session_id)
        if agent is not None:
            logger.info(
                "goal {} was cancelled on another node: interrupting its running turn", event.data.get("goalId")
            )
            caller = {k: v for k, v in event.data.items() if k in ("uid", "pid", "web")}
            self.rt.spawn(_interrupt(agent, caller))

    async def _question_due(self, goal: Goal) -> None:
        """A waiting goal's question at its deadline: its default answer, or a pause
        (:func:`goals.questions.question_due`)."""
        now = self.clock()
        try:
            done = await self.store.transact(lambda tx: question_due(tx, goal.id, now))
        except (StaleDecision, QuestionClosed):
            self.kick(goal.id)  # answered (or changed) meanwhile: look again from the durable state
            return
        if done is None:
            return
        saved, before = done
        log_change(before, saved)
        await self._sync_guard(saved)
        self._track(saved)

    async def _remind(self, goal: Goal) -> None:
        """Repeat the question a waiting goal waits on to its operator (one notification more)."""
        now = self.clock()
        try:
            saved = await self.store.transact(lambda tx: remind(tx, goal.id, now, self.reminders))
        except StaleDecision:
            self.kick(goal.id)
            return
        if saved is not None:
            self._track(saved)


async def _interrupt(agent: Agent, caller: dict[str, Any]) -> None:
    """Interrupt a goal's running turn for a cancel made on another node (a failure is logged)."""
    try:
        await agent.interrupt(caller=caller)
    except Exception as exc:  # e.g. the lease was lost meanwhile: the new holder repairs the turn
        logger.warning("could not interrupt the cancelled goal's turn in session {}: {}", agent.session_id, exc)
