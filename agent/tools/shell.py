"""The ``shell`` tool: one bash command line in the session's sandbox.

The command runs with ``bash -c`` in the work directory, inside the sandbox the tool is given
(:class:`~agent.sandbox.Sandbox`, or a function that builds one per call: the daemon's picks the
goal's network policy and secrets). The result says the exit code and carries both streams, each
cut in the middle past half the output cap with a marker. A timeout kills every process the
command started, grandchildren that ignore SIGTERM included, and says so. A command that hits its
sandbox's process or memory cap (:mod:`agent.limits`) is an error whose first line names the limit.
The timeout is capped at the time the session's spend guard has left (:meth:`ToolContext.time_left`):
a command still running when its goal's deadline or wall-time budget runs out is killed then, and
the result says so ("stopped: the time budget ran out ..."); with no time left it is not run.
A command the host refuses to start (:class:`~agent.sandbox.base.CommandRefused`: the daemon's disk
for its store is under its watermark) is not run either, and the result says why: ``not run: ...``.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

from pydantic import BaseModel, Field

from agent.sandbox import Sandbox, SandboxResult, SandboxUnavailable
from agent.sandbox.base import CommandRefused
from agent.tools.base import Tool, ToolContext, ToolOutput

#: Why a command was stopped, or not run, when its session's time ran out.
TIME_RAN_OUT = "the time budget ran out (the deadline or the wall-time budget)"
#: A sandbox, or how to build one for a call.
SandboxSource = Sandbox | Callable[[ToolContext], Sandbox | Awaitable[Sandbox]]


class ShellArgs(BaseModel):
    """Arguments of ``shell``."""

    command: str = Field(min_length=1, max_length=100_000, description="A bash command line")
    timeout_seconds: float | None = Field(
        default=None, gt=0, description="Kill the command after this many seconds (capped by the tool's limit)"
    )


class Shell(Tool[ShellArgs]):
    """Run a command line in the sandbox."""

    name = "shell"
    description = (
        "Run a bash command line in the work directory, in a sandbox: only the work directory and /tmp are "
        "writable, and the network may be off. Returns the exit code, stdout and stderr. Processes it starts "
        "end with it."
    )
    Args = ShellArgs

    def __init__(
        self,
        sandbox: SandboxSource,
        *,
        default_timeout: float = 120.0,
        max_timeout: float | None = None,
        output_cap: int = 64_000,
    ) -> None:
        self._sandbox = sandbox
        self.default_timeout = default_timeout
        self.max_timeout = max(max_timeout or default_timeout, default_timeout)
        self.stream_cap = max(output_cap // 2, 64)
        # The registry's limits are a backstop: the command's own timeout and caps act first.
        self.output_cap = output_cap + 1024
        self.timeout = self.max_timeout + 30.0

    async def _resolve(self, ctx: ToolContext) -> Sandbox:
        if isinstance(self._sandbox, Sandbox):
            return self._sandbox
        made = self._sandbox(ctx)
        if inspect.isawaitable(made):
            made = await made
        assert isinstance(made, Sandbox)
        return made

    async def run(self, args: ShellArgs, ctx: ToolContext) -> ToolOutput:
        timeout = min(args.timeout_seconds or self.default_timeout, self.max_timeout)
        # The session's time binds the command too: a command cannot outlive its goal's deadline or
        # wall-time budget by its own timeout.
        stopped_by: str | None = None
        left = ctx.time_left()
        if left is not None and left < timeout:
            stopped_by = TIME_RAN_OUT
            if left <= 0:
                return ToolOutput(f"not run: {TIME_RAN_OUT}", True)
            timeout = left
        try:
            sandbox = await self._resolve(ctx)
            result = await sandbox.run(["bash", "-c", args.command], timeout=timeout, output_cap=self.stream_cap)
        except CommandRefused as exc:
            return ToolOutput(f"not run: {exc}", True)
        except SandboxUnavailable as exc:
            return ToolOutput(f"shell is not available: {exc}", True)
        return ToolOutput(render(result, timeout, stopped_by), is_error=not result.ok or result.limit is not None)


def render(result: SandboxResult, timeout: float, stopped_by: str | None = None) -> str:
    """A command's result as the model reads it; ``stopped_by``: why the timeout was cut short."""
    if result.timed_out and stopped_by is not None:
        head = f"stopped: {stopped_by} after {timeout:.1f}s: the command and every process it started were killed"
    elif result.timed_out:
        head = f"timed out after {timeout:g}s: the command and every process it started were killed"
    else:
        head = f"exit code: {result.exit_code}"
    if result.limit is not None:
        head = f"{result.limit}; {head}"
    parts = [head]
    if result.stdout:
        parts.append("--- stdout ---\n" + result.stdout.rstrip("\n"))
    if result.stderr:
        parts.append("--- stderr ---\n" + result.stderr.rstrip("\n"))
    if not result.stdout and not result.stderr:
        parts.append("(no output)")
    return "\n".join(parts)
