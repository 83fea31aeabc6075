"""The ``schedule/*`` methods: add (or update by key), list, remove, suspend, resume, run now, and a
schedule's runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

from daemon.checks import check_goal_input, one_call_warning
from daemon.rpc.context import HostPort, checked_sandbox, scheduler, taking_work
from daemon.rpc.params import ScheduleAdd, ScheduleRef, ScheduleRuns
from daemon.rpc.protocol import Dispatcher, Peer
from daemon.rpc.views import JsonObject
from daemon.schedule.model import ScheduleSpec
from goals import Budgets, SandboxSpec


class ScheduleListing(TypedDict):
    """``schedule/list``'s answer."""

    schedules: list[JsonObject]


class RunListing(TypedDict):
    """``schedule/runs``'s answer."""

    runs: list[JsonObject]


class ResumeAnswer(TypedDict):
    """``schedule/resume``'s answer: the schedule, and the run its misfire policy fired (or null)."""

    schedule: JsonObject
    run: JsonObject | None


def checked_goal(host: HostPort, goal: Mapping[str, Any]) -> None:
    """Refuse a schedule whose goal could not run (model, commands, cost cap): now, naming the
    field (``goal.model``...), rather than as an error recorded at every fire.

    Raises:
        InvalidField: nothing was written.
    """
    verify = goal.get("verify") or []
    progress = goal.get("progress")
    budgets = goal.get("budgets") or {}
    commands = [(f"verify[{i}].cmd", str(v.get("cmd", ""))) for i, v in enumerate(verify) if isinstance(v, Mapping)]
    if isinstance(progress, Mapping):
        commands.append(("progress.cmd", str(progress.get("cmd", ""))))
    cap = budgets.get("max_cost", budgets.get("maxCost")) if isinstance(budgets, Mapping) else None
    check_goal_input(
        host.settings,
        host.models,
        model=goal.get("model") or host.settings.default_model,
        commands=commands,
        max_cost=cap,
        prefix="goal.",
    )


def register(d: Dispatcher, host: HostPort) -> None:
    """Add the ``schedule/*`` methods to ``d``."""

    @d.method("schedule/add", ScheduleAdd)
    async def schedule_add(p: ScheduleAdd, peer: Peer) -> JsonObject:
        taking_work(host)
        spec = ScheduleSpec.parse(p.model_dump())
        checked_goal(host, spec.goal)
        checked_sandbox(host, SandboxSpec.model_validate(spec.goal.get("sandbox") or {}))
        schedule = await scheduler(host).add(spec)
        g = spec.goal
        warning = one_call_warning(
            host.models,
            g.get("model") or host.settings.default_model,
            str(g.get("objective", "")),
            Budgets.model_validate(g.get("budgets") or {}),
        )
        return {**schedule.public(), "warnings": [warning] if warning is not None else []}

    @d.method("schedule/list")
    async def schedule_list(peer: Peer) -> ScheduleListing:
        return {"schedules": [s.public() for s in await scheduler(host).list()]}

    @d.method("schedule/remove", ScheduleRef)
    async def schedule_remove(p: ScheduleRef, peer: Peer) -> JsonObject:
        removed = await scheduler(host).remove(p.schedule_id)
        return dict(removed.public())

    @d.method("schedule/suspend", ScheduleRef)
    async def schedule_suspend(p: ScheduleRef, peer: Peer) -> JsonObject:
        return dict((await scheduler(host).suspend(p.schedule_id)).public())

    @d.method("schedule/resume", ScheduleRef)
    async def schedule_resume(p: ScheduleRef, peer: Peer) -> ResumeAnswer:
        schedule, run = await scheduler(host).resume(p.schedule_id)
        return {"schedule": schedule.public(), "run": run.public() if run is not None else None}

    @d.method("schedule/run", ScheduleRef)
    async def schedule_run(p: ScheduleRef, peer: Peer) -> JsonObject:
        taking_work(host)
        return dict((await scheduler(host).run_now(p.schedule_id)).public())

    @d.method("schedule/runs", ScheduleRuns)
    async def schedule_runs(p: ScheduleRuns, peer: Peer) -> RunListing:
        runs = await scheduler(host).runs(p.schedule_id, p.limit)
        return {"runs": [r.public() for r in runs]}
