"""What a session of the daemon runs with: its model, tools and configuration, and each shell call's
and each goal command's sandbox.

:class:`HostSessions` is the part of :class:`daemon.host.Host` that resolves sessions for the
runtime (``Runtime.open(resolver=...)``): a session's tools (file tools, the goal tools of a goal's
session, ``delegate``, the MCP servers' tools, ``shell`` when the sandbox works), under the tool
policy and the redactor of the secrets learnt so far. A shell call runs under its root session's
live goal's sandbox (its network, secrets and cgroup); a goal's verification and progress commands
run in the same sandbox and cgroup. No command starts while the store's disk is under its watermark.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from agent import (
    DEFAULT_MAX_DEPTH,
    AgentConfig,
    Delegate,
    McpServers,
    ModelRegistry,
    Runtime,
    Sandbox,
    SandboxProfile,
    SandboxUnavailable,
    SessionRow,
    SessionSetup,
    Shell,
    ToolContext,
    ToolRegistry,
    file_tools,
    session_chain,
)
from agent.db import Conn
from agent.ids import SessionId
from agent.sandbox.base import CommandRefused
from agent.sandbox.proxy import Report
from daemon.disk import StoreDisk
from daemon.goal_sandbox import goal_policy, goal_redactor
from daemon.metrics import SlotSemaphore
from daemon.network_events import NetworkEvents
from daemon.settings import Settings
from goals import (
    MIGRATIONS as GOAL_MIGRATIONS,
)
from goals import (
    CommandRunner,
    Goal,
    SandboxSpec,
    approver_for_session,
    live_goal_of_chain,
    live_goal_sandboxes_with_secrets,
    policy_for_session,
    sandboxed_runner,
    tools_for_goal_sessions,
)


def _chain_and_goal(conn: Conn, session_id: str) -> tuple[list[SessionId], Goal | None]:
    """A session's chain (itself, its parents, its root last) and the live goal that decides its sandbox."""
    chain = session_chain(conn, session_id)
    return chain, live_goal_of_chain(conn, chain)


class HostSessions:
    """The host's session resolver and sandboxes (mixed into :class:`daemon.host.Host`, which sets
    these attributes)."""

    settings: Settings
    models: ModelRegistry
    sandboxing: SandboxProfile
    mcp: McpServers
    disk: StoreDisk
    rt: Runtime | None
    network_events: NetworkEvents | None
    _slots: SlotSemaphore

    def _check_model(self, spec: str | None) -> None:
        self.models.get(spec)

    def _resolve(self, row: SessionRow) -> SessionSetup:
        model = self.models.get(row.model)
        tools = ToolRegistry(
            list(file_tools())
            + tools_for_goal_sessions(row.config)
            # A subagent started by ``delegate`` runs with its parent's tools and under the parent's
            # slot (agent.subagents); this resolver serves only sessions loaded on their own.
            + ([Delegate()] if row.depth < DEFAULT_MAX_DEPTH else [])
            + self.mcp.tools(),
            policy=policy_for_session(row.config, self.settings.tool_policy),
            redactor=self.sandboxing.redactor,
            approver=approver_for_session(row.config),
        )
        if self.sandboxing.unavailable is None:
            tools.add(Shell(self._sandbox_for, default_timeout=self.settings.shell_timeout_seconds))
        else:
            tools.unavailable["shell"] = self.sandboxing.unavailable
        agent_config = {
            "min_call_seconds": self.settings.model_call_min_seconds,
            "max_parallel_tools": self.settings.max_parallel_tools,
            "context": {
                "compact_at": self.settings.context_compact_at,
                "compact_to": self.settings.context_compact_to,
                "summary_share": self.settings.context_summary_share,
            },
            **row.config.get("agent", {}),
        }
        config = AgentConfig.model_validate(agent_config)
        summary = self.models.get(self.settings.summary_model) if self.settings.summary_model else None
        return SessionSetup(model=model, tools=tools, config=config, slot=lambda: self._slots, summary_model=summary)

    def _refuse_when_low(self) -> None:
        """No sandboxed command starts while the disk holding the store is under its watermark.

        Raises:
            CommandRefused: saying so (the tool's result reads ``not run: ...``).
        """
        why = self.disk.low()
        if why is not None:
            raise CommandRefused(why)

    async def _sandbox_for(self, ctx: ToolContext) -> Sandbox:
        """One shell call's sandbox: the session's work directory, under its live goal's network and secrets.

        A subagent's call runs in its own child session, which has no goal: the goal is looked up
        through the ``parent_session_id`` chain, and the topmost session's live goal decides, so a
        child gets exactly its root goal's sandbox (never the daemon-wide default, which may allow
        more, e.g. the network). Every command of a goal (its sessions' calls, parallel ones
        included, and its verification and progress commands) runs in the goal's one cgroup, under
        its caps for all of them together; a session of no goal has one of its own (its root's).
        """
        if ctx.workdir is None:
            raise SandboxUnavailable("this session has no work directory")
        self._refuse_when_low()
        assert self.rt is not None
        chain, goal = await self.rt.store.read(lambda conn: _chain_and_goal(conn, ctx.session_id))
        report = self._network_report(ctx.session_id, toolUseId=ctx.call_id, turnId=ctx.turn_id)
        if goal is None:
            group = chain[-1] if chain else ctx.session_id
            return self.sandboxing.sandbox(ctx.workdir, limits_group=group, report=report)
        policy = goal_policy(self.sandboxing, goal)
        return self.sandboxing.sandbox(ctx.workdir, policy=policy, limits_group=goal.id, report=report)

    def _network_report(self, session_id: str, **context: str | None) -> Report | None:
        """Where a command's attempts through the network proxy go: ``sandbox/network`` events of
        ``session_id`` (the log before the store is open)."""
        return None if self.network_events is None else self.network_events.reporter(session_id, **context)

    def _goal_runner(self, goal: Goal) -> CommandRunner:
        """Where ``goal``'s verification and progress commands run: its own sandbox and cgroup, as its shell."""
        policy = goal_policy(self.sandboxing, goal)
        report = self._network_report(goal.session_id, goalId=goal.id)

        def sandbox_for(workdir: Path) -> Sandbox:
            self._refuse_when_low()
            return self.sandboxing.sandbox(workdir, policy=policy, limits_group=goal.id, report=report)

        return sandboxed_runner(sandbox_for, goal_redactor(self.sandboxing, goal.sandbox))

    def learn_secrets(self, spec: SandboxSpec) -> None:
        """Redact the secrets ``spec`` names from every tool's output of sessions resolved from now on
        (a goal's own session is resolved after the goal is created)."""
        if spec.secrets:
            self.sandboxing = dataclasses.replace(self.sandboxing, redactor=goal_redactor(self.sandboxing, spec))

    async def _learn_live_goal_secrets(self, rt: Runtime) -> None:
        await rt.store.migrate("goals", GOAL_MIGRATIONS)  # what the engine's start does first (idempotent)
        for sandbox in await rt.store.read(live_goal_sandboxes_with_secrets):
            self.learn_secrets(sandbox)
