"""Models by ``PROVIDER:MODEL`` spec, built from the settings.

``scripted:demo`` and ``scripted:echo`` are always there. A provider of ``kind = "scripted"`` with
``script = "module:callable"`` builds a model per name by calling ``callable(model_name)`` (how
tests and demos plug in deterministic models). Provider SDKs are imported lazily, only when a
session first uses a model of theirs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from agent import InvalidInput, Model, ModelRegistry, echo_model
from daemon.settings import Settings


def build_registry(settings: Settings) -> ModelRegistry:
    """The daemon's model registry."""
    from daemon.demo import demo_goal_model

    def factory(spec: str) -> Model | None:
        provider, _, name = spec.partition(":")
        conf = settings.providers.get(provider)
        if conf is None or not name:
            return None
        if conf.kind == "scripted":
            if conf.script is None:
                raise InvalidInput(f"provider {provider!r} is scripted but names no script")
            model = _load(conf.script)(name)
            if not isinstance(model, Model):
                raise InvalidInput(f"script {conf.script!r} did not return a model for {name!r}")
            model.provider = provider
            if name in conf.prices:
                model.price = conf.prices[name]
            return model
        raise InvalidInput(f"provider kind {conf.kind!r} of {provider!r} is not available in this build")

    registry = ModelRegistry({"scripted:demo": demo_goal_model()}, default=settings.default_model, factory=factory)
    registry.add(echo_model(), "scripted:echo")
    return registry


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
