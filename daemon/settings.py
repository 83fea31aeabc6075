"""Settings: one TOML file plus ``GOALD_*`` environment overrides.

Precedence, highest first: ``GOALD_*`` environment variables (nested keys with ``__``, e.g.
``GOALD_PROVIDERS__LOCAL__BASE_URL``), then the TOML file, then the defaults below. An invalid file
stops the daemon before it starts, with the key and the reason (:class:`ConfigError`). Secrets are
never printed: ``goald config check`` shows them masked, and provider keys are normally named
(an environment variable or a systemd credential), not written into the file.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from agent import Price


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key and the reason."""


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
    context_window: int = Field(default=128_000, ge=1)
    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)
    max_concurrent_calls: int | None = Field(default=None, ge=1)
    #: Prices per million tokens, by model name.
    prices: dict[str, Price] = {}
    #: For ``kind = "scripted"``: ``module:callable`` that returns a model for a model name.
    script: str | None = None


class Settings(BaseSettings):
    """Everything the daemon reads at start."""

    model_config = SettingsConfigDict(env_prefix="GOALD_", env_nested_delimiter="__", extra="forbid")

    state_dir: Path = Field(default_factory=lambda: _default_state_dir())
    database: Path | None = None
    socket: Path | None = None
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
    goals_file: Path | None = None
    max_frame_bytes: int = Field(default=1024 * 1024, ge=1024)

    @field_validator("default_model")
    @classmethod
    def _spec(cls, value: str) -> str:
        if ":" not in value or not all(value.split(":", 1)):
            raise ValueError("must be PROVIDER:MODEL, e.g. openai:gpt-4o-mini or scripted:demo")
        return value

    @field_validator("state_dir", "database", "socket", "goals_file")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        if value is not None and not value.expanduser().is_absolute():
            raise ValueError(f"must be an absolute path, got {str(value)!r}")
        return value

    @field_validator("workdir_roots")
    @classmethod
    def _absolute_roots(cls, value: list[Path]) -> list[Path]:
        for root in value:
            if not root.expanduser().is_absolute():
                raise ValueError(f"entries must be absolute paths, got {str(root)!r}")
        return value

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


def _describe(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        lines.append(f"key {key!r}: {msg}")
    return "; ".join(lines)


def load_settings(path: Path | str | None = None, **overrides: Any) -> Settings:
    """Read the TOML file (if any), apply ``GOALD_*`` overrides, validate.

    Raises:
        ConfigError: naming the file, the key and the reason.
    """
    data: dict[str, Any] = {}
    where = "environment"
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
        return Settings(**data)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {_describe(exc)}") from None


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
