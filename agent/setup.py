"""What a session's agent is made of besides its row: a model, tools and driver settings.

A :data:`Resolver` turns a session row into its :class:`SessionSetup`, so the packages above
decide those (the goal engine adds goal tools; the daemon resolves model specs from its
configuration); :func:`default_resolver` is the runtime's own, over a
:class:`~agent.models.registry.ModelRegistry`. :func:`resolve_setup` applies one rule on top of
any resolver: a subagent loaded without its delegating call (after a restart, or for a message
sent to it later) still gets no more tools than it was given, the names recorded in its row.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from agent.config import AgentConfig, SlotFactory
from agent.models.base import Model
from agent.models.registry import ModelRegistry
from agent.sessions import SessionRow
from agent.tools.base import ToolRegistry


@dataclass
class SessionSetup:
    """What an agent needs beyond its row: a model, tools and driver settings."""

    model: Model
    tools: ToolRegistry = field(default_factory=ToolRegistry)
    config: AgentConfig = field(default_factory=AgentConfig)
    slot: SlotFactory | None = None
    #: The model that writes the context's compaction summaries (``None``: the session's own).
    summary_model: Model | None = None


Resolver = Callable[[SessionRow], "SessionSetup | Awaitable[SessionSetup]"]


def default_resolver(models: ModelRegistry, tools: Callable[[SessionRow], ToolRegistry] | None = None) -> Resolver:
    """A resolver that takes the row's model from ``models``, its tools from ``tools`` (none by
    default) and its driver settings from the row's ``agent`` config."""
    tool_factory = tools or (lambda row: ToolRegistry())

    def resolve(row: SessionRow) -> SessionSetup:
        return SessionSetup(
            model=models.get(row.model),
            tools=tool_factory(row),
            config=AgentConfig.model_validate(row.config.get("agent", {})),
        )

    return resolve


async def resolve_setup(resolver: Resolver, row: SessionRow) -> SessionSetup:
    """``row``'s setup by ``resolver``, a subagent's tools narrowed to those it was given."""
    resolved = resolver(row)
    setup = await resolved if inspect.isawaitable(resolved) else resolved
    assert isinstance(setup, SessionSetup)
    allowed = row.config.get("subagent", {}).get("tools")
    if allowed is not None:
        kept = [setup.tools.get(n) for n in setup.tools.names if n in allowed]
        setup.tools = ToolRegistry(
            [t for t in kept if t is not None],
            policy=setup.tools.policy,
            redactor=setup.tools.redactor,
            unavailable={n: why for n, why in setup.tools.unavailable.items() if n in allowed},
        )
    return setup


__all__ = ["Resolver", "SessionSetup", "default_resolver", "resolve_setup"]
