"""The sandbox every tool command runs in: bubblewrap, or nothing when the config says so.

A :class:`Sandbox` is a small value: the work directory (the only writable place besides a private
``/tmp``), extra read-only paths (a toolchain), the paths to hide (the state directory, the
database, the control socket, the credentials, other work directories), whether the network is on,
the environment, secrets included, and caps on the command's processes and memory
(:class:`~agent.limits.CommandLimits`). :meth:`Sandbox.argv` is the bubblewrap command line;
:meth:`Sandbox.run` runs a command and returns its exit code, both output streams and the limit it
hit, if any.

**The daemon reads a work directory as data, never as configuration.** A work directory belongs
to the model: nothing in it (a ``.git/config`` with an fsmonitor or a pager, hooks, attributes, an
rc file, a ``.env``) may decide what the daemon runs outside the sandbox. Whatever executes on a
goal's behalf runs through a :class:`Sandbox`; the daemon itself only lists, stats and reads files
there.

How the bubblewrap command line is built, and why:

* Namespaces are listed one by one (user, pid, ipc, uts, and net when the network is off), never
  ``--unshare-all``: its cgroup namespace is refused under systemd's ``RestrictNamespaces=~cgroup``.
  ``--cap-drop ALL`` matters when the daemon runs as root (bwrap then keeps every capability in
  the sandbox, enough to unmount what hides the state directory); ``--disable-userns`` (bwrap ≥ 0.8)
  stops the command from making a user namespace of its own.
* The file system is an allowlist (:mod:`agent.allowlist`): the system directories a shell needs,
  read-only and without the secrets of ``/etc``, the goal's extra read-only paths, the work
  directory writable, a private ``/tmp``, ``/proc`` (of the new PID namespace) and ``/dev``.
  Nothing of ``/root``, ``/home``, ``/run``, ``/var`` (the state directory), the configuration or
  the credentials exists in it; a hidden path inside what is shown gets an empty read-only tmpfs
  (a directory) or ``/dev/null`` (a file).
* ``--clearenv``, then ``--setenv`` for PATH, HOME (the work directory), LANG and TMPDIR. Secrets
  are never put on the command line, which every local user can read in ``/proc/<pid>/cmdline``:
  :meth:`Sandbox.run` hands their ``--setenv`` arguments to bwrap through a pipe (``--args FD``),
  and the mounts with them, so no hidden path's name (configuration, state directory,
  credentials) is on the command line either. The work directory is bound from a descriptor
  checked just before (:mod:`agent.workdirs`: no symlink followed, the same directory as at set-up).
  A spawner that cannot pass a descriptor (the MCP SDK's) uses :meth:`Sandbox.launcher`: bash
  moves the secrets and the mounts from its environment into that pipe, so they are on no command
  line either.
* Limits: bwrap waits on that pipe before it does anything, which is when the daemon puts it into
  the command's cgroup (:mod:`agent.limits`); everything it starts inherits the group. Through
  :meth:`Sandbox.launcher` (an MCP server) the launching bash enters a group of its own
  (:meth:`Sandbox.limit_group`) before it becomes bwrap.
* ``--die-with-parent`` and the PID namespace make the sandbox end as one: when bwrap's process
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

Both output streams are read as they come and only their first and last ``output_cap / 2`` bytes
are kept (plus a margin as long as the longest secret, so redaction never meets a secret cut in
two); the middle of longer output is replaced with a marker. Secrets are redacted before
anything is returned.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from loguru import logger

from agent import allowlist, workdirs
from agent.errors import AgentError
from agent.limits import CommandLimits, Group, LimitsUnavailable, limiter
from agent.redact import Redactor

#: The sandbox's ``PATH``.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Variables every sandbox sets; extra variables and secrets may not replace them.
BASE_VARIABLES = frozenset({"PATH", "HOME", "LANG", "TMPDIR"})
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_READ = 65536
#: Run by bash in :meth:`Sandbox.launcher`, after the limits' entry lines: bwrap's ``--args`` input
#: (the secrets and the mounts, NUL-separated, base64 in GOALD_BWRAP_ARGS) goes from bash's
#: environment into a pipe on descriptor 3 (printf is a builtin: no process gets it as arguments),
#: is dropped from the environment, and bash becomes bwrap, which reads it with ``--args 3``.
_LAUNCH_VAR = "GOALD_BWRAP_ARGS"
_LAUNCH = f'args=${_LAUNCH_VAR}; unset {_LAUNCH_VAR}; exec 3< <(printf %s "$args" | base64 -d); unset args; exec "$@"'


class SandboxUnavailable(AgentError, RuntimeError):
    """A command cannot run in a sandbox here (bwrap is missing, or the work directory is unusable)."""


@dataclass(frozen=True)
class Bwrap:
    """A usable bubblewrap binary."""

    path: str
    #: Whether it knows ``--disable-userns`` (bubblewrap 0.8 and later).
    disable_userns: bool = True


def detect_bwrap(name: str = "bwrap") -> Bwrap:
    """Find bwrap and check that it can make a sandbox here (user namespaces may be off).

    Raises:
        SandboxUnavailable: saying why not.
    """
    path = shutil.which(name)
    if path is None:
        raise SandboxUnavailable(f"{name!r} (bubblewrap) is not installed or not on PATH")
    try:
        helped = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=10)
        found = Bwrap(path, disable_userns="--disable-userns" in helped.stdout)
        probe = Sandbox(Path("/"), bwrap=found.path, disable_userns=found.disable_userns)
        done = subprocess.run(probe.argv(["true"]), env=probe.environment(), capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxUnavailable(f"{path} cannot be run: {exc}") from None
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip() or f"exit code {done.returncode}"
        raise SandboxUnavailable(f"{path} cannot make a sandbox here: {why}")
    return found


@dataclass(frozen=True)
class SandboxResult:
    """What a command did."""

    #: Its exit code (``128 + N`` when signal N ended it); ``None`` when it timed out.
    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    seconds: float = 0.0
    #: Bytes each stream produced, shown or not.
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    #: The limit the command hit, in words (``"process limit (64) reached: ..."``); ``None`` if none.
    limit: str | None = None

    @property
    def ok(self) -> bool:
        """Exit code 0 within the timeout."""
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True)
class Sandbox:
    """Where and how one command runs. A value: build one per call, it holds no process."""

    workdir: Path
    #: Paths the command must not see (directories get an empty read-only tmpfs, files /dev/null).
    hidden: tuple[Path, ...] = ()
    network: bool = False
    #: Extra environment variables (not secret).
    env: Mapping[str, str] = field(default_factory=dict)
    #: Secret environment variables: given to the command, redacted from everything it prints.
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    kind: Literal["bwrap", "none"] = "bwrap"
    bwrap: str = "bwrap"
    disable_userns: bool = True
    #: Seconds between SIGTERM and SIGKILL when a command times out.
    kill_grace: float = 2.0
    #: Paths shown read-only besides the system allowlist (a toolchain under ``/opt``, say).
    read_only: tuple[Path, ...] = ()
    #: Caps on the processes and memory of each command as a whole (bwrap only).
    limits: CommandLimits = field(default_factory=CommandLimits)

    def __post_init__(self) -> None:
        if not self.workdir.is_absolute():
            raise SandboxUnavailable(f"the work directory {str(self.workdir)!r} is not an absolute path")
        for path in self.read_only:
            if not Path(path).is_absolute():
                raise SandboxUnavailable(f"the read-only path {str(path)!r} is not an absolute path")
        for name in (*self.env, *self.secrets):
            if not _NAME.match(name):
                raise SandboxUnavailable(f"{name!r} is not a valid environment variable name")
            if name in BASE_VARIABLES:
                raise SandboxUnavailable(f"{name} is set by the sandbox and cannot be replaced")

    @classmethod
    def none(
        cls,
        workdir: Path,
        *,
        env: Mapping[str, str] | None = None,
        secrets: Mapping[str, str] | None = None,
        kill_grace: float = 2.0,
    ) -> Sandbox:
        """No sandbox (``sandbox = "none"``): the command runs as the daemon's user, in its own process
        group, with the same scrubbed environment."""
        return cls(workdir, env=dict(env or {}), secrets=dict(secrets or {}), kind="none", kill_grace=kill_grace)

    @property
    def redactor(self) -> Redactor:
        """Redacts this sandbox's secrets."""
        return Redactor(self.secrets.values())

    def environment(self, *, secrets: bool = True) -> dict[str, str]:
        """The command's whole environment: nothing of the daemon's is inherited."""
        env = {"PATH": DEFAULT_PATH, "HOME": str(self.workdir), "LANG": "C.UTF-8", "TMPDIR": "/tmp", **self.env}
        return {**env, **self.secrets} if secrets else env

    def secret_args(self) -> bytes:
        """bwrap's ``--args`` input that sets the secrets (NUL-separated ``--setenv NAME VALUE``)."""
        parts = [p for name, value in self.secrets.items() for p in ("--setenv", name, value)]
        return b"".join(p.encode() + b"\0" for p in parts)

    def argv(self, cmd: Sequence[str], *, secrets_fd: int | None = None, setup_fd: int | None = None) -> list[str]:
        """The command line that runs ``cmd`` in this sandbox.

        The secrets are not in it: with ``secrets_fd`` bwrap reads them from that descriptor
        (:meth:`secret_args`). With ``setup_fd`` (how :meth:`run` starts bwrap) the secrets *and* the
        mounts (:meth:`setup_args`) come from that descriptor, so no path to hide (the configuration,
        the state directory, the credentials) is named on any command line either. Unconfined, the
        command line is ``cmd`` itself, to be run with :meth:`environment`.
        """
        if not cmd:
            raise ValueError("an empty command")
        if self.kind == "none":
            return list(cmd)
        args = [self.bwrap, "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
        if not self.network:
            args.append("--unshare-net")
        if self.disable_userns:
            args.append("--disable-userns")
        args += ["--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv"]
        for name, value in self.environment(secrets=False).items():
            args += ["--setenv", name, value]
        if setup_fd is not None:
            args += ["--args", str(setup_fd)]
        else:
            if secrets_fd is not None:
                args += ["--args", str(secrets_fd)]
            args += self._mounts(None)
        args += ["--chdir", str(self.workdir), "--", *cmd]
        return args

    def _mounts(self, workdir_fd: int | None) -> list[str]:
        source = None if workdir_fd is None else f"/proc/self/fd/{workdir_fd}"
        try:
            return allowlist.mounts(self.workdir, self.read_only, self.hidden, workdir_source=source)
        except allowlist.MountError as exc:
            raise SandboxUnavailable(str(exc)) from None

    def setup_args(self, workdir_fd: int) -> bytes:
        """bwrap's ``--args`` input for :meth:`run`: the secrets' ``--setenv`` and the mounts, the work
        directory bound from ``workdir_fd`` (a descriptor checked by :func:`agent.workdirs.open_workdir`)."""
        parts = self._mounts(workdir_fd)
        return self.secret_args() + b"".join(p.encode() + b"\0" for p in parts)

    def launcher(self, cmd: Sequence[str], *, group: Group | None = None) -> tuple[list[str], dict[str, str]]:
        """A command line and an environment that start ``cmd`` in this sandbox through a spawner that
        passes no descriptors (the MCP SDK's): the secrets and the mounts ride in the environment of
        a bash that hands them to bwrap through a pipe, so no command line carries them (nor any
        hidden path's name). With ``group`` (:meth:`limit_group`) that bash first puts itself under
        the limits (:meth:`~agent.limits.Group.entry_script`), or exits 70, and only then becomes
        bwrap: everything of the server inherits them. Unconfined, limits do not apply."""
        if self.kind == "none":
            return list(cmd), self.environment()
        bash = shutil.which("bash", path=DEFAULT_PATH) or "/bin/bash"
        payload = self.secret_args() + b"".join(p.encode() + b"\0" for p in self._mounts(None))
        script = (group.entry_script() if group is not None else "") + _LAUNCH
        env = {"PATH": DEFAULT_PATH, _LAUNCH_VAR: base64.b64encode(payload).decode("ascii")}
        return [bash, "-c", script, "goald-sandbox", *self.argv(cmd, setup_fd=3)], env

    def limit_group(self) -> Group | None:
        """A new group under this sandbox's limits for one long-running command started through
        :meth:`launcher` (``None``: unconfined, or no caps). The caller removes it when the command
        has exited (:meth:`~agent.limits.Group.remove`).

        Raises:
            SandboxUnavailable: the limits could not be set up.
        """
        if self.kind == "none" or not self.limits.active:
            return None
        try:
            return limiter().group(self.limits)
        except LimitsUnavailable as exc:
            raise SandboxUnavailable(str(exc)) from None

    # The timeout is not the caller's deadline (asyncio.timeout): at it the command is killed, and reported.
    async def run(
        self,
        cmd: Sequence[str],
        *,
        timeout: float,  # noqa: ASYNC109
        output_cap: int = 64_000,
        merge_stderr: bool = False,
    ) -> SandboxResult:
        """Run ``cmd`` (e.g. ``["bash", "-c", line]``); on timeout kill all of it.

        The result carries at most about ``output_cap`` characters of each stream, secrets redacted.
        Cancelling the call kills the command at once.

        Raises:
            SandboxUnavailable: the sandbox could not be started (bwrap missing, no work directory).
        """
        try:
            # Checked now, bound by descriptor below: a work directory swapped for a symlink (or
            # another directory) since the session was set up is refused, never followed.
            workdir_fd = workdirs.open_workdir(self.workdir)
        except OSError as exc:
            raise SandboxUnavailable(str(exc)) from None
        redactor = self.redactor
        info = _Info() if self.kind == "bwrap" else None
        group: Group | None = None
        args = _ArgsPipe()
        fds: tuple[int, ...] = ()
        try:
            if info is None:
                argv = self.argv(cmd)
            else:
                if self.limits.active:
                    try:
                        group = limiter().group(self.limits)
                    except LimitsUnavailable as exc:
                        raise SandboxUnavailable(str(exc)) from None
                # bwrap waits for these arguments: the time to put it into its cgroup.
                args.open(self.setup_args(workdir_fd), hold=group is not None)
                argv = self.argv(cmd, setup_fd=args.read_fd)
                argv[1:1] = ["--info-fd", str(info.write_fd)]
                fds = (info.write_fd, args.read_fd, workdir_fd)
            started = time.monotonic()
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    cwd=str(self.workdir) if info is None else "/",
                    env=self.environment() if info is None else {"PATH": DEFAULT_PATH},
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                    start_new_session=True,
                    pass_fds=fds,
                )
            except OSError as exc:
                raise SandboxUnavailable(f"cannot start {argv[0]}: {exc.strerror or exc}") from None
            finally:
                args.close_read()
                os.close(workdir_fd)
                workdir_fd = -1
            if group is not None:
                try:
                    group.enter(proc.pid)
                except LimitsUnavailable as exc:
                    _killpg(proc.pid, signal.SIGKILL)  # before it gets its arguments and runs unlimited
                    args.close()
                    await proc.wait()
                    raise SandboxUnavailable(str(exc)) from None
            args.release()
        except BaseException:
            args.close()
            if workdir_fd >= 0:
                os.close(workdir_fd)
            if info is not None:
                info.close()
            if group is not None:
                await asyncio.shield(group.remove())
            raise
        if info is not None:
            info.started()
        out = _Capture(output_cap, redactor.longest)
        err = _Capture(output_cap, redactor.longest)
        pumps = [asyncio.ensure_future(_pump(proc.stdout, out)), asyncio.ensure_future(_pump(proc.stderr, err))]
        waiter = asyncio.ensure_future(proc.wait())
        timed_out = False
        verdict: str | None = None
        try:
            _, pending = await asyncio.wait([waiter, *pumps], timeout=timeout)
            if pending:
                timed_out = True
                await self._stop(proc, info, polite=True)
                # Unconfined, an escaped process may still hold the pipes: give up on them.
                await asyncio.wait(pumps, timeout=2.0)
            elif info is None:
                _killpg(proc.pid, signal.SIGKILL)  # what the command left behind in its group
        except BaseException:
            await asyncio.shield(self._stop(proc, info, polite=False))
            raise
        finally:
            for task in (waiter, *pumps):
                task.cancel()
            await asyncio.gather(waiter, *pumps, return_exceptions=True)
            if info is not None:
                try:
                    await asyncio.shield(_end(info))
                finally:
                    info.close()
            if group is not None:
                verdict = group.verdict()
                await asyncio.shield(group.remove())
        code = proc.returncode
        assert code is not None
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

    async def _stop(self, proc: asyncio.subprocess.Process, info: _Info | None, *, polite: bool) -> None:
        """End every process of the command: SIGTERM, up to ``kill_grace`` seconds, then SIGKILL."""
        if info is None:  # unconfined: the process group
            if polite and proc.returncode is None:
                _killpg(proc.pid, signal.SIGTERM)
                await _wait(proc, self.kill_grace)
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
            await _wait(proc, self.kill_grace)
        if proc.returncode is None:
            info.kill()
            if not await _wait(proc, 10.0):
                logger.error("sandbox {} did not end after SIGKILL of its namespace; killing bwrap", proc.pid)
                _killpg(proc.pid, signal.SIGKILL)
                await proc.wait()


async def _end(info: _Info) -> None:
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


class _Info:
    """bwrap's ``--info-fd``: the sandbox's process 1 (held by a pidfd) and its PID namespace."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        self._buf = b""
        self._done = asyncio.Event()
        self._value: tuple[int, int] | None = None
        self._pidfd = -1
        self._watching = False

    def started(self) -> None:
        os.close(self.write_fd)
        self.write_fd = -1
        asyncio.get_running_loop().add_reader(self.read_fd, self._readable)
        self._watching = True

    def _readable(self) -> None:
        try:
            chunk = os.read(self.read_fd, 4096)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        self._buf += chunk
        if chunk:
            with contextlib.suppress(ValueError):
                data = json.loads(self._buf)
                self._value = (int(data["child-pid"]), int(data["pid-namespace"]))
                self._pin()
                self._finish()
        else:
            self._finish()

    def _pin(self) -> None:
        # A pidfd, checked against the namespace after it is opened, is process 1 itself even if
        # its PID is reused later; failing either, process 1 is gone already.
        assert self._value is not None
        init, inode = self._value
        try:
            fd = os.pidfd_open(init)
        except OSError:
            return
        if _ns_of(init) == inode:
            self._pidfd = fd
        else:
            os.close(fd)

    def _finish(self) -> None:
        if self._watching:
            asyncio.get_running_loop().remove_reader(self.read_fd)
            self._watching = False
        self._done.set()

    async def namespace(self) -> tuple[int, int] | None:
        """``(pid of process 1, PID namespace inode)``; ``None`` if bwrap never got that far."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2.0):
                await self._done.wait()
        return self._value

    def kill(self) -> None:
        """SIGKILL process 1: the kernel then kills every process of the namespace."""
        if self._pidfd >= 0:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    async def gone(self, seconds: float) -> bool:
        """Wait up to ``seconds`` until process 1 has exited, which the kernel lets it do only once
        every other process of the namespace is gone; whether it has."""
        await self.namespace()
        if self._pidfd < 0:
            return True
        ended = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_reader(self._pidfd, ended.set)  # a pidfd reads ready once its process has exited
        try:
            async with asyncio.timeout(seconds):
                await ended.wait()
        except TimeoutError:
            return False
        finally:
            loop.remove_reader(self._pidfd)
        return True

    def close(self) -> None:
        if self._watching:
            self._finish()
        for fd in (self.read_fd, self.write_fd, self._pidfd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.read_fd = self.write_fd = self._pidfd = -1


class _ArgsPipe:
    """bwrap's ``--args`` pipe: written at once, or held (bwrap waits on it) until :meth:`release`."""

    def __init__(self) -> None:
        self.read_fd = self.write_fd = -1
        self._data = b""

    def open(self, data: bytes, *, hold: bool) -> None:
        if len(data) > 60_000:  # a pipe's buffer; more would block before bwrap reads it
            raise SandboxUnavailable("the sandbox's arguments (its secrets and mounts) are over 60 kB")
        self.read_fd, self.write_fd = os.pipe()
        self._data = data
        if not hold:
            self.release()

    def release(self) -> None:
        """Write the arguments and close the pipe: bwrap goes on."""
        if self.write_fd >= 0:
            try:
                if self._data:
                    os.write(self.write_fd, self._data)
            finally:
                os.close(self.write_fd)
                self.write_fd = -1

    def close_read(self) -> None:
        if self.read_fd >= 0:
            os.close(self.read_fd)
            self.read_fd = -1

    def close(self) -> None:
        """Close both ends without writing anything."""
        self.close_read()
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1


def _killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _ns_of(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def _members(ns: int, *, exclude: int) -> list[int]:
    """PIDs of the processes in the PID namespace ``ns``."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != exclude and _ns_of(int(entry)) == ns:
            pids.append(int(entry))
    return pids


def _signal_in(pid: int, ns: int, sig: signal.Signals) -> None:
    """Signal ``pid`` if it is (still) a process of namespace ``ns``; a pidfd pins it while we check."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        if _ns_of(pid) == ns:
            signal.pidfd_send_signal(fd, sig)
    except OSError:
        pass
    finally:
        os.close(fd)


class _Capture:
    """The first and the last ``cap / 2`` bytes of a stream (plus a margin each side), and its size."""

    def __init__(self, cap: int, margin: int) -> None:
        self.cap = max(cap, 2)
        self.margin = margin
        self.head_keep = self.cap // 2
        self.tail_keep = self.cap - self.head_keep
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_keep + self.margin - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            limit = self.tail_keep + self.margin
            if len(self.tail) > 4 * limit:
                del self.tail[: len(self.tail) - limit]

    def text(self, redactor: Redactor) -> str:
        limit = self.tail_keep + self.margin
        if len(self.tail) > limit:
            del self.tail[: len(self.tail) - limit]
        if len(self.head) + len(self.tail) == self.total:
            whole = redactor.redact(bytes(self.head + self.tail).decode("utf-8", errors="replace"))
            if self.total <= self.cap:
                return whole
            return _cut(whole[: self.head_keep], whole[-self.tail_keep :], self.total)
        # The middle is gone: each piece is redacted whole first, then its margin (where a secret
        # may have been cut in two) is dropped.
        head = redactor.redact(bytes(self.head).decode("utf-8", errors="replace"))
        tail = redactor.redact(bytes(self.tail).decode("utf-8", errors="replace"))
        head = head[: max(0, min(self.head_keep, len(head) - self.margin))]
        tail = tail[min(len(tail), max(self.margin, len(tail) - self.tail_keep)) :]
        return _cut(head, tail, self.total)


def _cut(head: str, tail: str, total: int) -> str:
    return f"{head}\n[... output truncated: {total} bytes in all; the middle is not shown ...]\n{tail}"


async def _pump(stream: asyncio.StreamReader | None, capture: _Capture) -> None:
    if stream is None:
        return
    while True:
        data = await stream.read(_READ)
        if not data:
            return
        capture.feed(data)


@dataclass(frozen=True)
class SandboxPolicy:
    """What one goal's commands get beyond the daemon's defaults (``[goal_sandbox.<key>]``, or given
    with the goal). Every field left at its default keeps the profile's value.

    Raises:
        ValueError: a read-only path is not absolute, or a cap is below its minimum.
    """

    #: The network on or off; ``None`` keeps the default.
    network: bool | None = None
    #: Secret environment variables for this goal's commands only.
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    #: Paths shown read-only to this goal's commands, besides the profile's (a toolchain, say).
    read_only: tuple[Path, ...] = ()
    #: Cap on the processes of each command; ``None`` keeps the default, 0 means no cap.
    max_processes: int | None = None
    #: Cap on the memory of each command, in bytes; ``None`` keeps the default, 0 means no cap.
    max_memory_bytes: int | None = None

    def __post_init__(self) -> None:
        for path in self.read_only:
            if not Path(path).is_absolute():
                raise ValueError(f"the read-only path {str(path)!r} is not an absolute path")
        CommandLimits(self.max_processes or None, self.max_memory_bytes or None)  # checks the minimums

    def limits(self, default: CommandLimits) -> CommandLimits:
        """This policy's caps over ``default``."""
        return CommandLimits(
            default.max_processes if self.max_processes is None else self.max_processes or None,
            default.max_memory_bytes if self.max_memory_bytes is None else self.max_memory_bytes or None,
        )


@dataclass(frozen=True)
class SandboxProfile:
    """How a daemon builds the sandbox of each command: one per daemon, built at start."""

    kind: Literal["bwrap", "none"] = "bwrap"
    bwrap: Bwrap | None = None
    #: Why sandboxed commands cannot run at all (``kind = "bwrap"`` without a usable bwrap).
    unavailable: str | None = None
    #: Always hidden: state directory, database and socket directories, configuration, credentials.
    hidden: tuple[Path, ...] = ()
    #: Work-directory roots: hidden, except the one that is a command's own work directory.
    roots: tuple[Path, ...] = ()
    network: bool = False
    #: Policies by goal key.
    policies: Mapping[str, SandboxPolicy] = field(default_factory=dict)
    #: Redacts every secret the daemon knows (tool secrets and provider keys), from every tool.
    redactor: Redactor = field(default_factory=Redactor)
    kill_grace: float = 2.0
    #: Paths shown read-only to every command, besides the system allowlist.
    read_only: tuple[Path, ...] = ()
    #: Default caps of each command (a goal's policy may change them).
    limits: CommandLimits = field(default_factory=CommandLimits)

    def sandbox(self, workdir: Path, key: str | None = None, *, policy: SandboxPolicy | None = None) -> Sandbox:
        """The sandbox for a command in ``workdir``, under ``policy`` if given, else the configured
        policy of the goal ``key`` (if any).

        Raises:
            SandboxUnavailable: saying why no command can run.
        """
        if self.unavailable is not None:
            raise SandboxUnavailable(self.unavailable)
        if policy is None and key is not None:
            policy = self.policies.get(key)
        policy = policy or SandboxPolicy()
        secrets = dict(policy.secrets)
        network = self.network if policy.network is None else policy.network
        if self.kind == "none":
            return Sandbox.none(workdir, secrets=secrets, kill_grace=self.kill_grace)
        if self.bwrap is None:
            raise SandboxUnavailable("no usable bwrap was detected")
        own = Path(os.path.realpath(workdir))
        hidden = (*self.hidden, *(r for r in self.roots if Path(os.path.realpath(r)) != own))
        return Sandbox(
            workdir,
            hidden=hidden,
            network=network,
            secrets=secrets,
            bwrap=self.bwrap.path,
            disable_userns=self.bwrap.disable_userns,
            kill_grace=self.kill_grace,
            read_only=tuple(dict.fromkeys((*self.read_only, *policy.read_only))),
            limits=policy.limits(self.limits),
        )
