"""The daemon as its parts see it: :class:`HostPort`, a protocol type the host satisfies.

The RPC methods, declared goals and the SDK's in-process client are given this narrow view
instead of the :class:`~daemon.host.Host` itself, so they do not import the host (which imports
them: that would be a cycle), and what they may touch is written down in one place.
"""

from __future__ import annotations

from typing import Protocol

from agent import ModelRegistry, Runtime
from daemon.rpc.views import JsonObject
from daemon.schedule.service import Scheduler
from daemon.settings import Settings
from daemon.workdirs import Workdirs
from goals import GoalEngine, SandboxSpec


class HostPort(Protocol):
    """The daemon as its RPC methods see it."""

    @property
    def settings(self) -> Settings:
        """The daemon's settings."""

    @property
    def models(self) -> ModelRegistry:
        """The provider registry (``get`` refuses an unknown model)."""

    @property
    def rt(self) -> Runtime | None:
        """The runtime, while serving."""

    @property
    def engine(self) -> GoalEngine | None:
        """The goal engine, while serving."""

    @property
    def scheduler(self) -> Scheduler | None:
        """The scheduler, while serving."""

    @property
    def state(self) -> str:
        """The run state (``serving`` when it takes new work)."""

    @property
    def workdirs(self) -> Workdirs:
        """Resolves work directories inside the allowed roots."""

    def learn_secrets(self, spec: SandboxSpec) -> None:
        """Redact ``spec``'s secrets from the tool output of sessions resolved from now on."""

    async def health(self) -> JsonObject:
        """The ``daemon/health`` answer."""

    async def reload(self) -> dict[str, int]:
        """Reload declared goals and schedules."""

    def request_stop(self) -> None:
        """Begin a graceful shutdown."""
