"""What a daemon decides about sandboxes once, at start (:class:`SandboxProfile`, the detected
:class:`Bwrap`, the network proxy), and per goal (:class:`SandboxPolicy`); a profile builds each
command's :class:`~agent.sandbox.command.Sandbox`.

The network is one of three settings (:class:`~agent.sandbox.network.Network`): ``off``, an allow
list (the command gets a gate of the profile's :class:`~agent.sandbox.proxy.NetworkProxy`,
reporting where :meth:`SandboxProfile.sandbox` is told to), or ``host``. ``True`` and ``False``
are still taken where a network is given (``host`` and ``off``)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from loguru import logger

from agent.limits import CommandLimits
from agent.redact import Redactor
from agent.sandbox.base import SandboxUnavailable
from agent.sandbox.command import Sandbox
from agent.sandbox.identity import SandboxUser
from agent.sandbox.network import Network
from agent.sandbox.proxy import NetworkProxy, Report


@dataclass(frozen=True)
class Bwrap:
    """A usable bubblewrap binary."""

    path: str
    #: Whether it knows ``--disable-userns`` (bubblewrap 0.8 and later).
    disable_userns: bool = True
    #: Whether a command may have an IPC namespace of its own. The system unit forbids making one
    #: (``RestrictNamespaces=~cgroup ipc``, with ``PrivateIPC=yes``, to keep its exposure score
    #: while not mapping other users to nobody): commands then share the service's private IPC
    #: namespace (SysV IPC and POSIX message queues; ``/dev/shm`` stays private to each command).
    unshare_ipc: bool = True


def _probe(found: Bwrap) -> subprocess.CompletedProcess[bytes]:
    box = Sandbox(Path("/"), bwrap=found.path, disable_userns=found.disable_userns, unshare_ipc=found.unshare_ipc)
    return subprocess.run(box.argv(["true"]), env=box.environment(), capture_output=True, timeout=30)


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
        done = _probe(found)
        if done.returncode != 0:
            shared = Bwrap(path, disable_userns=found.disable_userns, unshare_ipc=False)
            if _probe(shared).returncode == 0:
                logger.info("the sandbox cannot make IPC namespaces here: commands share the service's own")
                return shared
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxUnavailable(f"{path} cannot be run: {exc}") from None
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip() or f"exit code {done.returncode}"
        raise SandboxUnavailable(f"{path} cannot make a sandbox here: {why}")
    return found


@dataclass(frozen=True)
class SandboxPolicy:
    """What one goal's commands get beyond the daemon's defaults (``[goal_sandbox.<key>]``, or given
    with the goal). Every field left at its default keeps the profile's value.

    Raises:
        ValueError: a read-only path is not absolute, or a cap is below its minimum.
    """

    #: The network (``off``, an allow list, ``host``); ``None`` keeps the default. A boolean is
    #: read as before (``True``: ``host``).
    network: Network | None = None
    #: Secret environment variables for this goal's commands only.
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    #: Paths shown read-only to this goal's commands, besides the profile's (a toolchain, say).
    read_only: tuple[Path, ...] = ()
    #: Cap on the processes of the goal's commands all together (parallel calls included);
    #: ``None`` keeps the default, 0 means no cap.
    max_processes: int | None = None
    #: Cap on the memory of the goal's commands all together, in bytes; ``None`` keeps the
    #: default, 0 means no cap.
    max_memory_bytes: int | None = None

    def __post_init__(self) -> None:
        given: object = self.network  # a boolean, as before the three settings, is still taken
        if isinstance(given, bool):
            object.__setattr__(self, "network", Network.of(given))
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
    #: The default network of goals' commands (a boolean is read as before: ``True`` is ``host``).
    network: Network = field(default_factory=Network)
    #: Policies by goal key.
    policies: Mapping[str, SandboxPolicy] = field(default_factory=dict)
    #: Redacts every secret the daemon knows (tool secrets and provider keys), from every tool.
    redactor: Redactor = field(default_factory=Redactor)
    kill_grace: float = 2.0
    #: Paths shown read-only to every command, besides the system allowlist.
    read_only: tuple[Path, ...] = ()
    #: Default caps of a goal's commands together (a goal's policy may change them).
    limits: CommandLimits = field(default_factory=CommandLimits)
    #: The unprivileged user bwrap runs as when the daemon is root (:mod:`agent.sandbox.identity`).
    user: SandboxUser | None = None
    #: The daemon's network proxy, for commands whose network is an allow list.
    proxy: NetworkProxy | None = None

    def __post_init__(self) -> None:
        given: object = self.network  # a boolean, as before the three settings, is still taken
        if isinstance(given, bool):
            object.__setattr__(self, "network", Network.of(given))

    def sandbox(
        self,
        workdir: Path,
        key: str | None = None,
        *,
        policy: SandboxPolicy | None = None,
        limits_group: str | None = None,
        report: Report | None = None,
    ) -> Sandbox:
        """The sandbox for a command in ``workdir``, under ``policy`` if given, else the configured
        policy of the goal ``key`` (if any). Commands of the same ``limits_group`` (a goal's id, or
        a session's) share one cgroup, under the policy's caps for all of them together; without
        it, the command's caps are its own. With an allow list, the command's attempts through the
        proxy go to ``report`` (default: the log).

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
        gate = None
        if self.kind == "none":
            return Sandbox.none(workdir, secrets=secrets, kill_grace=self.kill_grace)
        if self.bwrap is None:
            raise SandboxUnavailable("no usable bwrap was detected")
        if network.proxied:
            if self.proxy is None:
                raise SandboxUnavailable("a network allow list needs the daemon's network proxy, which is not running")
            gate = self.proxy.gate(network, report)
        own = Path(os.path.realpath(workdir))
        hidden = (*self.hidden, *(r for r in self.roots if Path(os.path.realpath(r)) != own))
        return Sandbox(
            workdir,
            hidden=hidden,
            network=network.host,
            proxy=gate,
            secrets=secrets,
            bwrap=self.bwrap.path,
            disable_userns=self.bwrap.disable_userns,
            unshare_ipc=self.bwrap.unshare_ipc,
            kill_grace=self.kill_grace,
            read_only=tuple(dict.fromkeys((*self.read_only, *policy.read_only))),
            limits=policy.limits(self.limits),
            limits_group=limits_group,
            run_as=None if self.user is None else self.user.ids,
        )
