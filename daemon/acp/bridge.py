"""The ACP agent: editor sessions mapped 1:1 onto goald sessions of an embedded daemon host.

* ``initialize`` advertises ``loadSession`` and text/resource prompts.
* ``session/new`` creates a goald session working in the editor's ``cwd``; ``session/load``
  replays a goald session's history as updates and then streams it live. Both advertise ``/goal``.
* ``session/prompt`` enqueues the prompt as a follow-up and owns the interval up to the next
  whole-agent idle (see :mod:`daemon.acp.prompt`); a second prompt while one is in flight is
  refused with ``invalid_params`` (the slot is reserved before any ``await``).
* ``/goal OBJECTIVE`` starts a goal on the session and settles ``end_turn`` as soon as the goal is
  durable; the goal engine then advances it at each idle from durable goal state (never from an
  ACP prompt) and its rounds stream as updates outside any prompt. ``/goal status|pause|resume|
  cancel`` manage it.
* ``session/cancel`` cancels the in-flight prompt (its message if still queued, and the running
  turn); with no prompt in flight it interrupts the running turn and pauses an active goal.
"""

from __future__ import annotations

import contextlib
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from acp import PROTOCOL_VERSION, RequestError
from acp.interfaces import Client
from acp.schema import (
    AgentCapabilities,
    AllowedOutcome,
    AudioContentBlock,
    ClientCapabilities,
    EmbeddedResourceContentBlock,
    ImageContentBlock,
    Implementation,
    InitializeResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PermissionOption,
    PromptCapabilities,
    PromptResponse,
    ResourceContentBlock,
    TextContentBlock,
    TextResourceContents,
    ToolCallUpdate,
)
from loguru import logger

from agent import (
    AgentError,
    Conflict,
    InvalidInput,
    InvalidTransition,
    MessageId,
    NotFound,
    Runtime,
    Source,
    SourceKind,
    StoreClosed,
    TaskSet,
    ToolContext,
)
from daemon import __version__
from daemon.acp.permissions import AskingRegistry
from daemon.acp.prompt import PromptSlot
from daemon.acp.session import AcpSession
from daemon.acp.updates import ACP_SOURCE_REF, Update, agent_text, goal_commands, tool_kind, tool_title
from daemon.display import goal_line
from daemon.ports import HostPort
from goals import Goal, GoalEngine, GoalSpec, GoalStatus, latest_goal_of_session, live_goal_of_session

INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
METHOD_NOT_FOUND = -32601
PromptBlock = (
    TextContentBlock | ImageContentBlock | AudioContentBlock | ResourceContentBlock | EmbeddedResourceContentBlock
)


def invalid(message: str) -> RequestError:
    """An ``invalid_params`` error whose message says what was wrong."""
    return RequestError(INVALID_PARAMS, message)


def prompt_text(blocks: list[PromptBlock]) -> str:
    """The prompt as one text: text as is, resource links as links, embedded text resources quoted."""
    parts: list[str] = []
    for block in blocks:
        if isinstance(block, TextContentBlock):
            parts.append(block.text)
        elif isinstance(block, ResourceContentBlock):
            parts.append(f"[{block.name}]({block.uri})")
        elif isinstance(block, EmbeddedResourceContentBlock) and isinstance(block.resource, TextResourceContents):
            parts.append(f'<resource uri="{block.resource.uri}">\n{block.resource.text}\n</resource>')
        else:
            raise invalid("goald takes text, resource links and embedded text resources; not images, audio or blobs")
    text = "\n".join(parts)
    if not text.strip():
        raise invalid("the prompt is empty")
    return text


def goal_command(text: str) -> str | None:
    """The argument of a ``/goal`` command (``""`` for a bare ``/goal``), or ``None``."""
    stripped = text.strip()
    if stripped == "/goal":
        return ""
    if stripped.startswith("/goal") and stripped[5].isspace():
        return stripped[5:].strip()
    return None


class AcpBridge:
    """The ACP ``Agent`` of ``goald acp`` (see the module docstring)."""

    def __init__(self, host: HostPort) -> None:
        self.host = host
        self.client: Client | None = None
        self.sessions: dict[str, AcpSession] = {}
        #: Whether to ask the editor about calls outside the tool policy (see daemon.acp.permissions).
        self.asks_permission = True
        #: Tool names the editor allowed always, by session.
        self._always: dict[str, set[str]] = {}
        self._tasks = TaskSet()
        self._closed = False

    def on_connect(self, conn: Client) -> None:
        """Keep the connection: updates and permission requests go through it."""
        self.client = conn

    # -- plumbing --------------------------------------------------------------------------

    def _runtime(self) -> Runtime:
        rt = self.host.rt
        if rt is None or self._closed or self.host.state != "serving":
            raise RequestError(INTERNAL_ERROR, "goald is not serving (it is starting or shutting down)")
        return rt

    def _engine(self) -> GoalEngine:
        self._runtime()
        assert self.host.engine is not None
        return self.host.engine

    async def _send(self, session_id: str, update: Update) -> None:
        if self.client is None:
            raise ConnectionError("no ACP client is connected")
        await self.client.session_update(session_id=session_id, update=update)

    def _later(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` after the current response is queued (the sender keeps FIFO order)."""
        self._tasks.spawn(coro)

    async def _quietly(self, session_id: str, update: Update) -> None:
        try:
            await self._send(session_id, update)
        except (ConnectionError, OSError) as exc:
            logger.debug("could not send an update to the ACP client: {}", exc)

    def _session(self, session_id: str) -> AcpSession:
        view = self.sessions.get(session_id)
        if view is None:
            raise invalid(f"unknown session {session_id!r}: create it with session/new or load it with session/load")
        return view

    async def _open(self, session_id: str, *, replay: bool) -> AcpSession:
        rt = self._runtime()
        try:
            agent = await rt.agent(session_id)
        except (NotFound, InvalidInput) as exc:
            raise invalid(str(exc)) from None
        if not isinstance(agent.tools, AskingRegistry):
            agent.tools = AskingRegistry(agent.tools, self._ask)
            agent.add_tools([])  # the offered tools changed: recount their size
        view = AcpSession(rt.store, agent, self._send, self._engine().get)
        self.sessions[session_id] = view
        try:
            await view.open(replay=replay)
        except BaseException:
            self.sessions.pop(session_id, None)
            await view.close()
            raise
        return view

    def _workdir(self, cwd: str) -> str:
        path = Path(cwd).expanduser()
        if not path.is_absolute():
            raise invalid(f"cwd {cwd!r} must be an absolute path")
        if self.host.settings.workdir_roots:
            # Configured roots bind editors too.
            try:
                return str(self.host.workdirs.resolve(cwd, "acp"))
            except ValueError as exc:
                raise invalid(str(exc)) from None
        if not path.is_dir():
            raise invalid(f"cwd {cwd!r} does not exist or is not a directory")
        return str(path.resolve())

    async def close(self) -> None:
        """Stop every session's stream; prompts in flight settle as cancelled."""
        self._closed = True
        for view in list(self.sessions.values()):
            await view.close()
        await self._tasks.cancel()

    # -- ACP methods -----------------------------------------------------------------------

    async def initialize(
        self,
        protocol_version: int,
        client_capabilities: ClientCapabilities | None = None,
        client_info: Implementation | None = None,
        **kwargs: Any,
    ) -> InitializeResponse:
        """Negotiate: goald speaks ACP version 1 and can load sessions."""
        return InitializeResponse(
            protocol_version=min(protocol_version, PROTOCOL_VERSION),
            agent_capabilities=AgentCapabilities(
                load_session=True, prompt_capabilities=PromptCapabilities(embedded_context=True)
            ),
            agent_info=Implementation(name="goald", title="goald", version=__version__),
            auth_methods=[],
        )

    async def new_session(
        self, cwd: str, additional_directories: list[str] | None = None, mcp_servers: Any = None, **kwargs: Any
    ) -> NewSessionResponse:
        """Create a goald session working in ``cwd`` (the default model)."""
        rt = self._runtime()
        workdir = self._workdir(cwd)
        try:
            self.host.models.get(None)
        except InvalidInput as exc:
            raise RequestError(INTERNAL_ERROR, f"the default model is not usable: {exc}") from None
        sid = await rt.create_session(workdir=workdir, config={"acp": True})
        await self._open(sid, replay=False)
        self._later(self._quietly(sid, goal_commands()))
        return NewSessionResponse(session_id=sid)

    async def load_session(
        self,
        cwd: str,
        session_id: str,
        mcp_servers: Any = None,
        additional_directories: list[str] | None = None,
        **kwargs: Any,
    ) -> LoadSessionResponse:
        """Replay a goald session's history as updates, then stream it live."""
        old = self.sessions.get(session_id)
        if old is not None:
            if old.slot is not None:
                raise invalid("a prompt is in flight on this session; it cannot be reloaded now")
            del self.sessions[session_id]
            await old.close()
        await self._open(session_id, replay=True)
        self._later(self._quietly(session_id, goal_commands()))
        return LoadSessionResponse()

    async def prompt(self, session_id: str, prompt: list[PromptBlock], **kwargs: Any) -> PromptResponse:
        """Run one prompt: settle at whole-agent idle with the admitting turn's stop reason."""
        view = self._session(session_id)
        if view.slot is not None:
            raise invalid("a prompt is already in flight on this session; wait for its response or send session/cancel")
        text = prompt_text(prompt)
        slot = PromptSlot(MessageId.new())
        view.slot = slot  # reserved before any await
        try:
            command = goal_command(text)
            if command is not None:
                reply = await self._goal_command(view, command)
                await self._send(session_id, agent_text(reply))
                return PromptResponse(stop_reason="end_turn")
            try:
                await view.agent.followup(
                    text, message_id=slot.message_id, source=Source(kind=SourceKind.USER, ref=ACP_SOURCE_REF)
                )
            except InvalidInput as exc:
                raise invalid(str(exc)) from None
            except (StoreClosed, AgentError) as exc:
                raise RequestError(INTERNAL_ERROR, str(exc)) from None
            slot.enqueued = True
            if slot.cancel_requested:
                # session/cancel arrived while the enqueue committed.
                await self._cancel_prompt(view, slot)
            await slot.settled
            return PromptResponse(stop_reason=slot.outcome())
        finally:
            if view.slot is slot:
                view.slot = None

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        """Cancel the in-flight prompt; with none, interrupt the running turn and pause an active goal."""
        view = self.sessions.get(session_id)
        if view is None:
            return
        slot = view.slot
        if slot is not None:
            slot.cancel_requested = True
            if slot.enqueued:
                await self._cancel_prompt(view, slot)
            return
        goal = await self._session_goal(session_id, live=True)
        if goal is not None and goal.status is GoalStatus.ACTIVE:
            with contextlib.suppress(InvalidTransition):
                await self._engine().pause(goal.id)
        await view.agent.interrupt()

    async def _cancel_prompt(self, view: AcpSession, slot: PromptSlot) -> None:
        try:
            await view.agent.cancel_message(slot.message_id)
        except (InvalidTransition, NotFound):
            pass  # already admitted (or cancelled): interrupting the turn is what is left
        # The running turn is what the editor's stop button means, whoever queued it.
        await view.agent.interrupt()

    async def _ask(self, name: str, args: dict[str, Any], ctx: ToolContext, why: str) -> bool:
        """Put a call the policy denies to the editor, while a prompt is in flight (else deny)."""
        view = self.sessions.get(ctx.session_id)
        # A /goal command's reservation enqueues nothing: the goal's rounds stay unattended.
        waiting = view is not None and view.slot is not None and view.slot.enqueued
        if view is None or not waiting or not self.asks_permission or self.client is None:
            return False
        always = self._always.setdefault(ctx.session_id, set())
        if name in always:
            return True
        # The editor hears of the call (tool_call) before it is asked about it: the answer that made
        # the call committed (the driver may have deferred it: agent.step), then projected.
        await ctx.settle()
        await view.reached((await view.store.session_state(ctx.session_id)).last_seq)
        call = ToolCallUpdate(
            tool_call_id=ctx.call_id,
            title=tool_title(name, args),
            kind=tool_kind(name),
            status="pending",
            raw_input=args,
        )
        options = [
            PermissionOption(option_id="allow_once", name="Allow once", kind="allow_once"),
            PermissionOption(option_id="allow_always", name=f"Always allow {name} here", kind="allow_always"),
            PermissionOption(option_id="reject_once", name=f"Reject ({why})"[:200], kind="reject_once"),
        ]
        try:
            answer = await self.client.request_permission(session_id=ctx.session_id, tool_call=call, options=options)
        except RequestError as exc:
            if exc.code == METHOD_NOT_FOUND:
                self.asks_permission = False
            logger.info("the editor did not answer a permission request: {}", exc)
            return False
        except (ConnectionError, OSError):
            return False
        outcome = answer.outcome
        if not isinstance(outcome, AllowedOutcome) or outcome.option_id not in ("allow_once", "allow_always"):
            return False
        if outcome.option_id == "allow_always":
            always.add(name)
        return True

    # -- /goal -----------------------------------------------------------------------------

    async def _session_goal(self, session_id: str, *, live: bool) -> Goal | None:
        find = live_goal_of_session if live else latest_goal_of_session
        return await self._runtime().store.read(lambda conn: find(conn, session_id))

    async def _goal_command(self, view: AcpSession, arg: str) -> str:
        word = arg.lower()
        if word in ("", "status"):
            goal = await self._session_goal(view.session_id, live=False)
            if goal is None:
                return "This session has no goal. Start one with /goal OBJECTIVE."
            lines = [goal_line(goal)]
            lines += [f"- {note}" for note in goal.memory.notes[-5:]]
            if goal.result_summary:
                lines.append(f"Result: {goal.result_summary}")
            return "\n".join(lines)
        if word in ("pause", "resume", "cancel"):
            return await self._goal_change(view, word)
        return await self._goal_start(view, arg)

    async def _goal_change(self, view: AcpSession, word: str) -> str:
        goal = await self._session_goal(view.session_id, live=word != "resume")
        if goal is None:
            return "This session has no active or paused goal."
        engine = self._engine()
        try:
            if word == "pause":
                goal = await engine.pause(goal.id)
            elif word == "resume":
                goal = await engine.resume(goal.id)
            else:
                goal = await engine.cancel(goal.id)
        except (InvalidTransition, InvalidInput) as exc:
            return f"Could not {word} goal {goal.id}: {exc}"
        return f"Goal {goal.id} is {goal.status.value}."

    async def _goal_start(self, view: AcpSession, objective: str) -> str:
        live = await self._session_goal(view.session_id, live=True)
        if live is not None:
            return (
                f"This session already has goal {live.id} ({live.status.value}): {live.title}. "
                "Use /goal status, /goal pause, /goal resume or /goal cancel."
            )
        try:
            goal = await self._engine().create(GoalSpec(objective=objective, session_id=view.session_id))
        except (InvalidInput, Conflict, NotFound, ValueError) as exc:
            return f"Could not start the goal: {exc}"
        # The goal is durable; its plan goes out before the response (the rounds follow later).
        await view.reached((await view.store.session_state(view.session_id)).last_seq)
        return (
            f"Goal {goal.id} started: {goal.title}. It works in rounds on this session; their progress "
            "streams here. /goal status, /goal pause, /goal resume and /goal cancel manage it."
        )
