"""The ``goal/*`` methods: create, list, get, pause, resume, cancel and update goals."""

from __future__ import annotations

import contextlib
import os
from typing import TypedDict

from daemon.rpc.context import HostPort, checked_sandbox, engine, runtime, taking_work
from daemon.rpc.params import GoalCreate, GoalList, GoalRef, GoalResume, GoalUpdate
from daemon.rpc.protocol import Dispatcher, Peer
from daemon.rpc.views import JsonObject, goal_view
from goals import Budgets, GoalId, GoalSpec, SandboxSpec, StopRules, VerifyCommand


class GoalCreated(TypedDict):
    """``goal/create``'s answer."""

    goalId: str
    sessionId: str
    workdir: str | None


class GoalListing(TypedDict):
    """``goal/list``'s answer."""

    goals: list[JsonObject]


def register(d: Dispatcher, host: HostPort) -> None:
    """Add the ``goal/*`` methods to ``d``."""

    @d.method("goal/create", GoalCreate)
    async def goal_create(p: GoalCreate, peer: Peer) -> GoalCreated:
        taking_work(host)
        eng = engine(host)
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
            workdir = host.workdirs.resolve(p.workdir, goal_id)
            spec = spec.model_copy(update={"workdir": str(workdir)})
        elif (row := await runtime(host).session(p.session_id)).workdir is not None:
            # A goal on an existing session works, and is verified, in that session's directory
            # (without one, its verification commands would have nowhere to run).
            spec = spec.model_copy(update={"workdir": str(host.workdirs.resolve(row.workdir, goal_id))})
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
    async def goal_list(p: GoalList, peer: Peer) -> GoalListing:
        goals = await engine(host).list_goals(p.status)
        return {"goals": [goal_view(g) for g in goals]}

    @d.method("goal/get", GoalRef)
    async def goal_get(p: GoalRef, peer: Peer) -> JsonObject:
        return goal_view(await engine(host).get(p.goal_id))

    @d.method("goal/pause", GoalRef)
    async def goal_pause(p: GoalRef, peer: Peer) -> JsonObject:
        return goal_view(await engine(host).pause(p.goal_id))

    @d.method("goal/resume", GoalResume)
    async def goal_resume(p: GoalResume, peer: Peer) -> JsonObject:
        taking_work(host)
        budgets = p.budgets.to_budgets() if p.budgets else None
        return goal_view(await engine(host).resume(p.goal_id, budgets))

    @d.method("goal/cancel", GoalRef)
    async def goal_cancel(p: GoalRef, peer: Peer) -> JsonObject:
        return goal_view(await engine(host).cancel(p.goal_id))

    @d.method("goal/update", GoalUpdate)
    async def goal_update(p: GoalUpdate, peer: Peer) -> JsonObject:
        goal = await engine(host).update(
            p.goal_id,
            objective=p.objective,
            title=p.title,
            budgets=p.budgets.to_budgets() if p.budgets else None,
            verify=[VerifyCommand.model_validate(v.model_dump()) for v in p.verify] if p.verify is not None else None,
        )
        return goal_view(goal)
