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

The engine is the loop and the transactions around the decision; the parts have their own
modules: reading the interval's events (:mod:`goals.facts`), measuring the work directory and
running the goal's commands (:mod:`goals.measure`), the decision (:mod:`goals.policy`), the
timers (:mod:`goals.timers`) and creating a goal (:mod:`goals.creation`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from loguru import logger

from agent import (
    AgentStatus,
    Event,
    InvalidInput,
    NotFound,
    Runtime,
    SessionId,
    StorageUnavailable,
    Tx,
    is_idle,
    read_events,
    update_guard,
)
from goals.continuation import render
from goals.creation import create_goal
from goals.errors import InvalidGoal, StaleDecision
from goals.facts import interval_facts
from goals.locks import claim_workdir
from goals.measure import Measured, measure
from goals.model import Budgets, Goal, GoalId, GoalSpec, GoalStatus, StopReason, VerifyCommand
from goals.policy import Decision, DecisionKind, PolicyInput, budget_spent, decide, guard_limits
from goals.store import (
    GOAL_VERIFIED,
    MIGRATIONS,
    cancel_continuation,
    continuation_queued,
    emit_changed,
    issue_continuation,
    list_goals,
    live_goals,
    load_goal,
    resolve_goal_id,
    save_goal,
    set_status,
)
from goals.timers import GoalTimers, due_of
from goals.tools import GOAL_TOOL_NAMES, goal_policy, goal_tools
from goals.verify import CommandRunner, fingerprint, run_command

DecisionListener = Callable[[PolicyInput, Decision], None]
#: First and longest wait before a failed evaluation is tried again.
EVAL_RETRY_FIRST = 1.0
EVAL_RETRY_MAX = 30.0
Clock = Callable[[], datetime]


def _utcnow() -> datetime:
    return datetime.now(UTC)


class GoalEngine:
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
        self._sessions: dict[str, str] = {}
        self._timers = GoalTimers(clock, timer_interval, self.kick)
        self._evaluating: set[str] = set()
        self._dirty: set[str] = set()
        #: Failed evaluations in a row, by goal (for the retry's backoff).
        self._failures: dict[str, int] = {}
        self._listeners: list[DecisionListener] = []
        self._remove: Callable[[], None] | None = None
        self._timer_task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()

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
        self._timer_task = self.rt.spawn(self._timers.run())
        if not defer:
            await self.follow_live_goals(decide=resume)

    async def follow_live_goals(self, *, decide: bool = True) -> int:
        """Load and follow every live goal (one whose model is gone fails now), and (``decide``)
        make every active goal's pending decision; returns how many goals are live."""
        goals = [await self._fail_if_faulty(g) for g in await self.store.read(live_goals)]
        for goal in goals:
            self._track(goal)
        if decide:
            await asyncio.gather(*(self._evaluate_loop(g.id) for g in goals if g.status is GoalStatus.ACTIVE))
        return sum(1 for g in goals if g.status.live)

    async def stop(self) -> None:
        """Stop listening and timing; evaluations in flight finish first."""
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
        while self._evaluating:
            self._idle.clear()
            await self._idle.wait()

    @property
    def live_goal_count(self) -> int:
        """How many goals the engine follows (the active and paused ones)."""
        return len(self._sessions)

    def add_decision_listener(self, listener: DecisionListener) -> Callable[[], None]:
        """Observe every committed decision with the inputs it was taken from."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    # -- the public API --------------------------------------------------------------------

    async def create(self, spec: GoalSpec, *, goal_id: GoalId | None = None) -> Goal:
        """Create a goal; round 1's continuation is enqueued in the same transaction.

        A repeated ``idempotency_key`` returns the goal first created with it.
        """
        if self.model_check is not None:
            self.model_check(spec.model)
        workdir = self._check_workdir(spec.workdir)
        # The work directory as it is at creation: round 1's progress is measured against it.
        baseline = await asyncio.to_thread(fingerprint, workdir) if workdir is not None else None
        now = self.clock()
        goal_id = goal_id or GoalId.new()
        policy = goal_policy(spec.tools)

        goal, created = await self.store.transact(
            lambda tx: create_goal(
                tx, spec, goal_id=goal_id, workdir=workdir, baseline=baseline, policy=policy, now=now
            )
        )
        if created:
            self._track(goal)
            await self._attach(goal)
        return goal

    async def get(self, goal_ref: str) -> Goal:
        """A goal by id or unique id prefix."""
        return await self.store.read(lambda conn: load_goal(conn, resolve_goal_id(conn, goal_ref)))

    async def list_goals(self, status: GoalStatus | str | None = None) -> list[Goal]:
        """Goals, newest first, optionally of one status."""
        wanted = GoalStatus(status) if status is not None else None
        return await self.store.read(lambda conn: list_goals(conn, wanted))

    async def pause(self, goal_ref: str, reason: str = StopReason.BY_REQUEST) -> Goal:
        """Pause: a queued continuation is cancelled; a running turn finishes; nothing new starts."""
        return await self._change(goal_ref, GoalStatus.PAUSED, reason, "goal paused")

    async def cancel(self, goal_ref: str, reason: str = "cancelled by request") -> Goal:
        """Cancel: the queued continuation is cancelled and a running turn is interrupted."""
        goal = await self._change(goal_ref, GoalStatus.CANCELLED, reason, "goal cancelled")
        agent = self.rt.live_agents.get(goal.session_id)
        if agent is not None:
            await agent.interrupt()
        return goal

    async def resume(self, goal_ref: str, budgets: Budgets | None = None, *, reopen: bool = False) -> Goal:
        """Resume a paused or exhausted goal (an exhausted one needs budgets that are not spent).

        ``reopen``: an ended goal (completed, failed, cancelled) may be resumed too, with its own
        budgets (which must not be spent): a person's message to it asked for that explicitly.
        """
        now = self.clock()

        def run(tx: Tx) -> Goal:
            goal = load_goal(tx, resolve_goal_id(tx.conn, goal_ref))
            before = goal.status
            st = tx.state(goal.session_id)
            if before is GoalStatus.PAUSED and st.status is AgentStatus.IDLE and st.last_seq > goal.evaluated_seq:
                # The session went idle after the pause, and the engine has not counted that interval
                # yet: count it here (the paused goal's bookkeeping), so a round that ran is counted
                # once and the next continuation gets the next number.
                events = read_events(tx.conn, goal.session_id, goal.evaluated_seq, limit=1_000_000, upto=st.last_seq)
                goal = decide(PolicyInput(goal, interval_facts(goal, events, st.last_seq), now)).goal
            if budgets is not None:
                goal = goal.model_copy(update={"budgets": budgets})
            if before is GoalStatus.EXHAUSTED or (reopen and not before.live):
                spent = budget_spent(goal, now)
                if spent is not None:
                    raise InvalidGoal(f"the goal is still out of budget ({spent.value}): raise that budget to resume")
                # An ended goal let go of its work directory; another may have taken it since.
                claim_workdir(tx, goal)
            goal = set_status(tx, goal, GoalStatus.ACTIVE, None, now, reopen=reopen)
            goal = goal.model_copy(
                update={
                    "stall_streak": 0,
                    "error_streak": 0,
                    "blocked_streak": 0,
                    "refused_claims": 0,
                    "not_before": None,
                    "memory": goal.memory.model_copy(update={"warned_stall": False}),
                }
            )
            pending = goal.memory.pending_claim is not None
            if st.status is AgentStatus.IDLE and not continuation_queued(tx, goal) and not pending:
                goal = issue_continuation(tx, goal, goal.rounds + 1, render(goal, goal.rounds + 1, now))
            update_guard(tx, goal.guard_id, guard_limits(goal, now))
            saved = save_goal(tx, goal, goal.revision)
            emit_changed(tx, before, saved)
            return saved

        goal = await self.store.transact(run)
        await self._sync_guard(goal)
        self._track(goal)
        if goal.memory.pending_claim is not None:
            self.kick(goal.id)  # a claim made while paused is decided now (verified at this idle)
        return goal

    async def update(
        self,
        goal_ref: str,
        *,
        objective: str | None = None,
        title: str | None = None,
        budgets: Budgets | None = None,
        verify: list[VerifyCommand] | None = None,
        progress: VerifyCommand | Literal["unchanged"] | None = "unchanged",
    ) -> Goal:
        """Edit a goal's objective, title, budgets, verification or progress command (durable; used
        from the next round). ``progress=None`` removes the progress command."""
        now = self.clock()
        if objective is not None and not objective.strip():
            raise InvalidGoal("objective must not be empty: say what the goal should achieve")
        if title is not None and not title.strip():
            raise InvalidGoal("title must not be blank: give a title, or none to use the objective's first line")

        def run(tx: Tx) -> Goal:
            goal = load_goal(tx, resolve_goal_id(tx.conn, goal_ref))
            changes: dict[str, Any] = {}
            if objective is not None:
                changes["objective"] = objective
            if title is not None:
                changes["title"] = title
            if budgets is not None:
                changes["budgets"] = budgets
            if verify is not None:
                changes["verify"] = verify
            if progress != "unchanged":
                if progress is not None and not goal.workdir:
                    raise InvalidGoal("a progress command needs a work directory: this goal has none to run it in")
                changes["progress"] = progress
            goal = goal.model_copy(update=changes)
            update_guard(tx, goal.guard_id, guard_limits(goal, now))
            return save_goal(tx, goal, goal.revision)

        goal = await self.store.transact(run)
        await self._sync_guard(goal)
        self._track(goal)
        return goal

    # -- evaluation ------------------------------------------------------------------------

    def kick(self, goal_id: str) -> None:
        """Ask for an evaluation of ``goal_id`` (coalesced with one in flight)."""
        if goal_id in self._evaluating:
            self._dirty.add(goal_id)
            return
        self.rt.spawn(self._evaluate_loop(goal_id))

    async def _evaluate_loop(self, goal_id: str) -> None:
        if goal_id in self._evaluating:
            self._dirty.add(goal_id)
            return
        self._evaluating.add(goal_id)
        self._idle.clear()
        try:
            again = True
            while again:
                self._dirty.discard(goal_id)
                try:
                    again = await self.evaluate(goal_id) == "stale"
                except StorageUnavailable as exc:
                    # The store logged the failure once; the retry's timer is in memory only.
                    logger.warning("goal {}: the decision was not committed ({}); it is retried", goal_id, exc)
                    await self._retry_later(goal_id)
                    again = False
                except Exception:
                    logger.exception("evaluating goal {} failed; it is retried", goal_id)
                    await self._retry_later(goal_id)
                    again = False
                else:
                    self._failures.pop(goal_id, None)
                again = again or goal_id in self._dirty
        finally:
            self._evaluating.discard(goal_id)
            if not self._evaluating:
                self._idle.set()

    async def _retry_later(self, goal_id: str) -> None:
        """After a failed evaluation: evaluate again after a backoff, like any idle not yet decided.

        The retry's time is made durable as the goal's ``not_before`` (so a restart, which
        re-evaluates every active goal, keeps the backoff) when the store can write; the in-memory
        timer covers the retry either way. A goal is thus never left ``active`` with nothing
        queued, nothing running and no timer set.
        """
        failures = self._failures[goal_id] = self._failures.get(goal_id, 0) + 1
        delay = min(EVAL_RETRY_MAX, EVAL_RETRY_FIRST * 2 ** (failures - 1))
        due = self.clock() + timedelta(seconds=delay)

        def run(tx: Tx) -> None:
            goal = load_goal(tx, goal_id)
            if goal.status is GoalStatus.ACTIVE and (goal.not_before is None or goal.not_before < due):
                save_goal(tx, goal.model_copy(update={"not_before": due}), goal.revision)

        try:
            await self.store.transact(run)
        except Exception as exc:  # the store cannot write (or the goal is gone): the timer below
            logger.debug("goal {}: the retry's timer is in memory only ({})", goal_id, exc)
        if goal_id in self._sessions.values():
            self._timers.no_later_than(goal_id, due)
        logger.info("goal {}: evaluation failed {} time(s) in a row; retrying in {:.0f}s", goal_id, failures, delay)

    async def evaluate(self, goal_id: str) -> Decision | str | None:
        """Decide for one goal at its session's current idle; returns the decision, "stale" or ``None``."""
        goal = await self.store.read(lambda conn: load_goal(conn, goal_id))
        if not goal.status.live:
            self._forget(goal)
            return None
        st = await self.store.session_state(goal.session_id)
        if st.status is not AgentStatus.IDLE or st.open_turn is not None:
            return None
        events = await self.store.events_after(goal.session_id, goal.evaluated_seq, limit=1_000_000, upto=st.last_seq)
        interval = interval_facts(goal, events, st.last_seq)
        now = self.clock()
        measured = await measure(goal, interval, self._runner(goal))
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
        )
        decision = decide(inp)
        if decision.kind is DecisionKind.NOTHING:
            return decision
        try:
            saved = await self.store.transact(lambda tx: _commit(tx, goal, st.status_seq, decision, measured))
        except StaleDecision:
            return "stale" if (await self.store.session_state(goal.session_id)).status is AgentStatus.IDLE else None
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

    async def _change(self, goal_ref: str, status: GoalStatus, reason: str, cancel_reason: str) -> Goal:
        now = self.clock()

        def run(tx: Tx) -> Goal:
            goal = load_goal(tx, resolve_goal_id(tx.conn, goal_ref))
            before = goal.status
            goal = set_status(tx, goal, status, reason, now)
            cancel_continuation(tx, goal, cancel_reason)
            saved = save_goal(tx, goal, goal.revision)
            emit_changed(tx, before, saved)
            return saved

        goal = await self.store.transact(run)
        self._track(goal)
        return goal

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

    def _check_workdir(self, raw: str | None) -> Path | None:
        if raw is None:
            return None
        path = Path(raw).expanduser()
        if not path.is_absolute():
            raise InvalidGoal(f"workdir {raw!r} must be an absolute path: give the full path")
        path = path.resolve()
        if self.allowed_roots is not None and not any(
            path == root.resolve() or path.is_relative_to(root.resolve()) for root in self.allowed_roots
        ):
            roots = ", ".join(str(r) for r in self.allowed_roots) or "none configured"
            raise InvalidGoal(f"workdir {raw!r} is outside the allowed work-directory roots ({roots})")
        if not path.is_dir():
            raise InvalidGoal(f"workdir {raw!r} does not exist or is not a directory: create it first")
        return path

    async def _attach(self, goal: Goal) -> None:
        agent = self.rt.live_agents.get(goal.session_id)
        if agent is not None:
            # The session was live before it became the goal's: it takes the goal's policy now.
            policy = goal_policy(goal.tools) or agent.tools.policy
            if policy is not None:
                agent.tools.policy = policy.allowing(*GOAL_TOOL_NAMES)
            agent.add_tools(list(goal_tools()))
            agent.guard = await self.rt.guard(goal.guard_id)

    async def _sync_guard(self, goal: Goal) -> None:
        guard = await self.rt.guard(goal.guard_id)
        guard.limits = guard_limits(goal, self.clock())

    def _track(self, goal: Goal) -> None:
        if goal.status.live:
            self._sessions[goal.session_id] = goal.id
        else:
            self._forget(goal)
            return
        self._timers.set(goal.id, due_of(goal))

    def _forget(self, goal: Goal) -> None:
        if self._sessions.get(goal.session_id) == goal.id:
            del self._sessions[goal.session_id]
        self._timers.drop(goal.id)

    def _on_event(self, event: Event) -> None:
        if not is_idle(event):
            return
        goal_id = self._sessions.get(event.session_id)
        if goal_id is not None:
            self.kick(goal_id)


def _commit(tx: Tx, goal: Goal, status_seq: int, decision: Decision, measured: Measured) -> Goal:
    """Write ``decision`` for ``goal`` (with the verification's record and any continuation) if its
    session is still at the idle it was taken at (``status_seq``).

    Raises:
        StaleDecision: the session has moved on since; nothing is written.
    """
    cur = tx.state(goal.session_id)
    if cur.status is not AgentStatus.IDLE or cur.status_seq != status_seq or cur.open_turn is not None:
        raise StaleDecision("the session is no longer at that idle")
    new = decision.goal
    verification = measured.verification
    if verification is not None:
        tx.emit(
            goal.session_id,
            GOAL_VERIFIED,
            {
                "goalId": goal.id,
                "passed": all(r.passed for r in verification),
                "reused": measured.verification_reused,
                "results": [r.model_dump(mode="json") for r in verification],
            },
        )
    if decision.continuation is not None and decision.round is not None:
        new = issue_continuation(tx, new, decision.round, decision.continuation)
    saved = save_goal(tx, new, goal.revision)
    emit_changed(tx, goal.status, saved)
    return saved


__all__ = [
    "GoalEngine",
    "guard_limits",
]
_ = (NotFound, SessionId)
