"""Verification commands (and a goal's ``progress`` command): how they run in the goal's work directory.

They run through a command runner: the daemon's runs them in the goal's own sandbox
(:func:`sandboxed_runner`: its network setting, secrets and extra read-only paths; secrets redacted
from the output); the default :func:`run_command` is a plain subprocess in its own process group,
for an engine embedded without a daemon. A timeout kills the whole command; :func:`within` cuts
every command to the goal's time left. Whether the work directory changed is
:mod:`goals.workdir_fingerprint`'s concern.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from agent import Redactor, Sandbox, SandboxUnavailable
from agent.sandbox.base import CommandRefused
from goals.model import VerifyCommand, VerifyResult

OUTPUT_TAIL = 4000
CommandRunner = Callable[[VerifyCommand, Path], Awaitable[VerifyResult]]


async def run_command(command: VerifyCommand, workdir: Path) -> VerifyResult:
    """Run one command with ``bash -c`` in ``workdir``; stdout and stderr are merged."""
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        command.cmd,
        cwd=str(workdir),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    timed_out = False
    try:
        async with asyncio.timeout(command.timeout):
            out, _ = await proc.communicate()
    except TimeoutError:
        timed_out = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = await proc.communicate()
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
    text = out.decode("utf-8", errors="replace")
    if timed_out:
        text += f"\n[timed out after {command.timeout:g}s; process group killed]"
    return VerifyResult(
        cmd=command.cmd,
        exit_code=None if timed_out else proc.returncode,
        output_tail=text[-OUTPUT_TAIL:],
        timed_out=timed_out,
        seconds=round(time.monotonic() - started, 3),
    )


def sandboxed_runner(sandbox_for: Callable[[Path], Sandbox], redactor: Redactor | None = None) -> CommandRunner:
    """A runner that runs each command with ``bash -c`` in ``sandbox_for(workdir)`` (stdout and stderr
    merged), its output redacted by the sandbox's secrets and ``redactor``. A sandbox that cannot be
    made fails the command, saying why."""

    async def run(command: VerifyCommand, workdir: Path) -> VerifyResult:
        try:
            sandbox = sandbox_for(workdir)
            result = await sandbox.run(
                ["bash", "-c", command.cmd], timeout=command.timeout, output_cap=2 * OUTPUT_TAIL, merge_stderr=True
            )
        except CommandRefused as exc:
            return VerifyResult(cmd=command.cmd, exit_code=None, output_tail=f"not run: {exc}")
        except SandboxUnavailable as exc:
            return VerifyResult(cmd=command.cmd, exit_code=None, output_tail=f"verification cannot run: {exc}")
        text = result.stdout
        if redactor is not None:
            text = redactor.redact(text)
        if result.timed_out:
            text += f"\n[timed out after {command.timeout:g}s; every process of the command was killed]"
        return VerifyResult(
            cmd=command.cmd,
            exit_code=result.exit_code,
            output_tail=text[-OUTPUT_TAIL:],
            timed_out=result.timed_out,
            seconds=result.seconds,
        )

    return run


def progress_digest(result: VerifyResult) -> str:
    """What a ``progress`` command observed, as a digest: its exit code (or its timeout) and output."""
    state = "timeout" if result.timed_out else f"exit {result.exit_code}"
    return hashlib.sha256(f"{state}\0{result.output_tail}".encode()).hexdigest()[:32]


def within(runner: CommandRunner, seconds: float) -> CommandRunner:
    """``runner`` inside the goal's time: ``seconds`` from now its deadline or wall time ends, and
    no command runs past that. A command's timeout is cut to the time left (its result says so when
    the cut ended it); with no time left a command is not run, and fails saying why. Either way the
    claim it checks is refused, and the spent budget ends the goal at its next decision."""
    ends = time.monotonic() + seconds

    async def run(command: VerifyCommand, workdir: Path) -> VerifyResult:
        left = ends - time.monotonic()
        if left <= 0:
            return VerifyResult(
                cmd=command.cmd,
                exit_code=None,
                output_tail="not run: the goal's deadline or wall time ran out",
                out_of_time=True,
            )
        if left >= command.timeout:
            return await runner(command, workdir)
        left = math.ceil(left * 100) / 100  # in hundredths, rounded up: the cut is never before the end
        result = await runner(command.model_copy(update={"timeout": left}), workdir)
        if not result.timed_out:
            return result
        note = f"\n[cut short: the goal's deadline or wall time left {left:g}s of the command's {command.timeout:g}s]"
        return result.model_copy(
            update={"output_tail": (result.output_tail + note)[-OUTPUT_TAIL:], "out_of_time": True}
        )

    return run


async def run_all(
    commands: list[VerifyCommand], workdir: Path, runner: CommandRunner = run_command
) -> list[VerifyResult]:
    """Run every command in order; stop at the first failure."""
    results = []
    for command in commands:
        result = await runner(command, workdir)
        results.append(result)
        if not result.passed:
            break
    return results
