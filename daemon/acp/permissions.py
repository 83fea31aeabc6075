"""Asking the editor instead of denying: ``session/request_permission`` for calls outside the policy.

An unattended agent never waits for an approval: a call outside the tool policy's allowlist is
not run (:mod:`agent.tools.policy`). In an editor a person may be there to say yes, so an ACP
session's registry is wrapped in :class:`AskingRegistry`: every tool is offered to the model, and
a call the policy would deny is put to the editor first — only while an ACP prompt's message is
in flight on the session, i.e. while someone is waiting for the answer. A goal's rounds that run
outside any prompt (a ``/goal`` command enqueues nothing) stay unattended and keep the policy's
plain denial. A refused (or unanswerable) request
is answered like a policy denial (``denied by policy: …``, recorded as ``tool/denied``).

Support is what ACP version 1 makes every client implement (``session/request_permission`` is a
baseline client method); a client that answers "method not found" is not asked again.
"Allow always" holds for the tool's name on that session until the bridge stops (not durable).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from agent import ToolContext, ToolOutput, ToolPolicy, ToolRegistry
from agent.tools.policy import DENIED_PREFIX

#: ``(tool name, arguments, call context, why the policy denies it) -> allowed?``
Ask = Callable[[str, dict[str, Any], ToolContext, str], Awaitable[bool]]


class AskingRegistry(ToolRegistry):
    """A session's tools with the policy checked here, asking the editor before a denial."""

    def __init__(self, inner: ToolRegistry, ask: Ask) -> None:
        # No policy in the base class: it would hide the tools the editor may still approve.
        super().__init__(
            [tool for name in inner.names if (tool := inner.get(name)) is not None],
            redactor=inner.redactor,
            unavailable=inner.unavailable,
        )
        self._gate = inner.policy
        self._ask = ask

    @property
    def policy(self) -> ToolPolicy | None:
        """The policy calls are checked against (before the editor is asked)."""
        return self._gate

    @policy.setter
    def policy(self, policy: ToolPolicy | None) -> None:
        # A goal started on the session brings its own allowlist (goals.engine); every tool stays offered.
        self._gate = policy

    async def call(self, name: str, raw_args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        """Run the call if the policy allows it or the editor approves it; otherwise deny it."""
        gate = self._gate
        denied = gate.check(name, raw_args) if gate is not None else None
        if denied is not None and not await self._ask(name, raw_args, ctx, denied):
            return ToolOutput(DENIED_PREFIX + denied, True, denied=denied)
        return await super().call(name, raw_args, ctx)
