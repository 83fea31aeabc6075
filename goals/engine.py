"""The goal engine: advances each goal at whole-agent idle of its session, from durable state.

It listens for committed ``status: idle`` events of goal sessions (never ``turn/end``) and for
durable timers falling due (``not_before`` after a model error, the deadline, the end of the wall
time) while the session is idle. For one goal at a time it reads the goal row and the session's
events in ``(evaluated_seq, latest]``, measures the work directory and runs the verification
commands when the agent claimed completion, asks the pure :func:`goals.policy.decide`, and commits
the decision, the cursor, the counters and any continuation in **one** transaction, and only if
that idle is still the session's latest status and nobody changed the goal meanwhile. A stale
decision writes nothing; the next idle (or a re-read) decides again. The goal recognizes its own
continuation by ``MessageId`` only; it never reads the outcome of a turn for its message.

An evaluation that fails (the store cannot write, a verification runner breaks) is retried with
backoff from the durable state, like any idle not yet decided, until it commits: its timer is the
goal's durable ``not_before`` when the store can write it, an in-memory timer when it cannot, and
at start the engine evaluates every active goal anyway, so no goal sits ``active`` with nothing
queued, nothing running and no timer set.

While the daemon says no goal may go on (``hold``: the disk holding the store is nearly full), a
goal at its idle waits, active, with the reason (:attr:`GoalEngine.held`): nothing is decided or
counted, no command runs, and it is looked at again every few seconds; only its disk limit is
judged meanwhile (a work directory over it pauses the goal ``disk_limit``: the remedy).

The engine is the loop and the transactions around the decision; the parts have their own
modules: reading the interval's events (:mod:`goals.facts`), measuring the work directory and
running the goal's commands (:mod:`goals.measure`), the decision (:mod:`goals.policy`), the
timers (:mod:`goals.timers`), running evaluations one at a time per goal with their retries
(:mod:`goals.evaluations`), creating a goal (:mod:`goals.creation`) and a person's changes to it
(:mod:`goals.operations`: the transactions behind pause, resume, cancel, edit and delete). The
engine's class is made of three by concern: the person-facing requests (:mod:`goals.requests`),
which goals it follows with their timers and wake-ups (:mod:`goals.following`), and here its
lifecycle and the evaluation: read, decide, fenced commit.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from loguru import logger

from agent import AgentStatus, InvalidInput, Runtime, Tx
from goals.budgets import time_ends
from goals.committing import commit_decision
from goals.decision import Decision, DecisionKind, PolicyInput
from goals.errors import GoalError, StaleDecision
from goals.evaluations import EvaluationRuns
from goals.facts import interval_facts
from goals.fingerprint_limits import FingerprintLimits, WalkStopped
from goals.following import GoalFollowing, Round
from goals.measure import Fingerprinter, measure
from goals.model import Goal, GoalStatus
from goals.operations import log_change
from goals.policy import decide, disk_over
from goals.queries import round_of
from goals.requests import GoalRequests
from goals.snapshots import Snapshots
from goals.store import (
    MIGRATIONS,
    live_goals,
    load_goal,
    save_goal,
)
from goals.timers import GoalTimers, Reminders, next_reminder
from goals.verify import CommandRunner, run_command, within

#: How often a goal held back (:attr:`GoalEngine.hold`) is looked at again, in seconds.
HOLD_RECHECK_SECONDS = 5.0

DecisionListener = Callable[[PolicyInput, Decision], None]
Clock = Callable[[], datetime]


def _utcnow() -> datetime:
    return datetime.now(UTC)


class GoalEngine(GoalRequests, GoalFollowing):
    """Goals over a :class:`~agent.Runtime`. Use ``async with GoalEngine.running(rt) as engine``."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        runner: CommandRunner = run_command,
        clock: Clock = _utcnow,
        timer_interval: float = 1.0,
        model_check: Callable[[str | None], None] | None = None,
        allowed_roots: list[Path] | None = None,
        runner_for: Callable[[Goal], CommandRunner] | None = None,
        fingerprint_limits: FingerprintLimits | None = None,
        disk_limit_for: Callable[[Goal], int | None] | None = None,
        hold: Callable[[], str | None] | None = None,
        reminders: Reminders | None = None,
        snapshots: Snapshots | None = None,
    ) -> None:
        self.rt = runtime
        self.store = runtime.store
        self.runner = runner
        #: The runner of one goal's verification and progress commands (the daemon's: in that goal's
        #: sandbox, under its network setting, secrets, extra paths and limits); else ``runner``.
        self.runner_for = runner_for
        self.clock = clock
        self.model_check = model_check
        self.allowed_roots = allowed_roots
        #: The work-directory walks, bounded (bytes, seconds) and stopped with the engine.
        self.fingerprinter = Fingerprinter(fingerprint_limits)
        #: A goal's disk limit in bytes (the daemon's: its sandbox settings merged with the config's);
        #: else the goal's own ``sandbox.max_disk_mb``.
        self.disk_limit_for = disk_limit_for
        #: Why no goal may go on now, if so (the daemon's: the disk holding the store is nearly full).
        #: A goal at its idle then waits (active, nothing counted) and is looked at again every
        #: :data:`HOLD_RECHECK_SECONDS`; only its disk limit is judged meanwhile.
        self.hold = hold
        #: How a waiting goal's question is repeated to its operator (``None``: it is told once).
        self.reminders = reminders
        #: Where a goal on a repository records its start and each round's tree (``None``: nowhere).
        self.snapshots = snapshots
        #: The goals waiting for :attr:`hold`, with the reason (shown with their activity).
        self.held: dict[str, str] = {}
        self._sessions: dict[str, str] = {}
        self._followed: dict[str, str] = {}
        self._at_idle: dict[str, Round] = {}
        self._timers = GoalTimers(clock, timer_interval, self.kick)
        self._runs = EvaluationRuns(runtime.spawn, self._evaluate_once, self._retry_later)
        self._listeners: list[DecisionListener] = []
        self._remove: Callable[[], None] | None = None
        self._timer_task: asyncio.Task[None] | None = None
        #: In a cluster: whether this node holds a session's lease. The engine follows, times and
        #: decides only the goals of sessions it holds (``None``: every goal is this process's).
        self.owns: Callable[[str], bool] | None = None

    # -- lifecycle -------------------------------------------------------------------------

    @classmethod
    @contextlib.asynccontextmanager
    async def running(cls, runtime: Runtime, **kw: Any) -> AsyncIterator[GoalEngine]:
        """Start the engine (every live goal's pending decision is made before this yields)."""
        engine = cls(runtime, **kw)
        await engine.start()
        try:
            yield engine
        finally:
            await engine.stop()

    async def start(self, resume: bool = True, *, defer: bool = False) -> None:
        """Listen for idles, load live goals, and (``resume``) make every pending decision now.

        With ``defer`` nothing is done per goal here: :meth:`follow_live_goals` loads the live goals and
        makes their pending decisions later (a daemon calls it once it serves, so that its
        readiness does not wait on the number of goals). An idle that lands before then is
        decided by that evaluation, which reads the durable state.
        """
        await self.store.migrate("goals", MIGRATIONS)
        self._remove = self.store.hub.add_listener(self._on_event)
        self.store.at_idle = self._idle_read  # an idle's commit reads what its evaluation needs
        self.rt.watchers.append(self.follows)
        self._timer_task = self.rt.spawn(self._timers.run())
        if not defer:
            await self.follow_live_goals(decide=resume)

    async def follow_live_goals(self, *, decide: bool = True) -> int:
        """Load and follow every live goal (one whose model is gone fails now), and (``decide``)
        make every active goal's pending decision; returns how many goals are live."""
        goals = [g for g in await self.store.read(live_goals) if self.owns is None or self.owns(g.session_id)]
        goals = [await self._fail_if_faulty(g) for g in goals]
        for goal in goals:
            self._track(goal)
        if decide:
            await asyncio.gather(*(self._runs.run(g.id) for g in goals if g.status is GoalStatus.ACTIVE))
        return sum(1 for g in goals if g.status.live)

    async def stop(self) -> None:
        """Stop listening and timing; evaluations in flight finish first, except a work-directory
        walk: it is stopped, and its evaluation decides nothing (the next start decides that idle)."""
        self.fingerprinter.stop()
        if self.store.at_idle == self._idle_read:
            self.store.at_idle = None
        if self._remove is not None:
            self._remove()
            self._remove = None
        if self._timer_task is not None:
            self._timer_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer_task
        await self.settled()

    async def settled(self) -> None:
        """Wait until no evaluation is running."""
        await self._runs.settled()

    def add_decision_listener(self, listener: DecisionListener) -> Callable[[], None]:
        """Observe every committed decision with the inputs it was taken from."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    # -- evaluation ------------------------------------------------------------------------

    def kick(self, goal_id: str) -> None:
        """Ask for an evaluation of ``goal_id`` (coalesced with one in flight: :mod:`goals.evaluations`)."""
        self._runs.kick(goal_id)

    async def _evaluate_once(self, goal_id: str) -> bool:
        return await self.evaluate(goal_id) == "stale"

    async def _retry_later(self, goal_id: str, failures: int, delay: float) -> None:
        """After a failed evaluation: evaluate again after a backoff, like any idle not yet decided.

        The retry's time is made durable as the goal's ``not_before`` (so a restart, which
        re-evaluates every active goal, keeps the backoff) when the store can write; the in-memory
        timer covers the retry either way. A goal is thus never left ``active`` with nothing
        queued, nothing running and no timer set.
        """
        due = self.clock() + timedelta(seconds=delay)

        def run(tx: Tx) -> None:
            goal = load_goal(tx, goal_id)
            if goal.status is GoalStatus.ACTIVE and (goal.not_before is None or goal.not_before < due):
                save_goal(tx, goal.model_copy(update={"not_before": due}), goal.revision)

        try:
            await self.store.transact(run)
        except Exception as exc:  # the store cannot write (or the goal is gone): the timer below
            logger.debug("goal {}: the retry's timer is in memory only ({})", goal_id, exc)
        if goal_id in self._followed:
            self._timers.no_later_than(goal_id, due)
        logger.info("goal {}: evaluation failed {} time(s) in a row; retrying in {:.0f}s", goal_id, failures, delay)

    async def evaluate(self, goal_id: str) -> Decision | str | None:
        """Decide for one goal at its session's current idle; returns the decision, "stale" or ``None``."""
        # The goal, its session's state and the round's events: as read with the commit of the idle
        # (GoalFollowing._idle_read) when that idle is still the last, else in one hop to the store
        # thread and one snapshot; only the events after the last evaluation are read.
        sid = self._session_of(goal_id)
        got = self._read_at_idle(goal_id, sid) if sid is not None else None
        if got is None:
            got = await self.store.transact(lambda tx: round_of(tx, goal_id, sid), session=sid)
        goal, st, events = got
        if not goal.status.live or (self.owns is not None and not self.owns(goal.session_id)):
            self._forget(goal)
            return None
        if st.status is not AgentStatus.IDLE or st.open_turn is not None:
            return None
        if goal.status is GoalStatus.WAITING and (q := goal.memory.question) is not None:
            if self.clock() >= q.deadline:
                await self._question_due(goal)
                return None
            if (remind := next_reminder(goal, self.reminders)) is not None and self.clock() >= remind:
                await self._remind(goal)
                return None
        interval = interval_facts(goal, events, st.last_seq)
        if goal.status is GoalStatus.ACTIVE and self.hold is not None and (why := self.hold()) is not None:
            await self._held_back(goal, why)
            return None
        if self.held.pop(goal.id, None) is not None:
            logger.info("goal {}: goes on (what held it back has cleared)", goal.id)
        now = self.clock()
        runner = self._runner(goal)
        if (ends := time_ends(goal)) is not None:  # no command runs past the goal's time
            runner = within(runner, (ends - now).total_seconds())
        try:
            measured = await measure(goal, interval, runner, self.fingerprinter)
        except WalkStopped:
            return None  # the engine is stopping: the next start decides this idle
        now = self.clock()  # after the commands: the time they took counts (and may spend the budget)
        if ends is not None and measured.out_of_time:
            now = max(now, ends)  # a command the goal's time stopped: that time is spent, whatever the clocks
        inp = PolicyInput(
            goal,
            interval,
            now,
            fingerprint=measured.fingerprint,
            workdir_exists=measured.workdir_exists,
            verification=measured.verification,
            verification_reused=measured.verification_reused,
            fault=self._fault(goal),
            progress=measured.progress,
            disk_bytes=measured.walk.disk_bytes if measured.walk is not None and measured.workdir_exists else None,
            disk_limit=self._disk_limit(goal),
        )
        decision = decide(inp)
        if decision.kind is DecisionKind.NOTHING:
            return decision
        await self._checkpoint(goal, decision.goal.rounds, final=decision.kind is DecisionKind.COMPLETE)
        try:
            saved = await commit_decision(self.rt, goal, st.status_seq, decision, measured)
        except StaleDecision:
            return "stale" if (await self.store.session_state(goal.session_id)).status is AgentStatus.IDLE else None
        log_change(goal.status, saved)
        for listener in list(self._listeners):
            try:
                listener(inp, decision)
            except Exception:
                logger.exception("decision listener failed")
        if saved.status is not goal.status or saved.budgets != goal.budgets:
            await self._sync_guard(saved)
        self._track(saved)
        return decision

    # -- internals -------------------------------------------------------------------------

    async def _checkpoint(self, goal: Goal, rounds: int, *, final: bool = False) -> None:
        """Record the tree of a goal on a repository at the idle that ends round ``rounds``, before
        the decision commits (nothing of the goal runs now); a checkpoint taken for a decision that
        turns out stale is taken again, over it, at the next idle. A goal that completes is recorded
        even when its last interval counted no round (one the infrastructure cut short): its last
        round's checkpoint then holds the final tree."""
        if self.snapshots is None or goal.repo is None or goal.workdir is None:
            return
        if rounds <= goal.rounds and not final:
            return
        try:
            await asyncio.to_thread(self.snapshots.take, goal.id, f"round-{rounds}", Path(goal.workdir))
        except OSError as exc:  # the state directory's disk: the goal goes on, its diff misses a round
            logger.warning("goal {}: round {}'s checkpoint was not recorded: {}", goal.id, rounds, exc)

    def _disk_limit(self, goal: Goal) -> int | None:
        """``goal``'s disk limit in bytes (``None``: none)."""
        if self.disk_limit_for is not None:
            return self.disk_limit_for(goal)
        mb = goal.sandbox.max_disk_mb
        return mb * 1024 * 1024 if mb is not None else None

    async def _held_back(self, goal: Goal, why: str) -> None:
        """The idle of an active goal while :attr:`hold` says no goal may go on: nothing is decided or
        counted (the interval is read whole later), except that a work directory over the goal's disk
        limit pauses it now (the remedy, whatever else holds). Looked at again in a few seconds."""
        disk = None
        if goal.workdir:
            try:
                walked = await self.fingerprinter.walk(Path(goal.workdir))
            except WalkStopped:
                return
            disk = walked.stats.disk_bytes if walked.digest is not None else None
        reason = disk_over(disk, self._disk_limit(goal))
        if reason is not None:
            self.held.pop(goal.id, None)
            with contextlib.suppress(GoalError):  # a person changed it meanwhile: theirs stands
                await self._change(goal.id, GoalStatus.PAUSED, reason, "goal paused")
            return
        if self.held.get(goal.id) != why:
            logger.warning("goal {}: waits: {}", goal.id, why)
        self.held[goal.id] = why
        self._timers.no_later_than(goal.id, self.clock() + timedelta(seconds=HOLD_RECHECK_SECONDS))

    def _runner(self, goal: Goal) -> CommandRunner:
        """Where ``goal``'s verification and progress commands run."""
        return self.runner_for(goal) if self.runner_for is not None else self.runner

    def _fault(self, goal: Goal) -> str | None:
        """An unrecoverable fault of the goal's setup, if any."""
        if self.model_check is not None:
            try:
                self.model_check(goal.model)
            except InvalidInput as exc:
                return f"unknown model: {exc}"
        return None

    async def _fail_if_faulty(self, goal: Goal) -> Goal:
        """At start: a live goal whose model is gone fails now (its queued continuation is cancelled),
        since its session could never run a turn to reach the next idle."""
        fault = self._fault(goal)
        if fault is None:
            return goal
        logger.error("goal {} failed: {}", goal.id, fault)
        return await self._change(goal.id, GoalStatus.FAILED, fault, "goal failed")


__all__ = ["GoalEngine"]
