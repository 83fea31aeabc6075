"""Running one command in its sandbox: start it under its limits, wait, kill all of it, report.

``--die-with-parent`` and the PID namespace make the sandbox end as one: when bwrap's process
1 in the namespace dies, the kernel kills every other process in it before process 1 may
finish exiting. bwrap outside exits when the command's main process does; process 1 then dies
of ``--die-with-parent``, taking background processes with it, and :meth:`Sandbox.run` returns
only once process 1 has exited (a pidfd reads ready): nothing of the command is left running.

A timeout first sends SIGTERM to every process of the command (found by its PID namespace, as
bwrap reports it on ``--info-fd``), waits :attr:`Sandbox.kill_grace` seconds, then SIGKILLs the
namespace's process 1, which takes every process in it, one that ignores SIGTERM included.
Signals go through pidfds, so a recycled PID is never hit. ``Sandbox.none`` (``sandbox = "none"``)
runs the command unconfined in its own process group, killed the same way (SIGTERM, then SIGKILL
to the group); a process that leaves the group (``setsid``) escapes it — one more reason to run
with bubblewrap.

Limits: bwrap waits on its ``--args`` pipe before it does anything, which is when the daemon puts
it into the command's cgroup (inside its goal's, whose caps bind all of the goal's commands
together: :mod:`agent.limits`); everything it starts inherits the group. bwrap is started first:
its arguments (the mount plan and the secrets) are worked out and its group made while it execs,
which takes about as long, so neither is paid on top of the other (``benchmarks/bench_sandbox.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from loguru import logger

from agent import workdirs
from agent.limits import CommandLimits, Group, LimitsUnavailable, limiter
from agent.sandbox import identity, seccomp
from agent.sandbox.base import DEFAULT_PATH, SandboxResult, SandboxUnavailable
from agent.sandbox.bwrapfds import ArgsPipe, Info, filter_pipe, ns_of
from agent.sandbox.capture import Capture, pump

if TYPE_CHECKING:
    from agent.sandbox.command import Sandbox


async def run(
    sandbox: Sandbox,
    cmd: Sequence[str],
    *,
    timeout: float,  # noqa: ASYNC109
    output_cap: int,
    merge_stderr: bool,
) -> SandboxResult:
    """:meth:`Sandbox.run <agent.sandbox.command.Sandbox.run>`: run ``cmd``, on timeout kill all of it."""
    try:
        # Checked now, bound by descriptor below: a work directory swapped for a symlink (or
        # another directory) since the session was set up is refused, never followed.
        workdir_fd = workdirs.open_workdir(sandbox.workdir)
    except OSError as exc:
        raise SandboxUnavailable(str(exc)) from None
    info = Info() if sandbox.kind == "bwrap" else None
    proc, group, started = await _start(sandbox, cmd, workdir_fd, info, merge_stderr=merge_stderr)
    if info is not None:
        info.started()
    redactor = sandbox.redactor
    out = Capture(output_cap, redactor.longest)
    err = Capture(output_cap, redactor.longest)
    timed_out = False
    verdict: str | None = None
    try:
        timed_out = await _supervise(proc, info, out, err, timeout=timeout, kill_grace=sandbox.kill_grace)
    finally:
        if info is not None:
            try:
                await asyncio.shield(_end(info))
            finally:
                info.close()
        if group is not None:
            verdict = group.verdict(failed=timed_out or proc.returncode != 0)
            await asyncio.shield(group.remove())
    code = proc.returncode
    assert code is not None
    if code == _NOT_ENTERED and info is not None and not info.reached and group is not None and limiter().enters_itself:
        refused = f"cannot put the command into its cgroup: {err.text(redactor).strip() or 'exit 70'}"
        logger.error("a sandboxed command could not start: {}", refused)
        raise SandboxUnavailable(refused)
    stopped = code in (-31, seccomp.SIGSYS_EXIT) or out.saw(seccomp.SHELL_SAYS) or err.saw(seccomp.SHELL_SAYS)
    if info is not None and not timed_out and stopped:
        verdict = seccomp.VIOLATION if verdict is None else f"{verdict}; {seccomp.VIOLATION}"
    if info is not None and code == 1 and (problem := _unreachable(sandbox, err.text(redactor))) is not None:
        logger.error("a sandboxed command could not start: {}", problem)
        raise SandboxUnavailable(problem)
    return SandboxResult(
        exit_code=None if timed_out else (128 - code if code < 0 else code),
        stdout=out.text(redactor),
        stderr=err.text(redactor),
        timed_out=timed_out,
        seconds=round(time.monotonic() - started, 3),
        stdout_bytes=out.total,
        stderr_bytes=err.total,
        limit=verdict,
    )


async def _start(
    sandbox: Sandbox, cmd: Sequence[str], workdir_fd: int, info: Info | None, *, merge_stderr: bool
) -> tuple[asyncio.subprocess.Process, Group | None, float]:
    """Start the command (bwrap held on its arguments until it is in its cgroup); closes ``workdir_fd``.

    bwrap is started first, with only the numbers of its descriptors: while it execs and loads,
    which takes about as long, the daemon works out its arguments (the mounts, the secrets), makes
    the command's cgroup and puts bwrap into it; only then does bwrap get its arguments and go on.

    Returns the process, its cgroup (if any) and when it started. On failure nothing is left: no
    process, no descriptor, no group.
    """
    group: Group | None = None
    args = ArgsPipe()
    go: ArgsPipe | None = None
    filter_fd = -1
    fds: tuple[int, ...] = ()
    fd_numbers = (workdir_fd, -1)
    try:
        if info is None:
            argv = sandbox.argv(cmd)
        else:
            filter_fd = filter_pipe()
            fd_numbers = (workdir_fd, filter_fd)
            args.open()
            argv = sandbox.argv(cmd, setup_fd=args.read_fd)
            argv[1:1] = ["--info-fd", str(info.write_fd)]
            argv[:0] = sandbox.user_switch()
            if sandbox.limits.active and limiter().enters_itself:
                # cgroup v1: the command's first process, a /bin/sh, moves itself into its group (or
                # exits 70) and only then execs bwrap: cheaper than moving bwrap in from here. It
                # reads its group's files on its standard input: the group is made while it starts.
                go = ArgsPipe()
                go.open()
                argv[:0] = [_SH, "-c", _ENTER, "goald-sandbox"]
            # bwrap closes the work directory's and the filter's descriptors once used, and the
            # others are its own (--info-fd, --args): the command holds 0, 1 and 2 only (the census).
            fds = (info.write_fd, args.read_fd, workdir_fd, filter_fd)
        started = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=str(sandbox.workdir) if info is None else "/",
                env=sandbox.environment() if info is None else {"PATH": DEFAULT_PATH},
                stdin=subprocess.DEVNULL if go is None else go.read_fd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                start_new_session=True,
                pass_fds=fds,
            )
        except OSError as exc:
            raise SandboxUnavailable(f"cannot start {argv[0]}: {exc.strerror or exc}") from None
        finally:
            args.close_read()
            if go is not None:
                go.close_read()
            os.close(workdir_fd)
            workdir_fd = -1
            if filter_fd >= 0:
                os.close(filter_fd)
                filter_fd = -1
        if info is not None:
            group = await _prepare(sandbox, proc, args, fd_numbers, go)
    except BaseException:
        args.close()
        if go is not None:
            go.close()
        if workdir_fd >= 0:
            os.close(workdir_fd)
        if filter_fd >= 0:
            os.close(filter_fd)
        if info is not None:
            info.close()
        raise  # a group made by _prepare is removed there when it fails
    return proc, group, started


#: The shell in front of bwrap where a command enters its cgroup itself, and its exit code when it
#: could not (nothing else ran).
_SH = shutil.which("sh", path=DEFAULT_PATH) or "/bin/sh"
_NOT_ENTERED = 70
#: That shell's script: the files to write ``0`` into, a line each, then ``go``, come on its standard
#: input (:func:`_prepare` writes them once the group is made); without ``go`` (the daemon gave up)
#: it exits 70. Its standard input is then ``/dev/null`` again, and it becomes (setpriv and) bwrap.
_ENTER = (
    'while IFS= read -r t; do [ "$t" = go ] && break; echo 0 > "$t" || exit 70; done; '
    '[ "$t" = go ] || exit 70; exec "$@" < /dev/null'
)


async def _prepare(
    sandbox: Sandbox,
    proc: asyncio.subprocess.Process,
    args: ArgsPipe,
    fd_numbers: tuple[int, int],
    go: ArgsPipe | None,
) -> Group | None:
    """While bwrap waits on its ``--args`` pipe: its cgroup, made, and entered (or, with ``go``, the
    shell in front of bwrap told where to enter itself); its arguments (mounts and secrets, naming
    the work directory's and the filter's descriptors by number); then the arguments written, and
    bwrap goes on. Failing anything, bwrap is killed before it gets an argument (it must never run
    without its mounts, or unlimited) and nothing made here is left."""
    made: Group | None = None
    try:
        if sandbox.limits.active:
            made = _new_group(sandbox.limits, sandbox.limits_group)
            if go is not None:  # first: that shell waits for it, and setpriv and bwrap load meanwhile
                go.release(b"".join(str(path).encode() + b"\n" for path in made.entry_files()) + b"go\n")
            else:
                try:
                    made.enter(proc.pid)
                except LimitsUnavailable as exc:
                    raise SandboxUnavailable(str(exc)) from None
        data = sandbox.setup_args(*fd_numbers)
        args.release(data)
    except BaseException:
        _killpg(proc.pid, signal.SIGKILL)
        args.close()
        await asyncio.shield(proc.wait())
        if made is not None:
            await asyncio.shield(made.remove())
        raise
    return made


#: bwrap's words when the user it runs as may not pass through a directory on the way to a path it
#: binds (the work directory, bound from ``/proc/self/fd/N``, or a read-only path).
_NO_SOURCE = re.compile(r"^bwrap: Can't find source path (/.*): Permission denied$", re.MULTILINE)


def _unreachable(sandbox: Sandbox, stderr: str) -> str | None:
    """Why bwrap could not bind a path, in plain words, when its ``stderr`` says it was refused one and
    a directory on the way to it does not let the user bwrap runs as through; ``None`` otherwise
    (the command's own output that only looks like it included)."""
    found = _NO_SOURCE.search(stderr)
    if found is None:
        return None
    source = found.group(1)
    setting: str | None
    if source.startswith("/proc/self/fd/"):
        path, what, setting = sandbox.workdir, "the work directory", "workdir_roots"
    elif sandbox.proxy is not None and source == str(sandbox.proxy.path):
        path, what, setting = Path(source), "the network proxy's socket", None
    else:
        path, what, setting = Path(source), "the read-only path", "sandbox_read_only_paths"
    if sandbox.run_as is not None:
        uid, gid = sandbox.run_as
        groups = [gid]
        try:
            name: str | None = pwd.getpwuid(uid).pw_name
        except KeyError:
            name = None
    else:
        uid, gid = os.geteuid(), os.getegid()
        groups = [gid, *os.getgroups()]
        name = None
    return identity.reach_problem(path, (uid, gid), name=name, what=what, setting=setting, groups=groups)


def _new_group(limits: CommandLimits, goal: str | None) -> Group:
    try:
        return limiter().group(limits, goal=goal)
    except LimitsUnavailable as exc:
        raise SandboxUnavailable(str(exc)) from None


async def _supervise(
    proc: asyncio.subprocess.Process,
    info: Info | None,
    out: Capture,
    err: Capture,
    *,
    timeout: float,  # noqa: ASYNC109
    kill_grace: float,
) -> bool:
    """Read both streams until the command ends or ``timeout`` passes (then kill all of it); whether
    it timed out. Cancelled, it kills the command at once."""
    pumps = [asyncio.ensure_future(pump(proc.stdout, out)), asyncio.ensure_future(pump(proc.stderr, err))]
    waiter = asyncio.ensure_future(proc.wait())
    try:
        _, pending = await asyncio.wait([waiter, *pumps], timeout=timeout)
        if pending:
            await _stop(proc, info, polite=True, kill_grace=kill_grace)
            # Unconfined, an escaped process may still hold the pipes: give up on them.
            await asyncio.wait(pumps, timeout=2.0)
            return True
        if info is None:
            _killpg(proc.pid, signal.SIGKILL)  # what the command left behind in its group
        return False
    except BaseException:
        await asyncio.shield(_stop(proc, info, polite=False, kill_grace=kill_grace))
        raise
    finally:
        for task in (waiter, *pumps):
            task.cancel()
        await asyncio.gather(waiter, *pumps, return_exceptions=True)


async def _stop(proc: asyncio.subprocess.Process, info: Info | None, *, polite: bool, kill_grace: float) -> None:
    """End every process of the command: SIGTERM, up to ``kill_grace`` seconds, then SIGKILL."""
    if info is None:  # unconfined: the process group
        if polite and proc.returncode is None:
            _killpg(proc.pid, signal.SIGTERM)
            await _wait(proc, kill_grace)
        _killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        return
    if proc.returncode is not None:
        return
    ns = await info.namespace()
    if ns is None:
        # bwrap never made its namespace: killing bwrap ends whatever it started (--die-with-parent).
        _killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        return
    init, inode = ns
    if polite:
        for pid in _members(inode, exclude=init):
            _signal_in(pid, inode, signal.SIGTERM)
        await _wait(proc, kill_grace)
    if proc.returncode is None:
        info.kill()
        if not await _wait(proc, 10.0):
            logger.error("sandbox {} did not end after SIGKILL of its namespace; killing bwrap", proc.pid)
            _killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


async def _end(info: Info) -> None:
    """Return only once the sandbox's PID namespace is empty.

    bwrap outside exits as soon as the command's main process has (its process 1 tells it so);
    process 1 then dies of ``--die-with-parent``, and the kernel kills the rest of the namespace
    before it lets process 1 finish exiting. Waiting for that makes "the call returned" mean
    "nothing of the command runs".
    """
    if not await info.gone(5.0):
        info.kill()
        if not await info.gone(10.0):
            logger.error("a sandbox's PID namespace outlived SIGKILL of its process 1")


async def _wait(proc: asyncio.subprocess.Process, seconds: float) -> bool:
    """Wait up to ``seconds`` for ``proc`` to exit; whether it did."""
    try:
        async with asyncio.timeout(seconds):
            await proc.wait()
    except TimeoutError:
        return False
    return True


def _killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _members(ns: int, *, exclude: int) -> list[int]:
    """PIDs of the processes in the PID namespace ``ns``."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != exclude and ns_of(int(entry)) == ns:
            pids.append(int(entry))
    return pids


def _signal_in(pid: int, ns: int, sig: signal.Signals) -> None:
    """Signal ``pid`` if it is (still) a process of namespace ``ns``; a pidfd pins it while we check."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        if ns_of(pid) == ns:
            signal.pidfd_send_signal(fd, sig)
    except OSError:
        pass
    finally:
        os.close(fd)
