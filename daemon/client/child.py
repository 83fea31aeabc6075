"""A private daemon: ``goald serve --stdio`` as a child process of the SDK's client.

The child runs in its own process group, with this process's environment less systemd's
variables (they belong to whoever runs us, not to a private child), and a temporary state
directory when it is given neither one nor a configuration. :func:`stop_child` stops it with
escalation: the ``shutdown`` method, then closing its stdin, then SIGTERM, then SIGKILL, each step
given the same number of seconds; :class:`StopStep` says which step ended it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from daemon.client.connection import Connection


class StopStep(enum.StrEnum):
    """How :meth:`Client.close` ended a private daemon."""

    #: It had already exited.
    EXITED = "exited"
    #: It answered the ``shutdown`` method and exited.
    SHUTDOWN = "shutdown"
    #: It exited when its stdin closed.
    STDIN_CLOSED = "stdin_closed"
    #: It exited on SIGTERM.
    SIGTERM = "sigterm"
    #: It had to be killed.
    SIGKILL = "sigkill"


def child_command(
    config: str | Path | None,
    state_dir: str | Path | None,
    argv: Sequence[str] | None,
    env: dict[str, str] | None,
    log_level: str,
) -> tuple[list[str], dict[str, str], Path | None]:
    """The private daemon's command line, environment, and the temporary state directory (if one)."""
    temp = None
    if state_dir is None and config is None:
        temp = Path(tempfile.mkdtemp(prefix="goald-sdk-"))
        state_dir = temp
    cmd = list(argv or [sys.executable, "-m", "daemon"])
    if config is not None:
        cmd += ["--config", str(config)]
    cmd += ["--log-level", log_level, "serve", "--stdio"]
    child_env = dict(os.environ if env is None else env)
    # systemd's variables belong to whoever runs us, not to a private child.
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        child_env.pop(name, None)
    if state_dir is not None:
        child_env["GOALD_STATE_DIR"] = str(Path(state_dir).expanduser().resolve())
    return cmd, child_env, temp


async def stop_child(proc: asyncio.subprocess.Process, conn: Connection, seconds: float, *, ended: bool) -> StopStep:
    """Stop the child with escalation, each step given ``seconds``; returns the step that did.

    ``ended``: its stdout is closed already, so it has exited (or is exiting) and there is no one
    to ask to shut down.
    """
    if ended:
        if await exited(proc, seconds):
            return StopStep.EXITED
    else:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(seconds):
                await conn.call("shutdown")
        if await exited(proc, seconds):
            return StopStep.SHUTDOWN
    if proc.stdin is not None:
        proc.stdin.close()
    if await exited(proc, seconds):
        return StopStep.STDIN_CLOSED
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    if await exited(proc, seconds):
        return StopStep.SIGTERM
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    await proc.wait()
    return StopStep.SIGKILL


async def exited(proc: asyncio.subprocess.Process, seconds: float) -> bool:
    """Whether the child exits within ``seconds``."""
    try:
        await asyncio.wait_for(proc.wait(), seconds)
    except TimeoutError:
        return False
    return True


__all__ = ["StopStep", "child_command", "exited", "stop_child"]
