"""A :class:`Sandbox`: the value that says where and how one command runs, and the bubblewrap
command line it builds.

How the bubblewrap command line is built, and why:

* Namespaces are listed one by one (user, pid, ipc, uts, and net unless the network is the
  host's: off, or an allow list reached through the daemon's proxy, :attr:`Sandbox.proxy`), never
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
"""

from __future__ import annotations

import base64
import functools
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from agent import allowlist
from agent.limits import CommandLimits, Group, LimitsUnavailable, limiter
from agent.redact import Redactor
from agent.sandbox import bridge, process, seccomp
from agent.sandbox.base import BASE_VARIABLES, DEFAULT_PATH, SandboxResult, SandboxUnavailable

if TYPE_CHECKING:
    from agent.sandbox.proxy import ProxyGate

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Run by bash in :meth:`Sandbox.launcher`, after the limits' entry lines: bwrap's ``--args`` input
#: (the secrets and the mounts, NUL-separated, base64 in GOALD_BWRAP_ARGS) goes from bash's
#: environment into a pipe on descriptor 3 (printf is a builtin: no process gets it as arguments),
#: is dropped from the environment, and bash becomes bwrap, which reads it with ``--args 3``.
_LAUNCH_VAR = "GOALD_BWRAP_ARGS"
#: The compiled system-call filter (base64), handed to bwrap the same way on descriptor 4.
_SECCOMP_VAR = "GOALD_SECCOMP"
_LAUNCH = (
    f"args=${_LAUNCH_VAR}; filter=${_SECCOMP_VAR}; unset {_LAUNCH_VAR} {_SECCOMP_VAR}; "
    'exec 3< <(printf %s "$args" | base64 -d) 4< <(printf %s "$filter" | base64 -d); unset args filter; exec "$@"'
)


@functools.lru_cache(maxsize=1)
def _setpriv() -> str:
    return shutil.which("setpriv", path=DEFAULT_PATH) or "/usr/bin/setpriv"


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
    #: A new IPC namespace per command; off only where the service may not make one (see
    #: :func:`agent.sandbox.detect_bwrap`), when commands share the service's private one.
    unshare_ipc: bool = True
    #: Seconds between SIGTERM and SIGKILL when a command times out.
    kill_grace: float = 2.0
    #: Paths shown read-only besides the system allowlist (a toolchain under ``/opt``, say).
    read_only: tuple[Path, ...] = ()
    #: Caps on the processes and memory (bwrap only): of every command with the same
    #: :attr:`limits_group` together, else of this command as a whole.
    limits: CommandLimits = field(default_factory=CommandLimits)
    #: Whose commands share one cgroup and the caps (a goal's id, or a session's): the command runs
    #: in a child group of that goal's group (:mod:`agent.limits`); ``None``: a group of its own.
    limits_group: str | None = None
    #: ``(uid, gid)`` bwrap runs as: the sandbox user when the daemon is root (never root itself:
    #: :mod:`agent.sandbox.identity`); ``None`` keeps the daemon's own (unprivileged) user.
    run_as: tuple[int, int] | None = None
    #: A network allow list (:mod:`agent.sandbox.network`): the daemon's proxy's gate for this
    #: command, bound in with the bridge before it (:mod:`agent.sandbox.bridge`); ``network`` is off.
    proxy: ProxyGate | None = None

    def __post_init__(self) -> None:
        if self.proxy is not None and self.network:
            raise SandboxUnavailable("a sandbox on the host's network has no proxy")
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
        if self.proxy is not None and self.kind == "bwrap":
            env.update(bridge.environment())
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
        args = [self.bwrap, "--unshare-user", "--unshare-pid", "--unshare-uts"]
        if self.unshare_ipc:
            args.append("--unshare-ipc")
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
        if self.proxy is not None:
            cmd = bridge.wrap(cmd)
        args += ["--chdir", str(self.workdir), "--", *cmd]
        return args

    def _mounts(self, workdir_fd: int | None) -> list[str]:
        try:
            sockets = [] if self.proxy is None else [(self.proxy.path, bridge.SOCKET)]
            return allowlist.mounts(self.workdir, self.read_only, self.hidden, workdir_fd=workdir_fd, sockets=sockets)
        except allowlist.MountError as exc:
            raise SandboxUnavailable(str(exc)) from None

    def setup_args(self, workdir_fd: int, seccomp_fd: int | None = None) -> bytes:
        """bwrap's ``--args`` input for :meth:`run`: the secrets' ``--setenv``, the mounts, the work
        directory bound from ``workdir_fd`` (a descriptor checked by :func:`agent.workdirs.open_workdir`,
        which bwrap closes once it is mounted) and the system-call filter read from ``seccomp_fd``
        (:mod:`agent.sandbox.seccomp`; bwrap closes it once loaded)."""
        parts = self._mounts(workdir_fd)
        if seccomp_fd is not None:
            parts += ["--seccomp", str(seccomp_fd)]
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
        if self.proxy is not None:  # its socket lives only while :meth:`run` runs a command
            raise SandboxUnavailable('a long-running server cannot have a network allow list: "off" or "host"')
        bash = shutil.which("bash", path=DEFAULT_PATH) or "/bin/bash"
        parts = [*self._mounts(None), "--seccomp", "4"]
        payload = self.secret_args() + b"".join(p.encode() + b"\0" for p in parts)
        script = (group.entry_script() if group is not None else "") + _LAUNCH
        env = {
            "PATH": DEFAULT_PATH,
            _LAUNCH_VAR: base64.b64encode(payload).decode("ascii"),
            _SECCOMP_VAR: base64.b64encode(seccomp.program()).decode("ascii"),
        }
        return [bash, "-c", script, "goald-sandbox", *self.user_switch(), *self.argv(cmd, setup_fd=3)], env

    def user_switch(self) -> list[str]:
        """What bwrap's command line starts with so that bwrap runs as :attr:`run_as` (a root daemon's
        sandbox user): ``setpriv`` sets the real, effective and saved ids, drops the supplementary
        groups (and with them every capability), then execs bwrap, keeping its descriptors. Not
        ``subprocess``'s ``user=``: with it CPython forks the whole daemon instead of vforking it,
        which costs a root daemon milliseconds per command, more the larger its memory
        (``benchmarks/bench_sandbox.py``). Empty when bwrap runs as the daemon's own user."""
        if self.run_as is None:
            return []
        uid, gid = self.run_as
        return [_setpriv(), f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]

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
        if self.proxy is None or self.kind == "none":
            return await process.run(self, cmd, timeout=timeout, output_cap=output_cap, merge_stderr=merge_stderr)
        async with self.proxy.hold():  # the proxy's socket for this command, while it runs
            return await process.run(self, cmd, timeout=timeout, output_cap=output_cap, merge_stderr=merge_stderr)
