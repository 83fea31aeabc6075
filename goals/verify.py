"""Proof of completion and of progress: verification commands and the work-directory fingerprint.

Verification commands (and a goal's ``progress`` command) run in the goal's work directory through
a command runner: the daemon's runs them in the goal's own sandbox (:func:`sandboxed_runner`: its
network setting, secrets and extra read-only paths; secrets redacted from the output); the default
:func:`run_command` is a plain subprocess in its own process group, for an engine embedded without
a daemon. A timeout kills the whole command.

The fingerprint tells whether the work directory changed. **The daemon reads a work directory as
data, never as configuration**: the work directory belongs to the model, so nothing in it may
decide what the daemon runs. The fingerprint therefore runs no program at all (an earlier version
ran ``git rev-parse``/``git status`` there, as the daemon, and a ``.git/config`` the model wrote --
``core.fsmonitor``, ``core.hooksPath``, a filter driver, a pager -- ran any command outside the
sandbox). It is computed in process, from an ``lstat`` of every entry: its name, its type, the
size and modification time of a file, the target of a symbolic link (read, never followed), the
modification time of a directory. No file is opened (a FIFO planted under a familiar name cannot
block it), no link is followed (a link to ``/`` is one entry). ``.git`` is walked as plain data
like any other directory, so a commit (HEAD, a ref, the index, the logs change) counts as
progress; its ``objects`` (and ``lfs``) directories are skipped, since the refs and the index
already name what they hold and a repository's object store can be most of a tree's entries.

Cost is bounded: at most :data:`MAX_FINGERPRINT_ENTRIES` (100,000) entries are read per
fingerprint, in a fixed order (depth first, names sorted), so a tree larger than that is
fingerprinted by its first 100,000 entries plus a marker; a change past the bound is not seen
(a goal's ``progress`` command is the way to observe such a goal). Measured on a loaded 2-core
machine: about 0.9 ms for 200 files, about 0.65 s at the bound (in a worker thread, off the loop).
Unlike git's view, touching a file without changing it counts as a change: progress is judged
by what the daemon can observe cheaply and safely, not by content.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import stat
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


def progress_digest(result: VerifyResult) -> str:
    """What a ``progress`` command observed, as a digest: its exit code (or its timeout) and output."""
    state = "timeout" if result.timed_out else f"exit {result.exit_code}"
    return hashlib.sha256(f"{state}\0{result.output_tail}".encode()).hexdigest()[:32]


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


#: The most directory entries one fingerprint reads (files, directories and links alike).
MAX_FINGERPRINT_ENTRIES = 100_000
#: Directories under ``.git`` whose content the refs and the index already name: not walked.
_GIT_SKIP = frozenset({b"objects", b"lfs"})


def fingerprint(workdir: Path, *, max_entries: int = MAX_FINGERPRINT_ENTRIES) -> str | None:
    """A digest that changes when the work directory's content changes (``None`` if it is missing).

    Computed in process from names, types, sizes and modification times, read with ``lstat``; see
    the module docstring for why nothing is executed, opened or followed, and for the bound.
    """
    root = os.fsencode(workdir)
    try:
        top = os.lstat(root)
    except OSError:
        return None
    if not stat.S_ISDIR(top.st_mode):
        return None
    h = hashlib.sha256()
    seen = 0
    # Depth first, each directory's entries sorted by name: the order (and so a cut at the bound)
    # does not depend on the file system's listing order.
    stack: list[tuple[bytes, bytes]] = [(root, b"")]
    while stack:
        path, rel = stack.pop()
        try:
            with os.scandir(path) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            h.update(b"?" + rel + b"\0")  # unreadable (or gone since): recorded as such
            continue
        subdirs: list[tuple[bytes, bytes]] = []
        for entry in entries:
            if seen >= max_entries:
                h.update(b"...truncated\0")
                return h.hexdigest()[:32]
            seen += 1
            name = entry.name
            child = rel + b"/" + name if rel else name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            mode = st.st_mode
            if stat.S_ISDIR(mode):
                h.update(b"d\0%s\0%d\0" % (child, st.st_mtime_ns))
                if not (name in _GIT_SKIP and (rel == b".git" or rel.endswith(b"/.git"))):
                    subdirs.append((entry.path, child))
            elif stat.S_ISLNK(mode):
                try:
                    target = os.readlink(entry.path)
                except OSError:
                    target = b"?"
                h.update(b"l\0%s\0%s\0%d\0" % (child, target, st.st_mtime_ns))
            else:
                # Regular files and anything else (a FIFO, a socket, a device node): never opened.
                kind = b"f" if stat.S_ISREG(mode) else b"o"
                h.update(b"%s\0%s\0%d\0%d\0" % (kind, child, st.st_size, st.st_mtime_ns))
        stack.extend(reversed(subdirs))
    return h.hexdigest()[:32]
