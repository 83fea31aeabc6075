"""The sandbox's settings: caps on commands, each goal's sandbox and tool secrets, the MCP servers
(which run in the sandbox), and :func:`sandbox_profile`, how the daemon sandboxes commands.

The network of goals' commands is one of three settings (:mod:`agent.sandbox.network`):
``sandbox_network`` (and ``[goal_sandbox.<key>] network``) is ``"off"`` (the default), ``{allow =
["api.github.com", ...]}`` (through the daemon's proxy, :mod:`agent.sandbox.proxy`: every attempt
a ``sandbox/network`` event), or ``"host"`` (unsafe: the host's loopback and abstract sockets
too). ``true``/``false``, the older values, are still read (``"host"``/``"off"``), and
:func:`network_findings` says so; it also names what ``"host"`` exposes. MCP servers and
notification commands keep a boolean (``true``: the host's network).

Re-exported from :mod:`daemon.settings`. Secrets are read here, when the profile is built at start,
and every value read feeds the profile's redactor, so no tool output shows one.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from loguru import logger
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from agent import Redactor, SandboxPolicy, SandboxProfile, SandboxUnavailable, detect_bwrap
from agent.allowlist import etc_secrets
from agent.limits import MIB, MIN_MEMORY_BYTES, MIN_PROCESSES, CommandLimits, limiter
from agent.sandbox import BASE_VARIABLES, SandboxUser, sandbox_user
from agent.sandbox.identity import prepare_root
from agent.sandbox.network import Network, NetworkSetting, deprecated
from agent.sandbox.proxy import NetworkProxy
from agent.secret import SecretSource
from daemon.provider_settings import read_secret

if TYPE_CHECKING:
    from daemon.settings import Settings


def _absolute_path(value: Path) -> Path:
    path = value.expanduser()
    if not path.is_absolute():
        raise ValueError(f"must be an absolute path, got {str(value)!r}")
    return path


#: A path a sandbox shows read-only: absolute (``~`` expanded).
ReadOnlyPath = Annotated[Path, AfterValidator(_absolute_path)]


def _cap(minimum: int, unit: str) -> AfterValidator:
    def check(value: int) -> int:
        if value != 0 and value < minimum:
            raise ValueError(f"must be 0 (no cap) or at least {minimum}{unit}")
        return value

    return AfterValidator(check)


#: A cap on a command's processes: 0 (no cap) or at least :data:`~agent.limits.MIN_PROCESSES`.
Processes = Annotated[int, Field(ge=0), _cap(MIN_PROCESSES, "")]
#: A cap on a command's memory in MiB: 0 (no cap) or at least 16.
MemoryMb = Annotated[int, Field(ge=0), _cap(MIN_MEMORY_BYTES // MIB, " MiB")]
#: A limit on what a goal's work directory holds on disk, in MiB: 0 (no limit) or more.
DiskMb = Annotated[int, Field(ge=0, le=1024 * 1024 * 1024)]


class McpServerSettings(BaseModel):
    """One stdio MCP server; its tools are offered to every session as ``NAME__TOOL``."""

    model_config = ConfigDict(extra="forbid")

    #: The command line that starts the server (run in the sandbox when ``sandbox = "bwrap"``).
    command: list[str] = Field(min_length=1)
    #: Extra environment variables for the server.
    env: dict[str, str] = {}
    #: Whether the server may use the network (in the bwrap sandbox; unconfined it always can).
    network: bool = False
    #: Paths the server's sandbox shows read-only besides the system directories (its installation).
    read_only_paths: list[ReadOnlyPath] = []
    #: Seconds to wait for the server's handshake and tool listing.
    start_timeout_seconds: float = Field(default=30.0, gt=0)
    #: Each tool call's timeout.
    timeout_seconds: float = Field(default=60.0, gt=0)
    #: Cap on the server's processes (default: ``sandbox_max_processes``; 0: none).
    max_processes: Processes | None = None
    #: Cap on the server's memory, in MiB (default: ``sandbox_max_memory_mb``; 0: none).
    max_memory_mb: MemoryMb | None = None


class GoalSandbox(BaseModel):
    """The sandbox of one goal's commands (``[goal_sandbox.<goal key>]``)."""

    model_config = ConfigDict(extra="forbid")

    #: The network of this goal's commands: ``"off"``, ``{allow = [names]}``, ``"host"`` (unsafe)
    #: (default: ``sandbox_network``; the stricter of this and a goal's own ``sandbox`` wins).
    network: NetworkSetting | None = None
    #: Environment variables of this goal's commands only, by name; their values are redacted from tool output.
    secrets: dict[str, SecretSource] = {}
    #: Paths this goal's commands see read-only besides the system directories (a toolchain under /opt).
    read_only_paths: list[ReadOnlyPath] = []
    #: Cap on the processes of this goal's commands all together (default: ``sandbox_max_processes``; 0: none).
    max_processes: Processes | None = None
    #: Cap on the memory of this goal's commands all together, in MiB (default: ``sandbox_max_memory_mb``; 0: none).
    max_memory_mb: MemoryMb | None = None
    #: What this goal's work directory may hold on disk, in MiB (default: ``sandbox_max_disk_mb``; 0: none).
    max_disk_mb: DiskMb | None = None

    @field_validator("secrets")
    @classmethod
    def _names(cls, value: dict[str, SecretSource]) -> dict[str, SecretSource]:
        for name in value:
            if not name.isidentifier() or not name.isascii():
                raise ValueError(f"{name!r} is not a valid environment variable name")
            if name in BASE_VARIABLES:
                raise ValueError(f"{name} is set by the sandbox itself")
        return value


def sandbox_profile(settings: Settings) -> SandboxProfile:
    """How the daemon sandboxes commands: bwrap found (or ``sandbox = "none"``), what is hidden, each
    goal's network and secrets, and a redactor for every secret the daemon holds.

    Logs a warning for ``sandbox = "none"``, an error when bwrap is wanted but cannot work (shell
    tools are then not offered), and an error for each named tool secret that has no value.
    """
    policies, values = _goal_policies(settings)
    profile = SandboxProfile(
        kind=settings.sandbox,
        hidden=tuple(_hidden_paths(settings)),
        roots=tuple(settings.roots),
        network=Network.of(settings.sandbox_network),
        policies=policies,
        redactor=Redactor(values + _daemon_secrets(settings)),
        read_only=tuple(settings.sandbox_read_only_paths),
        limits=CommandLimits.of(settings.sandbox_max_processes, settings.sandbox_max_memory_mb),
    )
    if settings.sandbox == "none":
        logger.warning('sandbox = "none": shell and verification commands run unconfined, as the daemon\'s user')
        return profile
    try:
        found = detect_bwrap()
    except SandboxUnavailable as exc:
        why = f'{exc}; install bubblewrap, or set sandbox = "none" to run commands unconfined'
        logger.error("no sandbox: {}. The shell tool is not offered and verification commands fail", why)
        return dataclasses.replace(profile, unavailable=why)
    try:
        user = sandbox_user(settings.sandbox_user)
    except SandboxUnavailable as exc:
        logger.error("no sandbox: {}. The shell tool is not offered and verification commands fail", exc)
        return dataclasses.replace(profile, unavailable=str(exc))
    if user is not None:
        _let_through(settings, user)
        logger.info("sandboxed commands run as {} (uid {}, gid {}): the daemon is root", user.name, user.uid, user.gid)
    network = Network.of(settings.sandbox_network)
    logger.info("sandbox: {} (network {})", found.path, network.describe())
    for finding in network_findings(settings):
        logger.warning("{}", finding)
    # Found once per process: at start (logged, a fallback to rlimits as a warning), not in the first command.
    etc_secrets()
    if profile.limits.active or any(p.max_processes or p.max_memory_bytes for p in policies.values()):
        limiter()
    # Nothing listens until a command with an allow list runs (a goal may bring one at any time).
    proxy = NetworkProxy(
        owner=None if user is None else user.ids,
        hosts={name: [str(a) for a in addresses] for name, addresses in settings.sandbox_network_hosts.items()},
    )
    return dataclasses.replace(profile, bwrap=found, user=user, proxy=proxy)


#: What ``"host"`` hands a command, in words (``goald config check`` and the log at start).
HOST_EXPOSES = (
    "the host's network (unsafe): its commands reach the host's loopback (the model provider, the status page,"
    " a PostgreSQL store on 127.0.0.1), its abstract unix sockets and every address the host reaches;"
    ' give the names they need instead: network = {allow = ["api.github.com", ...]}'
)


def network_findings(settings: Settings) -> list[str]:
    """What to say of the configured networks: each ``"host"`` (what it exposes) and each boolean
    (deprecated), as ``key: message``."""
    found: list[str] = []
    places: list[tuple[str, NetworkSetting | None]] = [("sandbox_network", settings.sandbox_network)]
    places += [(f"goal_sandbox.{key}.network", conf.network) for key, conf in settings.goal_sandbox.items()]
    for key, value in places:
        if value is None:
            continue
        if Network.of(value).host:
            found.append(f"{key}: {HOST_EXPOSES}")
        if (note := deprecated(value)) is not None:
            found.append(f"{key}: {note}")
    for index, sink in enumerate(settings.notify.sinks):
        if sink.type == "command" and Network.of(sink.network).host:
            found.append(f"notify.sinks[{index}].network: {HOST_EXPOSES}")
    for name, server in settings.mcp_servers.items():
        if server.network:
            found.append(f"mcp_servers.{name}.network: true is {HOST_EXPOSES.split(';')[0]}")
    return found


def _let_through(settings: Settings, user: SandboxUser) -> None:
    """A root daemon: the work-directory roots (and a state directory that holds one) let the
    sandbox user through to bind a work directory, and nobody else (``0710``, its group)."""
    state = settings.state_dir.expanduser()
    for root in settings.roots:
        if root.is_relative_to(state) and state.is_dir():
            os.chown(state, -1, user.gid)
            os.chmod(state, 0o710)
        prepare_root(root, user)


def _goal_policies(settings: Settings) -> tuple[dict[str, SandboxPolicy], list[str]]:
    """Each ``[goal_sandbox.<key>]`` as a policy, and the values of the tool secrets they read."""
    policies: dict[str, SandboxPolicy] = {}
    values: list[str] = []
    for key, conf in settings.goal_sandbox.items():
        secrets: dict[str, str] = {}
        for name, ref in conf.secrets.items():
            value = ref.read()
            if value is None:
                logger.error("tool secret {} of goal {!r} has no value ({}); left unset", name, key, ref.describe())
                continue
            secrets[name] = value
        values += secrets.values()
        policies[key] = SandboxPolicy(
            network=None if conf.network is None else Network.of(conf.network),
            secrets=secrets,
            read_only=tuple(conf.read_only_paths),
            max_processes=conf.max_processes,
            max_memory_bytes=conf.max_memory_mb * MIB if conf.max_memory_mb is not None else None,
        )
    return policies, values


def _daemon_secrets(settings: Settings) -> list[str]:
    """The providers' API keys and the MCP servers' environments: redacted from every tool's output."""
    values: list[str] = []
    for provider in settings.providers.values():
        api_key = read_secret(provider)
        if api_key:
            values.append(api_key)
    for server in settings.mcp_servers.values():
        values += server.env.values()  # MCP servers' environments carry tokens
    return values


def _hidden_paths(settings: Settings) -> list[Path]:
    """What no sandboxed command sees: the daemon's state, database, socket, configuration and credentials."""
    hidden = [settings.state_dir.expanduser(), settings.database_path.parent, settings.socket_path.parent]
    if settings.config_file is not None:
        hidden.append(settings.config_file)
    # systemd's credentials, and the directories it made for the unit (/etc/goald holds the config).
    hidden.append(Path("/run/credentials"))
    for variable in (
        "CREDENTIALS_DIRECTORY",
        "STATE_DIRECTORY",
        "RUNTIME_DIRECTORY",
        "CONFIGURATION_DIRECTORY",
        "CACHE_DIRECTORY",
        "LOGS_DIRECTORY",
    ):
        hidden += [Path(p) for p in os.environ.get(variable, "").split(":") if p.startswith("/")]
    if settings.goals_file is not None:
        hidden.append(settings.goals_file.expanduser())
    return hidden
