"""Settings: one TOML file plus ``GOALD_*`` environment overrides.

Precedence, highest first: ``GOALD_*`` environment variables (nested keys with ``__``, e.g.
``GOALD_PROVIDERS__LOCAL__BASE_URL``), then the TOML file, then the defaults below. An invalid file
stops the daemon before it starts, with the key and the reason (:class:`ConfigError`). Secrets are
never printed: ``goald config check`` shows them masked, and provider keys are normally named
(an environment variable or a systemd credential), not written into the file.

The sections with their own concern live beside this module and are re-exported from it, so
callers import every settings name from here: providers (:mod:`daemon.provider_settings`), the
sandbox, goal sandboxes, tool secrets and MCP servers (:mod:`daemon.sandbox_settings`);
notifications, the cluster, the web page, the metrics and the store's disk each in its module.
Retention (:class:`RetentionSettings`) is here.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    IPvAnyAddress,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from agent import McpServer, ToolPolicy
from agent.backends import DEFAULT_CONNECTIONS
from agent.db import is_dsn, psycopg_module
from agent.errors import NotSupported
from agent.sandbox.network import NetworkSetting, host_pattern
from daemon.alerts.config import NotifySettings
from daemon.cluster.settings import ClusterSettings
from daemon.disk import StorageSettings
from daemon.errors import DaemonError
from daemon.lock import default_state_dir
from daemon.metrics_service import MetricsSettings
from daemon.provider_settings import ModelLimits, ProviderSettings, read_secret
from daemon.sandbox_settings import (
    DiskMb,
    GoalSandbox,
    McpServerSettings,
    MemoryMb,
    Processes,
    ReadOnlyPath,
    sandbox_profile,
)
from daemon.web.settings import WebSettings

if TYPE_CHECKING:
    from goals.retention import RetentionPolicy

__all__ = [
    "PLACEHOLDER_PROVIDER",
    "ConfigError",
    "DiskMb",
    "GoalSandbox",
    "McpServerSettings",
    "MemoryMb",
    "ModelLimits",
    "Processes",
    "ProviderSettings",
    "ReadOnlyPath",
    "RetentionSettings",
    "Settings",
    "StorageSettings",
    "load_settings",
    "read_secret",
    "sandbox_profile",
]


class ConfigError(DaemonError, ValueError):
    """The configuration is invalid; the message names the key and the reason."""


class RetentionSettings(BaseModel):
    """How long ended goals keep their history and work directories (``[retention]``).

    Ages are in seconds (0: keep forever); see :mod:`goals.retention` for what an ended goal keeps.
    """

    model_config = ConfigDict(extra="forbid")

    #: Seconds after a goal ended (completed, failed, cancelled) before its session history is pruned.
    history_seconds: float = Field(default=30 * 86_400.0, ge=0)
    #: Events each pruned session keeps (the newest, extended back to a turn's start).
    keep_events: int = Field(default=200, ge=0)
    #: Seconds after a goal ended before the work directory goald made for it is removed.
    workdir_seconds: float = Field(default=90 * 86_400.0, ge=0)
    #: Goal keys or ids whose work directories are never removed.
    keep_workdirs: list[str] = []
    #: Seconds between the daemon's retention runs (0: only ``goald store compact``).
    interval_seconds: float = Field(default=3600.0, ge=0)
    #: Rows one retention step deletes (one short transaction).
    batch_rows: int = Field(default=500, ge=1, le=100_000)
    #: Bytes of events one retention step deletes, about (at least one event).
    batch_bytes: int = Field(default=1 << 20, ge=1)
    #: Pages one ``incremental_vacuum`` step gives back to the file system.
    vacuum_pages: int = Field(default=256, ge=1, le=1_000_000)

    def policy(self, roots: list[Path], snapshots: Path | None = None) -> RetentionPolicy:
        """The goal package's retention policy for these settings, the work-directory ``roots`` and
        where goals' checkpoints are kept (``snapshots``)."""
        from goals.retention import RetentionPolicy  # the CLI's client commands never need it

        return RetentionPolicy(
            history_seconds=self.history_seconds,
            keep_events=self.keep_events,
            workdir_seconds=self.workdir_seconds,
            keep_workdirs=self.keep_workdirs,
            workdir_roots=roots,
            snapshots_root=snapshots,
            batch_rows=self.batch_rows,
            batch_bytes=self.batch_bytes,
            vacuum_pages=self.vacuum_pages,
        )


class Settings(BaseSettings):
    """Everything the daemon reads at start."""

    model_config = SettingsConfigDict(env_prefix="GOALD_", env_nested_delimiter="__", extra="forbid")

    state_dir: Path = Field(default_factory=lambda: default_state_dir())
    database: Path | None = None
    #: A PostgreSQL database instead of the SQLite file (``postgresql://user@host:port/dbname``); the
    #: password never here: ``PGPASSWORD``, ``~/.pgpass`` or the systemd credential ``goald-pg-password``.
    store: str | None = None
    #: The connections a PostgreSQL store works over (one thread each): a session's transactions
    #: one at a time on whichever is free, different sessions' at once. A SQLite file has one writer.
    store_connections: int = Field(default=DEFAULT_CONNECTIONS, ge=1, le=64)
    socket: Path | None = None
    #: A group (name or gid) that may use the control socket: the socket is then mode 0660 and owned
    #: by that group (unset: 0600, the daemon's user only). Every call that changes state records the
    #: caller's uid and pid in the event it writes.
    socket_group: str | None = Field(default=None, min_length=1)
    durability: Literal["normal", "full"] = "normal"
    default_model: str = "scripted:demo"
    providers: dict[str, ProviderSettings] = {}
    max_concurrent_turns: int = Field(default=4, ge=1, le=1024)
    shutdown_grace_seconds: float = Field(default=10.0, ge=0, le=3600)
    workdir_roots: list[Path] = []
    log_level: Literal["TRACE", "DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["text", "json", "journal"] = "text"
    resume_on_start: bool = True
    sandbox: Literal["bwrap", "none"] = "bwrap"
    #: The network of goals' sandboxed commands: ``"off"``, ``{allow = [names]}`` (through the
    #: daemon's proxy) or ``"host"`` (unsafe); ``true``/``false`` are read as ``"host"``/``"off"``.
    #: A goal's ``goal_sandbox`` entry or its own ``sandbox`` may say otherwise (the stricter wins).
    sandbox_network: NetworkSetting = "off"
    #: Names the network proxy resolves to these addresses instead of asking DNS, trusted as
    #: written, private addresses included (a package mirror on the private network): the
    #: operator's explicit word. A name is still reached only by goals whose allow list has it.
    sandbox_network_hosts: dict[str, list[IPvAnyAddress]] = {}
    #: Who sandboxed commands run as when the daemon is root (a user name, made as a system user
    #: when missing, or ``UID:GID``); a daemon that is not root runs them as itself.
    sandbox_user: str = Field(default="goald-sandbox", min_length=1)
    #: The ``shell`` tool's default and longest timeout for one command.
    shell_timeout_seconds: float = Field(default=120.0, gt=0, le=86_400)
    #: Paths every sandboxed command sees read-only besides the system directories.
    sandbox_read_only_paths: list[ReadOnlyPath] = []
    #: Cap on the processes of a goal's sandboxed commands all together (0: no cap).
    sandbox_max_processes: Processes = 512
    #: Cap on the memory of a goal's sandboxed commands all together, in MiB (0: no cap).
    sandbox_max_memory_mb: MemoryMb = 4096
    #: What a goal's work directory may hold on disk, in MiB, as measured at each idle (over it, the
    #: goal pauses ``disk_limit``; 0: no limit).
    sandbox_max_disk_mb: DiskMb = 10 * 1024
    #: Tool calls of one model step that run at once (the others wait their turn, in order).
    max_parallel_tools: int = Field(default=8, ge=1, le=1024)
    #: No model call starts with less than this many seconds left of its goal's wall time or
    #: before its deadline; a call still running when the time runs out is cancelled.
    model_call_min_seconds: float = Field(default=5.0, ge=0, le=3600)
    #: The most file content one work-directory fingerprint hashes at a goal's idle, in bytes (files
    #: counted by their allocated blocks; the files past it count by size and times).
    fingerprint_max_bytes: int = Field(default=256 * 1024 * 1024, ge=0, le=1024**4)
    #: The longest one work-directory fingerprint reads file content, in seconds (past it, that idle
    #: judges no progress from the work directory, and the next walk goes on from what was read).
    fingerprint_max_seconds: float = Field(default=2.0, gt=0, le=600)
    #: Network and secrets of each goal's commands, by goal key.
    goal_sandbox: dict[str, GoalSandbox] = {}
    #: What sessions may run unless their goal gives its own allowlist (``None``: every tool, every command).
    tool_policy: ToolPolicy | None = None
    goals_file: Path | None = None
    max_frame_bytes: int = Field(default=1024 * 1024, ge=1024)
    #: Control-socket connections held at once; at the cap the oldest one without a subscription is closed.
    max_connections: int = Field(default=256, ge=2, le=65_536)
    #: Seconds a control-socket client may take to send a frame it has begun.
    frame_timeout_seconds: float = Field(default=10.0, gt=0, le=3600)
    #: Seconds a control-socket connection without a subscription may stay silent before it is closed.
    idle_connection_timeout_seconds: float = Field(default=300.0, gt=0, le=86_400)
    mcp_servers: dict[str, McpServerSettings] = {}
    #: Compact a session's view when its estimated prompt passes this share of the model's window.
    context_compact_at: float = Field(default=0.8, gt=0.1, le=1)
    #: Share of the window the whole prompt aims at right after a compaction (below ``context_compact_at``,
    #: so the next compaction is many turns away and the provider's prompt cache holds between them).
    context_compact_to: float = Field(default=0.4, gt=0, lt=1)
    #: Share of the window one compaction summary may take (below ``context_compact_to``).
    context_summary_share: float = Field(default=0.1, gt=0, lt=1)
    #: A (cheaper) model that writes compaction summaries, ``PROVIDER:MODEL`` (default: the session's own).
    summary_model: str | None = None
    #: Retention of ended goals' history and work directories.
    retention: RetentionSettings = RetentionSettings()
    #: This daemon as a node of several on one PostgreSQL database (read when ``store`` is set).
    cluster: ClusterSettings = ClusterSettings()
    #: Prometheus metrics: a file for the node exporter's textfile collector, an optional loopback endpoint.
    metrics: MetricsSettings = MetricsSettings()
    #: The journal's native socket, used when stderr is connected to the journal (``daemon.logs``).
    journal_socket: Path = Path("/run/systemd/journal/socket")
    #: Notifications: sinks, grouping, retries, the dead-man URL (:mod:`daemon.alerts`).
    notify: NotifySettings = NotifySettings()
    #: The status page (:mod:`daemon.web`): off unless ``enabled``; tokens via ``goald web token add``.
    web: WebSettings = WebSettings()
    #: Free space kept on the disk that holds the store: the watermark and the reserve (:mod:`daemon.disk`).
    storage: StorageSettings = StorageSettings()

    @field_validator("default_model", "summary_model")
    @classmethod
    def _spec(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if ":" not in value or not all(value.split(":", 1)):
            raise ValueError("must be PROVIDER:MODEL, e.g. openai:gpt-4o-mini or scripted:demo")
        if value.split(":", 1)[0] == PLACEHOLDER_PROVIDER:
            # The example config ships a placeholder so that a forgotten model is refused rather
            # than replaced by the demo's scripted model (which completes goals on its own word).
            raise ValueError(f"is the example's placeholder {value!r}: set the model goals use, PROVIDER:MODEL")
        return value

    @field_validator("context_compact_to", "context_summary_share")
    @classmethod
    def _context_shares(cls, value: float, info: ValidationInfo) -> float:
        # A target at or above the trigger would compact again at once; a summary as large as the
        # target would leave no room for the newest turns. (Fields are validated in order, so the
        # key each is checked against is in ``info.data`` unless it was itself invalid.)
        above = "context_compact_at" if info.field_name == "context_compact_to" else "context_compact_to"
        bound = info.data.get(above)
        if bound is not None and value >= bound:
            raise ValueError(f"must be below {above} ({bound}), got {value}")
        return value

    @field_validator("state_dir", "database", "socket", "goals_file")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        if value is not None and not value.expanduser().is_absolute():
            raise ValueError(f"must be an absolute path, got {str(value)!r}")
        return value

    @field_validator("store")
    @classmethod
    def _store_dsn(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not is_dsn(value):
            raise ValueError(
                f"must be a PostgreSQL URL (postgresql://user@host:port/dbname), got {value.split('@')[-1]!r};"
                " for SQLite leave it unset (and set database, if not the state directory's goald.db)"
            )
        try:
            parts = urlsplit(value)
            has_password = parts.password is not None or "password=" in parts.query
        except ValueError as exc:
            raise ValueError(f"is not a valid PostgreSQL URL: {exc}") from exc
        if has_password:
            raise ValueError(
                "must not hold the password: give it in PGPASSWORD, ~/.pgpass or the systemd credential"
                " goald-pg-password (LoadCredential=goald-pg-password:/path)"
            )
        try:
            psycopg_module()  # an extra: without it the store cannot open, so say so here
        except NotSupported as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("sandbox_network_hosts")
    @classmethod
    def _host_names(cls, value: dict[str, list[IPvAnyAddress]]) -> dict[str, list[IPvAnyAddress]]:
        for name, addresses in value.items():
            if host_pattern(name).startswith("*") or not addresses:
                raise ValueError(f"{name!r}: a host name (no wildcard) and at least one address")
        return {host_pattern(name): addresses for name, addresses in value.items()}

    @field_validator("mcp_servers")
    @classmethod
    def _mcp_names(cls, value: dict[str, McpServerSettings]) -> dict[str, McpServerSettings]:
        for name in value:
            McpServer.check_name(name)
        return value

    @field_validator("workdir_roots")
    @classmethod
    def _absolute_roots(cls, value: list[Path]) -> list[Path]:
        for root in value:
            if not root.expanduser().is_absolute():
                raise ValueError(f"entries must be absolute paths, got {str(root)!r}")
        return value

    #: The TOML file these settings were read from (hidden from every sandbox).
    _config_file: Path | None = PrivateAttr(default=None)

    @property
    def config_file(self) -> Path | None:
        """The TOML file these settings were read from, if any."""
        return self._config_file

    @property
    def database_path(self) -> Path:
        """The SQLite file."""
        return (self.database or self.state_dir / "goald.db").expanduser()

    @property
    def store_location(self) -> str | Path:
        """Where the store is: the PostgreSQL URL (``store``), else the SQLite file."""
        return self.store if self.store is not None else self.database_path

    @property
    def socket_path(self) -> Path:
        """The control socket."""
        if self.socket is not None:
            return self.socket.expanduser()
        return self.state_dir.expanduser() / "goald.sock"

    @property
    def roots(self) -> list[Path]:
        """Allowed work-directory roots (the state directory's ``work`` when none is configured)."""
        return [r.expanduser() for r in self.workdir_roots] or [self.state_dir.expanduser() / "work"]

    @property
    def snapshots_dir(self) -> Path:
        """Where the checkpoints of goals on repositories are kept (:mod:`goals.snapshots`)."""
        return self.state_dir.expanduser() / "snapshots"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment over the file (passed as init values) over defaults.
        return env_settings, init_settings

    def masked(self) -> dict[str, Any]:
        """The effective settings as JSON-ready data, with every secret masked."""
        data = self.model_dump(mode="json")
        for name, provider in self.providers.items():
            if provider.api_key is not None:
                data["providers"][name]["api_key"] = "********"
        for name in self.mcp_servers:
            # Server environments commonly carry tokens.
            data["mcp_servers"][name]["env"] = dict.fromkeys(data["mcp_servers"][name]["env"], "********")
        data["database"] = str(self.database_path)
        data["socket"] = str(self.socket_path)
        data["workdir_roots"] = [str(r) for r in self.roots]
        return data


def _describe(exc: ValidationError, where: str) -> str:
    """One line per error, each naming where the value came from: the file's key, or the
    ``GOALD_*`` environment variable that overrides it (which the file cannot be blamed for)."""
    lines = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        key = ".".join(loc) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        variable = _env_variable(loc)
        if variable is not None:
            lines.append(f"environment variable {variable} (overrides {key!r}): {msg}")
        else:
            lines.append(f"{where}: key {key!r}: {msg}")
    return "; ".join(lines)


def _env_variable(loc: list[str]) -> str | None:
    """The ``GOALD_*`` variable that set the value at ``loc`` (or a table holding it), if any."""
    present = {name.upper(): name for name in os.environ if name.upper().startswith("GOALD_")}
    for end in range(len(loc), 0, -1):
        wanted = "GOALD_" + "__".join(loc[:end]).upper()
        if wanted in present:
            return present[wanted]
    return None


#: The provider part of the example config's placeholder ``default_model``: refused until it is set.
PLACEHOLDER_PROVIDER = "CHANGE-ME"


def load_settings(path: Path | str | None = None, **overrides: Any) -> Settings:
    """Read the TOML file (if any), apply ``GOALD_*`` overrides, validate.

    Raises:
        ConfigError: naming the file, the key and the reason.
    """
    data: dict[str, Any] = {}
    where = "defaults"
    if path is not None:
        where = str(path)
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"{where}: file not found") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{where}: not valid TOML: {exc}") from None
        except OSError as exc:
            raise ConfigError(f"{where}: cannot read: {exc.strerror}") from None
    data.update(overrides)
    try:
        settings = Settings(**data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, where)) from None
    if path is not None:
        settings._config_file = Path(path).expanduser().absolute()
    return settings
