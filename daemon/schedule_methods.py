"""The control protocol's ``schedule/*`` methods."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from daemon.methods import Params
from daemon.protocol import Dispatcher, ErrorCode, Peer, RpcError

if TYPE_CHECKING:
    from daemon.host import Host


class ScheduleAdd(Params):
    """``schedule/add``."""

    key: str | None = None
    trigger: dict[str, Any]
    timezone: str = "UTC"
    goal: dict[str, Any]
    misfire: str = "coalesce"
    concurrency: str = "forbid"
    starting_deadline_seconds: float | None = None


class ScheduleRef(Params):
    """A schedule id, a unique prefix of one, or a schedule key (any length, e.g. ``ev``)."""

    schedule_id: str = Field(min_length=1, max_length=200)


class ScheduleRuns(ScheduleRef):
    """``schedule/runs``."""

    limit: int = Field(default=20, ge=1, le=10_000)


def register_schedule_methods(d: Dispatcher, host: Host) -> None:
    """Add the schedule methods to ``d``."""

    def scheduler() -> Any:
        if host.scheduler is None:
            raise RpcError(ErrorCode.SHUTTING_DOWN, "the scheduler is not running")
        return host.scheduler

    @d.method("schedule/add", ScheduleAdd)
    async def schedule_add(p: ScheduleAdd, peer: Peer) -> dict[str, Any]:
        from daemon.schedules import ScheduleSpec

        if host.state != "serving":
            raise RpcError(ErrorCode.SHUTTING_DOWN, f"the daemon is {host.state}; it takes no new work")
        spec = ScheduleSpec.parse(p.model_dump())
        from daemon.methods import checked_sandbox
        from goals import SandboxSpec

        checked_sandbox(host, SandboxSpec.model_validate(spec.goal.get("sandbox") or {}))
        schedule = await scheduler().add(spec)
        return dict(schedule.public())

    @d.method("schedule/list", None)
    async def schedule_list(peer: Peer) -> dict[str, Any]:
        return {"schedules": [s.public() for s in await scheduler().list()]}

    @d.method("schedule/remove", ScheduleRef)
    async def schedule_remove(p: ScheduleRef, peer: Peer) -> dict[str, Any]:
        await scheduler().remove(p.schedule_id)
        return {}

    @d.method("schedule/runs", ScheduleRuns)
    async def schedule_runs(p: ScheduleRuns, peer: Peer) -> dict[str, Any]:
        runs = await scheduler().runs(p.schedule_id, p.limit)
        return {"runs": [r.public() for r in runs]}
