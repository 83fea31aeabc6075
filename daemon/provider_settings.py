"""The model providers' settings (``[providers.<name>]``) and where each reads its API key.

Kept apart from :mod:`daemon.settings` (which re-exports every name here) because the provider
registry (:mod:`daemon.models`) reads only this part. A key is normally named, not written into the
file: a systemd credential or an environment variable, read when the registry is built.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from agent import Price
from agent.models.base import known_window
from agent.secret import SecretSource


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
        own = self.models.get(name, ModelLimits())
        window = own.context_window or self.context_window or known_window(name) or 128_000
        return window, own.max_tokens or self.max_tokens

    def key_sources(self) -> list[SecretSource]:
        """Where the API key is looked for, in order: ``api_key_credential``, then ``api_key_env``
        (this file's keys, not checked as a goal's secrets are)."""
        found = [SecretSource.model_construct(credential=self.api_key_credential)] if self.api_key_credential else []
        return found + ([SecretSource.model_construct(env=self.api_key_env)] if self.api_key_env else [])


def read_secret(provider: ProviderSettings) -> str | None:
    """The provider's API key from its credential, environment variable or value (in that order)."""
    for source in provider.key_sources():
        value = source.read()
        if value is not None:  # an empty file or variable stands for "not configured here"
            return value
    return provider.api_key.get_secret_value() if provider.api_key is not None else None
