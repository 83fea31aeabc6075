"""A person's requests to the goal engine: create, read, pause, cancel, resume, edit and delete.

:class:`GoalRequests` is the person-facing half of :class:`~goals.engine.GoalEngine` (which is one):
each request runs its one transaction (:mod:`goals.creation`, :mod:`goals.operations`) and then does
what lives in memory: the goal's spend guard's limits, following the goal and its timers, waking its
evaluation. The engine's own loop (read, decide, fenced commit) stays in :mod:`goals.engine`.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from agent import InvalidInput, NotFound, Runtime, Store, Tx
from goals.approvals import approve_for_goal, revoke_approval
from goals.budgets import guard_limits
from goals.creation import check_workdir, create_goal
from goals.errors import GoalError, InvalidGoal
from goals.locks import CLAIMS
from goals.measure import Fingerprinter
from goals.model import Budgets, Goal, GoalId, GoalSpec, GoalStatus, StopReason, VerifyCommand
from goals.operations import (
    change_status,
    check_edit,
    delete_goal,
    edit_goal,
    log_change,
    log_deleted,
    paused_for,
    resume_goal,
)
from goals.payloads import Caller
from goals.questions import Question, answer_goal, load_question, questions_of
from goals.snapshots import START_MAX_BYTES, Snapshots
from goals.store import goals_of_session, list_goals, load_goal, resolve_goal_id
from goals.tools import GOAL_TOOL_NAMES, goal_policy, goal_tools


class GoalRequests:
    """The engine's person-facing requests (mixed into :class:`~goals.engine.GoalEngine`)."""

    rt: Runtime
    store: Store
    clock: Callable[[], datetime]
    model_check: Callable[[str | None], None] | None
    allowed_roots: list[Path] | None
    fingerprinter: Fingerprinter
    snapshots: Snapshots | None

    if TYPE_CHECKING:  # the engine's, where the goals it follows and their evaluations live

        def kick(self, goal_id: str) -> None: ...

        def _track(self, goal: Goal) -> None: ...

        def _forget(self, goal: Goal) -> None: ...

    async def create(
        self,
        spec: GoalSpec,
        *,
        goal_id: GoalId | None = None,
        caller: Caller | None = None,
        also: Callable[[Tx, Goal], object] | None = None,
        base_commit: str | None = None,
    ) -> Goal:
        """Create a goal; round 1's continuation is enqueued in the same transaction.

        A repeated ``idempotency_key`` returns the goal first created with it. ``caller`` (uid, pid)
        is recorded in the creation's ``goal/changed`` event. ``also`` runs in the creation's
        transaction with the goal (new, or the one its idempotency key found): what it writes
        commits with the goal, and what it raises rolls the creation back and propagates (a
        schedule claims its fire this way).
        """
        if self.model_check is not None:
            self.model_check(spec.model)
        workdir = check_workdir(spec.workdir, self.allowed_roots)
        # The work directory as it is at creation: round 1's progress is measured against it.
        baseline = (await self.fingerprinter.walk(workdir)).known if workdir is not None else None
        goal_id = goal_id or GoalId.new()
        if workdir is not None and self.snapshots is not None:
            # The goal's start, as a checkpoint: what `goald goal diff` compares with and a replay
            # starts from (a goal on a repository starts from its base commit as well).
            bound = None if spec.repo is not None else START_MAX_BYTES
            await asyncio.to_thread(functools.partial(self.snapshots.take, goal_id, "base", workdir, max_bytes=bound))
        now = self.clock()
        policy = goal_policy(spec.tools)

        def run(tx: Tx) -> tuple[Goal, bool]:
            made = create_goal(
                tx,
                spec,
                goal_id=goal_id,
                workdir=workdir,
                baseline=baseline,
                policy=policy,
                now=now,
                caller=caller,
                base_commit=base_commit,
            )
            if also is not None:
                also(tx, made[0])
            return made

        # One claim of a work directory at a time, the sessions' writes going on (goals.locks.CLAIMS).
        goal, created = await self.store.transact(run, named=CLAIMS)
        if created:
            log_change(None, goal)
            self._track(goal)
            await self._attach(goal)
        return goal

    async def get(self, goal_ref: str) -> Goal:
        """A goal by id or unique id prefix."""
        return await self.store.read(lambda conn: load_goal(conn, resolve_goal_id(conn, goal_ref)))

    async def list_goals(
        self, status: GoalStatus | str | None = None, *, schedule_id: str | None = None, since: datetime | None = None
    ) -> list[Goal]:
        """Goals, newest first; optionally of one status, of one schedule, created since a time."""
        wanted = GoalStatus(status) if status is not None else None
        return await self.store.read(lambda conn: list_goals(conn, wanted, schedule_id=schedule_id, since=since))

    async def pause(self, goal_ref: str, reason: str = StopReason.BY_REQUEST, *, caller: Caller | None = None) -> Goal:
        """Pause: a queued continuation is cancelled; a running turn finishes; nothing new starts."""
        return await self._change(goal_ref, GoalStatus.PAUSED, reason, "goal paused", caller)

    async def cancel(self, goal_ref: str, reason: str = StopReason.BY_REQUEST, *, caller: Caller | None = None) -> Goal:
        """Cancel: the queued continuation is cancelled and a running turn is interrupted."""
        goal = await self._change(goal_ref, GoalStatus.CANCELLED, reason, "goal cancelled", caller)
        agent = self.rt.live_agents.get(goal.session_id)
        if agent is not None:
            await agent.interrupt(caller=caller)
        return goal

    async def resume(
        self,
        goal_ref: str,
        budgets: Budgets | None = None,
        *,
        reopen: bool = False,
        caller: Caller | None = None,
    ) -> Goal:
        """Resume a paused or exhausted goal (an exhausted one needs budgets that are not spent).

        ``reopen``: an ended goal (completed, failed, cancelled) may be resumed too, with its own
        budgets (which must not be spent): a person's message to it asked for that explicitly.
        """
        now = self.clock()
        goal, before = await self.store.transact(
            lambda tx: resume_goal(tx, goal_ref, now, budgets=budgets, reopen=reopen, caller=caller)
        )
        log_change(before, goal)
        await self._sync_guard(goal)
        self._track(goal)
        if goal.memory.pending_claim is not None:
            self.kick(goal.id)  # a claim made while paused is decided now (verified at this idle)
        return goal

    async def resume_all(
        self, reason: str | None = None, *, caller: Caller | None = None
    ) -> list[tuple[str, Goal | Exception]]:
        """Resume every paused goal (with ``reason``: only those paused for it, e.g. ``auth_error``
        after a key was fixed; a reason such as ``model_error: ...`` matches ``model_error``).

        Each goal is resumed on its own: one that cannot be (it changed meanwhile) is reported
        with its error and the others go on. Returns ``(goal id, resumed goal or error)``.
        """
        paused = await self.list_goals(GoalStatus.PAUSED)
        out: list[tuple[str, Goal | Exception]] = []
        for goal in sorted(paused, key=lambda g: g.id):
            if not paused_for(goal, reason):
                continue
            try:
                out.append((goal.id, await self.resume(goal.id, caller=caller)))
            except (GoalError, InvalidInput, NotFound) as exc:
                out.append((goal.id, exc))
        return out

    async def answer(
        self,
        goal_ref: str,
        question_id: str | None = None,
        text: str | None = None,
        *,
        option: int | None = None,
        withdraw: bool = False,
        caller: Caller | None = None,
    ) -> tuple[Goal, Question]:
        """Answer the goal's open question (``option``, 1-based, or ``text``), or ``withdraw`` it
        with ``text`` as the reason: the first answer wins, a later one raises
        :class:`~goals.questions.QuestionClosed` naming who answered and when. A waiting goal goes on
        at once with the answer as its next round's message. Returns the goal and the question as
        it was before the answer."""
        now = self.clock()
        how: Literal["answer", "withdrawn"] = "withdrawn" if withdraw else "answer"
        goal, q, before = await self.store.transact(
            lambda tx: answer_goal(tx, goal_ref, question_id, how, text, option, now, caller)
        )
        log_change(before, goal)
        await self._sync_guard(goal)
        self._track(goal)
        return goal, q

    async def revoke(self, goal_ref: str, subject: str | None, *, caller: Caller | None = None) -> Goal:
        """Remove a standing approval of the goal (``subject``; ``None``: every one): the same call
        is asked about again."""
        goal = await self.store.transact(lambda tx: revoke_approval(tx, goal_ref, subject, caller))
        self._track(goal)
        return goal

    async def question(self, question_id: str) -> Question:
        """One question by id (:class:`~goals.questions.QuestionNotFound` when there is none)."""
        return await self.store.read(lambda conn: load_question(conn, question_id))

    async def questions(
        self, goal_ref: str | None = None, *, open_only: bool = False, limit: int = 100
    ) -> list[Question]:
        """Questions goals asked, newest first: of one goal, or of all; only the open ones if asked."""

        def read(conn: Any) -> list[Question]:
            goal_id = resolve_goal_id(conn, goal_ref) if goal_ref is not None else None
            return questions_of(conn, goal_id, open_only=open_only, limit=limit)

        return await self.store.read(read)

    async def delete(self, goal_ref: str) -> tuple[Goal, int]:
        """Delete an ended goal, and its session with the session's events when no other goal ran
        on it; returns the goal as it was and how many sessions went. The work directory stays.

        Raises:
            InvalidGoal: the goal is active or paused (cancel it first).
        """
        goal = await self.get(goal_ref)
        if goal.status.live:
            raise InvalidGoal(f"goal {goal.id} is {goal.status.value}: cancel it before deleting it")
        on_session = await self.store.read(lambda conn: goals_of_session(conn, goal.session_id))
        others = [g for g in on_session if g != goal.id]
        if not others:
            # An ended goal's session is idle; a loaded agent is let go before its rows are.
            await self.rt.unload(goal.session_id)

        sessions = await self.store.transact(lambda tx: delete_goal(tx, goal.id, None if others else goal.session_id))
        self._forget(goal)
        log_deleted(goal, sessions)
        return goal, sessions

    async def update(
        self,
        goal_ref: str,
        *,
        objective: str | None = None,
        title: str | None = None,
        budgets: Budgets | None = None,
        verify: list[VerifyCommand] | None = None,
        progress: VerifyCommand | Literal["unchanged"] | None = "unchanged",
        caller: Caller | None = None,
    ) -> Goal:
        """Edit a goal's objective, title, budgets, verification or progress command (durable; used
        from the next round). ``progress=None`` removes the progress command. What changed (each
        field before and after) and ``caller`` are recorded in a ``goal/edited`` event."""
        now = self.clock()
        check_edit(objective, title)
        goal = await self.store.transact(
            lambda tx: edit_goal(
                tx,
                goal_ref,
                now,
                objective=objective,
                title=title,
                budgets=budgets,
                verify=verify,
                progress=progress,
                caller=caller,
            )
        )
        await self._sync_guard(goal)
        self._track(goal)
        return goal

    async def _change(
        self,
        goal_ref: str,
        status: GoalStatus,
        reason: str,
        cancel_reason: str,
        caller: Caller | None = None,
    ) -> Goal:
        now = self.clock()
        goal, before = await self.store.transact(
            lambda tx: change_status(tx, goal_ref, status, reason, cancel_reason, now, caller)
        )
        log_change(before, goal)
        self._track(goal)
        return goal

    async def _attach(self, goal: Goal) -> None:
        agent = self.rt.live_agents.get(goal.session_id)
        if agent is not None:
            # The session was live before it became the goal's: it takes the goal's policy now.
            policy = goal_policy(goal.tools) or agent.tools.policy
            if policy is not None:
                agent.tools.policy = policy.allowing(*GOAL_TOOL_NAMES)
            agent.add_tools(list(goal_tools()))
            agent.tools.approver = approve_for_goal
            agent.guard = await self.rt.guard(goal.guard_id)

    async def _sync_guard(self, goal: Goal) -> None:
        guard = await self.rt.guard(goal.guard_id)
        guard.limits = guard_limits(goal, self.clock())
