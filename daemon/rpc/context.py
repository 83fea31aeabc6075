"""What every method handler reaches for: the runtime, engine and scheduler while serving, the
refusal of new work while stopping, and the check of a goal's sandbox.

Handlers see the daemon as a :class:`~daemon.ports.HostPort`, never the host itself.
"""

from __future__ import annotations

from agent import Runtime
from daemon.goal_sandbox import check_spec
from daemon.ports import HostPort
from daemon.rpc.protocol import ErrorCode, InvalidField, RpcError
from daemon.schedule.service import Scheduler
from goals import GoalEngine, SandboxSpec

__all__ = ["HostPort", "checked_sandbox", "engine", "runtime", "scheduler", "taking_work"]


def runtime(host: HostPort) -> Runtime:
    """The runtime, or ``SHUTTING_DOWN`` when the daemon is not serving."""
    if host.rt is None:
        raise RpcError(ErrorCode.SHUTTING_DOWN, "the daemon is not serving")
    return host.rt


def engine(host: HostPort) -> GoalEngine:
    """The goal engine, or ``SHUTTING_DOWN`` when the daemon is not serving."""
    if host.engine is None:
        raise RpcError(ErrorCode.SHUTTING_DOWN, "the daemon is not serving")
    return host.engine


def scheduler(host: HostPort) -> Scheduler:
    """The scheduler, or ``SHUTTING_DOWN`` when it is not running."""
    if host.scheduler is None:
        raise RpcError(ErrorCode.SHUTTING_DOWN, "the scheduler is not running")
    return host.scheduler


def taking_work(host: HostPort) -> None:
    """Refuse new work (``SHUTTING_DOWN``) unless the daemon is serving."""
    if host.state != "serving":
        raise RpcError(ErrorCode.SHUTTING_DOWN, f"the daemon is {host.state}; it takes no new work")


def checked_sandbox(host: HostPort, spec: SandboxSpec, on_existing_session: bool = False) -> None:
    """Refuse a goal's sandbox that names a provider's key, or secrets for a session that is already
    set up; otherwise let the daemon redact its secrets from the new session's tool output.

    Raises:
        InvalidField: naming what is wrong (nothing was written).
    """
    try:
        check_spec(host.settings, spec)
    except ValueError as exc:
        raise InvalidField(str(exc), field="sandbox") from None
    if spec.secrets and on_existing_session:
        raise InvalidField("sandbox.secrets come with a goal's own session: leave out sessionId", field="sandbox")
    host.learn_secrets(spec)
