"""The model registry: model instances by ``PROVIDER:MODEL`` spec, shared by every session that
names them, so that one provider's health, rate limits and circuit breaker are shared too.

The registry always knows ``scripted:echo`` (:func:`echo_model`), the default, so a runtime opened
without configuration can run a session end to end. A ``factory`` builds the models it does not
know yet on first use (the daemon's builds them from its provider configuration).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent.errors import InvalidInput
from agent.models.base import Model
from agent.models.scripted import Reply, ScriptedModel


def echo_model() -> ScriptedModel:
    """A scripted model that answers every prompt by echoing its last user text."""

    def rule(request: Any) -> Reply:
        last = request.messages[-1] if request.messages else None
        text = "".join(getattr(b, "text", "") for b in last.content) if last is not None else ""
        return Reply.say(f"echo: {text}")

    return ScriptedModel(rule, name="echo", record=False)


class ModelRegistry:
    """Model instances by ``PROVIDER:MODEL`` spec (shared by every session that names them)."""

    def __init__(
        self,
        models: dict[str, Model] | None = None,
        default: str = "scripted:echo",
        factory: Callable[[str], Model | None] | None = None,
    ) -> None:
        self._models: dict[str, Model] = dict(models or {})
        self.default = default
        self._factory = factory
        self._models.setdefault("scripted:echo", echo_model())

    def add(self, model: Model, spec: str | None = None) -> None:
        """Register a model under its spec (or ``spec``)."""
        self._models[spec or model.spec] = model

    def get(self, spec: str | None) -> Model:
        """The model for ``spec`` (the default when ``None``)."""
        key = spec or self.default
        model = self._models.get(key)
        if model is None and self._factory is not None:
            model = self._factory(key)
            if model is not None:
                self._models[key] = model
        if model is None:
            known = ", ".join(sorted(self._models))
            raise InvalidInput(f"unknown model {key!r}; known: {known}")
        return model

    def windows(self) -> dict[str, dict[str, Any]]:
        """Each model built so far, by spec: its context window and where the figure came from
        (``config``, ``known model``, ``default``, ``server refusal``, ``server /props``...)."""
        return {spec: model.window_info() for spec, model in sorted(self._models.items())}


__all__ = ["ModelRegistry", "echo_model"]
