"""Proof of completion: verification commands and the work-directory fingerprint.

Verification commands run in the goal's work directory through a command runner: the daemon's
runs them in the sandbox (:func:`sandboxed_runner`, secrets redacted from the output); the default
:func:`run_command` is a plain subprocess in its own process group. A timeout kills the whole command.
The fingerprint tells whether the work directory changed: git HEAD and status where it is a
repository, else a hash of every file's name, size and modification time.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from agent import Redactor, Sandbox, SandboxUnavailable
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


def fingerprint(workdir: Path) -> str | None:
    """A digest that changes when the work directory's content changes (``None`` if it is missing)."""
    if not workdir.is_dir():
        return None
    h = hashlib.sha256()
    if (workdir / ".git").exists():
        try:
            head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=workdir, capture_output=True, timeout=30)
            status = subprocess.run(
                ["git", "status", "--porcelain=v1", "-uall"], cwd=workdir, capture_output=True, timeout=60
            )
        except (OSError, subprocess.SubprocessError):
            status = None
        # A git that fails (a broken ``.git``, a repository it refuses for dubious ownership) prints
        # nothing: hashing that would make every round look the same, so the files are hashed instead.
        if status is not None and status.returncode == 0:
            # A repository without a commit yet has no HEAD; its status still says what changed.
            h.update(b"git\0" + (head.stdout if head.returncode == 0 else b"") + b"\0" + status.stdout)
            # Status lists changed paths but not further edits to an already-changed file.
            for line in status.stdout.decode(errors="replace").splitlines():
                path = workdir / line[3:].strip().strip('"')
                with contextlib.suppress(OSError):
                    st = path.stat()
                    h.update(f"{line}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
            return h.hexdigest()[:32]
    for root, dirs, files in os.walk(workdir):
        dirs[:] = sorted(d for d in dirs if d != ".git")
        for name in sorted(files):
            path = Path(root) / name
            with contextlib.suppress(OSError):
                st = path.lstat()
                rel = path.relative_to(workdir)
                h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:32]
