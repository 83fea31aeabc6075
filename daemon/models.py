"""Models by ``PROVIDER:MODEL`` spec, built from the settings.

``scripted:demo`` and ``scripted:echo`` are always there. A provider of ``kind = "scripted"`` with
``script = "module:callable"`` builds a model per name by calling ``callable(model_name)`` (how
tests and demos plug in deterministic models). Provider SDKs are imported lazily, only when a
session first uses a model of theirs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from agent import InvalidInput, Model, ModelRegistry, echo_model
from agent.models.health import GuardedModel, ProviderHealth
from daemon.demo_model import demo_goal_model
from daemon.errors import DaemonError
from daemon.settings import ProviderSettings, Settings, read_secret


class ProviderNeedsRestart(InvalidInput, DaemonError):
    """The model's provider is in the configuration file now, but was not when the daemon started:
    providers are read once, at start (a reload applies only the goals file)."""


def build_registry(
    settings: Settings,
    healths: dict[str, ProviderHealth] | None = None,
    *,
    added: Callable[[], Mapping[str, str]] | None = None,
) -> ModelRegistry:
    """The daemon's model registry; ``healths`` collects each provider's shared health (breaker, limits).

    ``added`` names the providers found in the configuration file since the daemon started (each
    with the file), so that their models are refused as "needs a restart", not as unknown.
    """
    healths = {} if healths is None else healths
    # Every HTTP provider's health exists from the start, so ``daemon/health`` shows each one (its
    # breaker closed, its limits) before any session has used it.
    for provider, conf in settings.providers.items():
        if conf.kind != "scripted" and provider not in healths:
            healths[provider] = provider_health(provider, conf)

    def factory(spec: str) -> Model | None:
        provider, _, name = spec.partition(":")
        conf = settings.providers.get(provider)
        if conf is None and name and added is not None and provider in (new := added()):
            raise ProviderNeedsRestart(
                f"model {spec!r}: provider {provider!r} was added to {new[provider]} after the daemon started;"
                " it needs a restart (systemctl restart goald) before its models can be used"
            )
        if conf is None or not name:
            return None
        if conf.kind == "scripted":
            return _scripted_model(provider, conf, name)
        health = healths.get(provider)
        if health is None:
            health = healths[provider] = provider_health(provider, conf)
        return GuardedModel(_http_model(provider, conf, name), health)

    registry = ModelRegistry({"scripted:demo": demo_goal_model()}, default=settings.default_model, factory=factory)
    registry.add(echo_model(), "scripted:echo")
    return registry


def _scripted_model(provider: str, conf: ProviderSettings, name: str) -> Model:
    """Model ``name`` of a scripted provider: its script's callable builds it; the provider's
    configured limits and prices apply."""
    if conf.script is None:
        raise InvalidInput(f"provider {provider!r} is scripted but names no script")
    model = _load(conf.script)(name)
    if not isinstance(model, Model):
        raise InvalidInput(f"script {conf.script!r} did not return a model for {name!r}")
    model.provider = provider
    if conf.context_window is not None or name in conf.models:
        model.context_window, model.max_tokens = conf.limits_for(name)
    if name in conf.prices:
        model.price = conf.prices[name]
    return model


def _http_model(provider: str, conf: ProviderSettings, name: str) -> Model:
    """Model ``name`` of an OpenAI-compatible or Anthropic provider (not yet guarded by its health).

    A window the configuration does not set is left to the model (the one goald knows for the name,
    else a default, until the server states its own)."""
    own = conf.models.get(name)
    configured = conf.context_window is not None or (own is not None and own.context_window is not None)
    common: dict[str, Any] = {
        "name": name,
        "base_url": conf.base_url,
        "api_key": read_secret(conf),
        "timeout": conf.timeout_seconds,
        "max_tokens": conf.limits_for(name)[1],
        "context_window": conf.limits_for(name)[0] if configured else None,
        "price": conf.prices.get(name),
        "provider": provider,
    }
    # The provider SDKs (and their HTTP stack) load only when a session first uses one of their
    # models: the daemon's start-up path stays free of them (tests/daemon/test_startup_imports.py).
    if conf.kind == "openai":
        from agent.models.openai import OpenAIModel

        return OpenAIModel(**common)
    from agent.models.anthropic import AnthropicModel

    return AnthropicModel(**common)


def provider_health(name: str, conf: ProviderSettings) -> ProviderHealth:
    """The shared rate limiter and circuit breaker of one configured provider."""
    return ProviderHealth(
        name=name,
        requests_per_minute=conf.requests_per_minute,
        tokens_per_minute=conf.tokens_per_minute,
        max_concurrent_calls=conf.max_concurrent_calls,
        failure_threshold=conf.failure_threshold,
        cooldown=conf.breaker_cooldown_seconds,
        max_cooldown=max(conf.breaker_max_cooldown_seconds, conf.breaker_cooldown_seconds),
    )


def _load(path: str) -> Callable[[str], Any]:
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise InvalidInput(f"script {path!r} must be 'module:callable'")
    try:
        module = importlib.import_module(module_name)
        fn = getattr(module, attr)
    except (ImportError, AttributeError) as exc:
        raise InvalidInput(f"cannot load script {path!r}: {exc}") from None
    if not callable(fn):
        raise InvalidInput(f"script {path!r} is not callable")
    return fn  # type: ignore[no-any-return]
