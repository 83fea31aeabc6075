"""The ``schedule/*`` methods: add (or update by key), list, remove, and a schedule's runs."""

from __future__ import annotations

from typing import TypedDict

from daemon.rpc.context import HostPort, checked_sandbox, scheduler, taking_work
from daemon.rpc.params import ScheduleAdd, ScheduleRef, ScheduleRuns
from daemon.rpc.protocol import Dispatcher, Peer
from daemon.rpc.views import Empty, JsonObject
from daemon.schedule.model import ScheduleSpec
from goals import SandboxSpec


class ScheduleListing(TypedDict):
    """``schedule/list``'s answer."""

    schedules: list[JsonObject]


class RunListing(TypedDict):
    """``schedule/runs``'s answer."""

    runs: list[JsonObject]


def register(d: Dispatcher, host: HostPort) -> None:
    """Add the ``schedule/*`` methods to ``d``."""

    @d.method("schedule/add", ScheduleAdd)
    async def schedule_add(p: ScheduleAdd, peer: Peer) -> JsonObject:
        taking_work(host)
        spec = ScheduleSpec.parse(p.model_dump())
        checked_sandbox(host, SandboxSpec.model_validate(spec.goal.get("sandbox") or {}))
        schedule = await scheduler(host).add(spec)
        return dict(schedule.public())

    @d.method("schedule/list")
    async def schedule_list(peer: Peer) -> ScheduleListing:
        return {"schedules": [s.public() for s in await scheduler(host).list()]}

    @d.method("schedule/remove", ScheduleRef)
    async def schedule_remove(p: ScheduleRef, peer: Peer) -> Empty:
        await scheduler(host).remove(p.schedule_id)
        return {}

    @d.method("schedule/runs", ScheduleRuns)
    async def schedule_runs(p: ScheduleRuns, peer: Peer) -> RunListing:
        runs = await scheduler(host).runs(p.schedule_id, p.limit)
        return {"runs": [r.public() for r in runs]}
