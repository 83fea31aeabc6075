"""Settings: one TOML file plus ``GOALD_*`` environment overrides.

Precedence, highest first: ``GOALD_*`` environment variables (nested keys with ``__``, e.g.
``GOALD_PROVIDERS__LOCAL__BASE_URL``), then the TOML file, then the defaults below. An invalid file
stops the daemon before it starts, with the key and the reason (:class:`ConfigError`). Secrets are
never printed: ``goald config check`` shows them masked, and provider keys are normally named
(an environment variable or a systemd credential), not written into the file.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from loguru import logger
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from agent import (
    McpServer,
    Price,
    Redactor,
    SandboxPolicy,
    SandboxProfile,
    SandboxUnavailable,
    ToolPolicy,
    detect_bwrap,
)
from agent.allowlist import etc_secrets
from agent.limits import MIB, MIN_MEMORY_BYTES, MIN_PROCESSES, CommandLimits, limiter
from agent.sandbox import BASE_VARIABLES
from daemon.alerts.config import NotifySettings
from daemon.errors import DaemonError
from daemon.metrics import MetricsSettings
from daemon.web.settings import WebSettings

if TYPE_CHECKING:
    from goals.retention import RetentionPolicy


class ConfigError(DaemonError, ValueError):
    """The configuration is invalid; the message names the key and the reason."""


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


class ModelLimits(BaseModel):
    """One model's context window and output limit (each unset: the provider's)."""

    model_config = ConfigDict(extra="forbid")

    context_window: int | None = Field(default=None, ge=256)
    max_tokens: int | None = Field(default=None, ge=1)


class ProviderSettings(BaseModel):
    """One model provider."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["openai", "anthropic", "scripted"]
    base_url: str | None = None
    #: Environment variable that holds the API key.
    api_key_env: str | None = None
    #: systemd credential (a file in ``$CREDENTIALS_DIRECTORY``) that holds the API key.
    api_key_credential: str | None = None
    #: The key itself (discouraged: prefer ``api_key_env`` or ``api_key_credential``).
    api_key: SecretStr | None = None
    timeout_seconds: float = Field(default=120.0, gt=0)
    max_tokens: int = Field(default=4096, ge=1)
    #: Tokens a prompt may take; unset: the window goald knows for the model's name, else 128,000.
    context_window: int | None = Field(default=None, ge=256)
    #: Per-model limits, by model name (override the two above).
    models: dict[str, ModelLimits] = {}
    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)
    max_concurrent_calls: int | None = Field(default=None, ge=1)
    #: Consecutive retryable failures (5xx, timeouts, dropped connections, 429s) that open the circuit breaker.
    failure_threshold: int = Field(default=5, ge=1)
    #: Seconds the breaker stays open before one probe call; doubled after each failed probe, up to the max.
    breaker_cooldown_seconds: float = Field(default=10.0, ge=0)
    breaker_max_cooldown_seconds: float = Field(default=300.0, ge=0)
    #: Prices per million tokens, by model name.
    prices: dict[str, Price] = {}
    #: For ``kind = "scripted"``: ``module:callable`` that returns a model for a model name.
    script: str | None = None

    def limits_for(self, name: str) -> tuple[int, int]:
        """(context window, output limit) of model ``name``."""
        from agent.models.base import known_window

        own = self.models.get(name, ModelLimits())
        window = own.context_window or self.context_window or known_window(name) or 128_000
        return window, own.max_tokens or self.max_tokens


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


class SecretRef(BaseModel):
    """Where one tool secret comes from: a systemd credential or an environment variable of the daemon."""

    model_config = ConfigDict(extra="forbid")

    #: A file in ``$CREDENTIALS_DIRECTORY`` (systemd ``LoadCredential=``).
    credential: str | None = None
    #: An environment variable of the daemon.
    env: str | None = None

    @model_validator(mode="after")
    def _one(self) -> SecretRef:
        if (self.credential is None) == (self.env is None):
            raise ValueError("name exactly one of credential or env")
        if self.credential is not None and ("/" in self.credential or self.credential in ("", ".", "..")):
            raise ValueError("credential must be a file name in $CREDENTIALS_DIRECTORY")
        return self

    def describe(self) -> str:
        """Where the value is looked for (never the value)."""
        return f"credential {self.credential!r}" if self.credential is not None else f"environment variable {self.env}"


class GoalSandbox(BaseModel):
    """The sandbox of one goal's commands (``[goal_sandbox.<goal key>]``)."""

    model_config = ConfigDict(extra="forbid")

    #: The network on or off for this goal's commands (default: ``sandbox_network``).
    network: bool | None = None
    #: Environment variables of this goal's commands only, by name; their values are redacted from tool output.
    secrets: dict[str, SecretRef] = {}
    #: Paths this goal's commands see read-only besides the system directories (a toolchain under /opt).
    read_only_paths: list[ReadOnlyPath] = []
    #: Cap on the processes of each of this goal's commands (default: ``sandbox_max_processes``; 0: none).
    max_processes: Processes | None = None
    #: Cap on the memory of each of this goal's commands, in MiB (default: ``sandbox_max_memory_mb``; 0: none).
    max_memory_mb: MemoryMb | None = None

    @field_validator("secrets")
    @classmethod
    def _names(cls, value: dict[str, SecretRef]) -> dict[str, SecretRef]:
        for name in value:
            if not name.isidentifier() or not name.isascii():
                raise ValueError(f"{name!r} is not a valid environment variable name")
            if name in BASE_VARIABLES:
                raise ValueError(f"{name} is set by the sandbox itself")
        return value


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

    def policy(self, roots: list[Path]) -> RetentionPolicy:
        """The goal package's retention policy for these settings and work-directory ``roots``."""
        from goals.retention import RetentionPolicy  # the CLI's client commands never need it

        return RetentionPolicy(
            history_seconds=self.history_seconds,
            keep_events=self.keep_events,
            workdir_seconds=self.workdir_seconds,
            keep_workdirs=self.keep_workdirs,
            workdir_roots=roots,
            batch_rows=self.batch_rows,
            batch_bytes=self.batch_bytes,
            vacuum_pages=self.vacuum_pages,
        )


class Settings(BaseSettings):
    """Everything the daemon reads at start."""

    model_config = SettingsConfigDict(env_prefix="GOALD_", env_nested_delimiter="__", extra="forbid")

    state_dir: Path = Field(default_factory=lambda: _default_state_dir())
    database: Path | None = None
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
    #: Whether sandboxed commands have the network (a goal's ``goal_sandbox`` entry may say otherwise).
    sandbox_network: bool = False
    #: The ``shell`` tool's default and longest timeout for one command.
    shell_timeout_seconds: float = Field(default=120.0, gt=0, le=86_400)
    #: Paths every sandboxed command sees read-only besides the system directories.
    sandbox_read_only_paths: list[ReadOnlyPath] = []
    #: Cap on the processes of each sandboxed command as a whole (0: no cap).
    sandbox_max_processes: Processes = 512
    #: Cap on the memory of each sandboxed command as a whole, in MiB (0: no cap).
    sandbox_max_memory_mb: MemoryMb = 4096
    #: No model call starts with less than this many seconds left of its goal's wall time or
    #: before its deadline; a call still running when the time runs out is cancelled.
    model_call_min_seconds: float = Field(default=5.0, ge=0, le=3600)
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
    #: Prometheus metrics: a file for the node exporter's textfile collector, an optional loopback endpoint.
    metrics: MetricsSettings = MetricsSettings()
    #: The journal's native socket, used when stderr is connected to the journal (``daemon.logs``).
    journal_socket: Path = Path("/run/systemd/journal/socket")
    #: Notifications: sinks, grouping, retries, the dead-man URL (:mod:`daemon.alerts`).
    notify: NotifySettings = NotifySettings()
    #: The status page (:mod:`daemon.web`): off unless ``enabled``; tokens via ``goald web token add``.
    web: WebSettings = WebSettings()

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
    def socket_path(self) -> Path:
        """The control socket."""
        if self.socket is not None:
            return self.socket.expanduser()
        return self.state_dir.expanduser() / "goald.sock"

    @property
    def roots(self) -> list[Path]:
        """Allowed work-directory roots (the state directory's ``work`` when none is configured)."""
        return [r.expanduser() for r in self.workdir_roots] or [self.state_dir.expanduser() / "work"]

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


def _default_state_dir() -> Path:
    # systemd's StateDirectory= sets STATE_DIRECTORY; otherwise the XDG state home.
    env = os.environ.get("STATE_DIRECTORY")
    if env:
        return Path(env.split(":")[0])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "goald"


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


def read_secret(provider: ProviderSettings) -> str | None:
    """The provider's API key from its credential, environment variable or value (in that order)."""
    if provider.api_key_credential:
        creds = os.environ.get("CREDENTIALS_DIRECTORY")
        if creds:
            path = Path(creds) / provider.api_key_credential
            if path.is_file():
                value = path.read_text().strip()
                if value:  # an empty file stands for "not configured here"
                    return value
    if provider.api_key_env:
        env_value = os.environ.get(provider.api_key_env)
        if env_value:
            return env_value
    return provider.api_key.get_secret_value() if provider.api_key is not None else None


def read_tool_secret(ref: SecretRef) -> str | None:
    """A tool secret's value, or ``None`` when it has none here."""
    if ref.credential is not None:
        creds = os.environ.get("CREDENTIALS_DIRECTORY")
        path = Path(creds) / ref.credential if creds else None
        if path is None or not path.is_file():
            return None
        return path.read_text().strip() or None
    assert ref.env is not None
    return os.environ.get(ref.env) or None


def sandbox_profile(settings: Settings) -> SandboxProfile:
    """How the daemon sandboxes commands: bwrap found (or ``sandbox = "none"``), what is hidden, each
    goal's network and secrets, and a redactor for every secret the daemon holds.

    Logs a warning for ``sandbox = "none"``, an error when bwrap is wanted but cannot work (shell
    tools are then not offered), and an error for each named tool secret that has no value.
    """
    policies: dict[str, SandboxPolicy] = {}
    values: list[str] = []
    for key, conf in settings.goal_sandbox.items():
        secrets: dict[str, str] = {}
        for name, ref in conf.secrets.items():
            value = read_tool_secret(ref)
            if value is None:
                logger.error("tool secret {} of goal {!r} has no value ({}); left unset", name, key, ref.describe())
                continue
            secrets[name] = value
        values += secrets.values()
        policies[key] = SandboxPolicy(
            network=conf.network,
            secrets=secrets,
            read_only=tuple(conf.read_only_paths),
            max_processes=conf.max_processes,
            max_memory_bytes=conf.max_memory_mb * MIB if conf.max_memory_mb is not None else None,
        )
    for provider in settings.providers.values():
        api_key = read_secret(provider)
        if api_key:
            values.append(api_key)
    for server in settings.mcp_servers.values():
        values += server.env.values()  # MCP servers' environments carry tokens
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
    profile = SandboxProfile(
        kind=settings.sandbox,
        hidden=tuple(hidden),
        roots=tuple(settings.roots),
        network=settings.sandbox_network,
        policies=policies,
        redactor=Redactor(values),
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
    logger.info("sandbox: {} (network {})", found.path, "on" if settings.sandbox_network else "off")
    # Found once per process: at start (logged, a fallback to rlimits as a warning), not in the first command.
    etc_secrets()
    if profile.limits.active or any(p.max_processes or p.max_memory_bytes for p in policies.values()):
        limiter()
    return dataclasses.replace(profile, bwrap=found)
