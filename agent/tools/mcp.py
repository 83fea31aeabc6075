"""MCP servers as tools: stdio servers named in configuration, spoken to with the official ``mcp`` SDK.

An :class:`McpServer` is one configured server: a command (run in its :class:`~agent.sandbox.Sandbox`
when one is given, or wrapped by a ``wrap`` function) started on first use, whose tools appear to
the model as ``{server}__{tool}`` (:class:`McpTool`; OpenAI tool names allow only
``[a-zA-Z0-9_-]``, so a double underscore is the separator and other characters become ``_``). The
server validates its own arguments against the schema it published, so the tool's argument model
accepts any object and passes it through.

Lifetime. The SDK runs its own anyio tasks and its context managers (the transport and the client
session) must be entered and left by one task. So each connection is owned by a dedicated runner
task that enters them in an exit stack, reports the tool listing, and then waits inside a cancel
scope; stopping a connection cancels that scope and awaits the task, which unwinds the stack (the
transport closes the server's stdin, then terminates and kills it if it does not exit). Calls from
other tasks only send requests over the live session.

Crashes. The runner watches the server's output stream: when it ends, the connection is lost.
A call that was in flight when the server died (its outcome unknown) returns an error saying the
server crashed and was restarted, and asks for a retry only if the call is safe to repeat; the
server is restarted before that answer. A server found dead between calls is restarted before the
call is sent, since that call never reached it. What the server writes to stderr is logged (debug)
and its last lines explain a failed start.

Secrets. A server's environment values commonly are tokens. In a sandbox they are the sandbox's
secrets, handed to bwrap through a pipe (:meth:`~agent.sandbox.Sandbox.launcher`), so that no
command line (``/proc/<pid>/cmdline``, readable by every local user) carries them; and every value is
redacted from what the server's tools return, as tool secrets are.

Limits. A sandboxed server runs under its sandbox's caps on processes and memory
(:mod:`agent.limits`), in a group of its own for each start: the launching bash enters it before
it becomes bwrap (:meth:`~agent.sandbox.Sandbox.launcher`), and it is removed when the server has
exited; a limit it hit is logged then.

The server's streams (the read stream that notices the server's end, the stderr pipe whose last
lines explain a failed start) are :mod:`agent.tools.mcp_streams`'s.

``mcp`` is imported lazily: it takes half a second to import and most commands never need it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
from loguru import logger

from agent.errors import AgentError
from agent.limits import Group
from agent.redact import Redactor
from agent.sandbox import Sandbox
from agent.tools.base import ToolOutput
from agent.tools.mcp_streams import StderrTail, WatchedStream
from agent.tools.mcp_tool import McpTool, render

if TYPE_CHECKING:
    from mcp import ClientSession
    from mcp.types import Tool as RemoteTool

#: A function that wraps a server's command line (e.g. in a sandbox): argv in, argv out.
Wrap = Callable[[list[str]], list[str]]

#: Server names: letters, digits, ``-`` and single ``_`` (a double underscore separates server and tool).
SERVER_NAME = re.compile(r"^[A-Za-z0-9-]+(?:_[A-Za-z0-9-]+)*$")


class McpUnavailable(AgentError, RuntimeError):
    """An MCP server could not be started (or was shut down); the message says why."""


@dataclass(eq=False)
class _Connection:
    """One started server process and its client session, owned by ``task``."""

    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    #: Set when the server's output ended (it exited or closed its pipes).
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    session: ClientSession | None = None
    tools: list[RemoteTool] = field(default_factory=list)
    task: asyncio.Task[None] | None = None


class McpServer:
    """One configured stdio MCP server: started on first use, restarted after a crash.

    Args:
        name: The server's name; its tools are called ``{name}__{tool}``.
        command: The command line that starts the server.
        env: Extra environment variables (over a minimal inherited set: ``PATH``, ``HOME``, ...);
            their values are redacted from the tools' output.
        wrap: Wraps the command line, e.g. a sandbox's ``argv`` (no secrets: they would be on it).
        sandbox: The sandbox to run the server in; its secrets (give it ``env`` as ``secrets``)
            reach the server on no command line. Takes the place of ``wrap`` and of passing ``env``.
        cwd: The server's working directory.
        start_timeout: Seconds to wait for the server's handshake and tool listing.
        call_timeout: Each tool call's timeout.
    """

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        env: dict[str, str] | None = None,
        *,
        wrap: Wrap | None = None,
        sandbox: Sandbox | None = None,
        cwd: str | os.PathLike[str] | None = None,
        start_timeout: float = 30.0,
        call_timeout: float = 60.0,
    ) -> None:
        self.check_name(name)
        if not command:
            raise ValueError(f"MCP server {name}: the command is empty")
        self.name = name
        self.command = list(command)
        self.env = dict(env or {})
        self.wrap = wrap
        self.sandbox = sandbox
        #: Redacts the server's environment values (and its sandbox's secrets) from every result.
        self.redactor = Redactor([*self.env.values(), *(sandbox.secrets.values() if sandbox is not None else ())])
        self.cwd = cwd
        self.start_timeout = start_timeout
        self.call_timeout = call_timeout
        #: How many times the server process was started.
        self.starts = 0
        self._conn: _Connection | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        self._tools: list[McpTool] = []

    @staticmethod
    def check_name(name: str) -> str:
        """``name`` if it can prefix tool names.

        Raises:
            ValueError: it cannot (letters, digits, ``-`` and single ``_`` only).
        """
        if not SERVER_NAME.match(name) or len(name) > 32:
            raise ValueError(f"MCP server name {name!r}: use up to 32 letters, digits, '-' and single '_'")
        return name

    async def __aenter__(self) -> McpServer:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    @property
    def running(self) -> bool:
        """Whether a server process is connected and has not been seen to exit."""
        conn = self._conn
        return conn is not None and conn.session is not None and not conn.lost.is_set()

    async def wait_lost(self) -> None:
        """Wait until the current server process is seen to exit (returns at once if none runs)."""
        conn = self._conn
        if conn is not None:
            await conn.lost.wait()

    async def start(self) -> None:
        """Start the server now, if it is not running.

        Raises:
            McpUnavailable: it could not be started; the message says why.
        """
        await self._ensure()

    async def tools(self) -> list[McpTool]:
        """The server's tools (starting it if needed)."""
        await self._ensure()
        return list(self._tools)

    def cached_tools(self) -> list[McpTool]:
        """The tools of the last successful listing (empty if the server never started)."""
        return list(self._tools)

    async def call(self, tool: str, arguments: dict[str, Any]) -> ToolOutput:
        """Call ``tool`` (its name on the server). Faults come back as error outputs, never raised."""
        from mcp.shared.exceptions import MCPError
        from mcp.types import CONNECTION_CLOSED

        try:
            conn = await self._ensure()
        except McpUnavailable as exc:
            return ToolOutput(str(exc), is_error=True)
        assert conn.session is not None
        try:
            result = await conn.session.call_tool(tool, arguments)
        except MCPError as exc:
            # The SDK's own "connection closed" (a server's error may reuse the code, not the message).
            closed = exc.code == CONNECTION_CLOSED and exc.message == "Connection closed"
            if not closed and not conn.lost.is_set():
                return ToolOutput(self.redactor.redact(f"MCP server {self.name}: {exc.message}"), is_error=True)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass
        else:
            out = render(result)
            return ToolOutput(self.redactor.redact(out.content), out.is_error)
        return await self._after_crash(conn)

    async def aclose(self) -> None:
        """Stop the server; later calls answer that it is shut down."""
        self._closed = True
        async with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                await self._stop(conn)

    # -- connections ---------------------------------------------------------------------------

    async def _after_crash(self, conn: _Connection) -> ToolOutput:
        if self._closed:
            return ToolOutput(f"MCP server {self.name} was shut down during the call", is_error=True)
        logger.warning("MCP server {} crashed during a call; restarting it", self.name)
        try:
            async with self._lock:
                if self._conn is conn:
                    self._conn = None
                    await self._stop(conn)
            await self._ensure()
        except McpUnavailable as exc:
            return ToolOutput(f"MCP server {self.name} crashed during the call; restarting it failed: {exc}", True)
        return ToolOutput(f"MCP server {self.name} crashed during the call; restarted; retry if the call is safe", True)

    async def _ensure(self) -> _Connection:
        conn = self._conn
        if conn is not None and conn.session is not None and not conn.lost.is_set():
            return conn
        async with self._lock:
            if self._closed:
                raise McpUnavailable(f"MCP server {self.name} is shut down")
            conn = self._conn
            if conn is not None and not conn.lost.is_set():
                return conn
            if conn is not None:
                logger.warning("MCP server {} exited; restarting it", self.name)
                self._conn = None
                await self._stop(conn)
            conn = await self._connect()
            self._conn = conn
            self._tools = self._wrap_tools(conn.tools)
            return conn

    def _wrap_tools(self, remote: Iterable[RemoteTool]) -> list[McpTool]:
        tools: dict[str, McpTool] = {}
        for item in remote:
            tool = McpTool(self, item)
            if tool.name in tools:
                logger.warning(
                    "MCP server {}: tool {!r} hidden: its name clashes as {!r}", self.name, item.name, tool.name
                )
                continue
            tools[tool.name] = tool
        return list(tools.values())

    async def _connect(self) -> _Connection:
        conn = _Connection()
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        stderr = StderrTail(self.name)
        self.starts += 1
        # The runner owns the SDK's context managers for the connection's whole life; see the module docstring.
        conn.task = asyncio.create_task(self._serve(conn, ready, stderr), name=f"mcp-server-{self.name}")
        try:
            async with asyncio.timeout(self.start_timeout):
                await ready
        except TimeoutError:
            await self._stop(conn)
            raise McpUnavailable(self._start_failure(f"no answer within {self.start_timeout:g}s", stderr)) from None
        except BaseException:
            await asyncio.shield(self._stop(conn))
            raise
        return conn

    async def _stop(self, conn: _Connection) -> None:
        conn.scope.cancel()
        if conn.task is not None:
            # Bounded: the transport's shutdown escalates to a kill within a few seconds.
            await conn.task

    async def _serve(self, conn: _Connection, ready: asyncio.Future[None], stderr: StderrTail) -> None:
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client
        from mcp.types import Implementation, PaginatedRequestParams

        failure: BaseException | None = None
        group: Group | None = None
        try:
            env: dict[str, str] | None = self.env or None
            if self.sandbox is not None:
                # Each start gets a group of its own under the sandbox's caps, removed when it ends.
                group = self.sandbox.limit_group()
                argv, env = self.sandbox.launcher(self.command, group=group)
            elif self.wrap is not None:
                argv = self.wrap(list(self.command))
            else:
                argv = list(self.command)
            params = StdioServerParameters(command=argv[0], args=argv[1:], env=env or None, cwd=self.cwd)
            with conn.scope:
                async with contextlib.AsyncExitStack() as stack:
                    errlog = stderr.open()
                    stack.callback(errlog.close)
                    read, write = await stack.enter_async_context(stdio_client(params, errlog=errlog))
                    errlog.close()  # the server holds its own copy
                    me = Implementation(name="goald", version="1")
                    client = ClientSession(WatchedStream(read, conn.lost), write, client_info=me)
                    session = await stack.enter_async_context(client)
                    await session.initialize()
                    listing = await session.list_tools()
                    conn.tools = list(listing.tools)
                    while listing.next_cursor:
                        listing = await session.list_tools(params=PaginatedRequestParams(cursor=listing.next_cursor))
                        conn.tools.extend(listing.tools)
                    conn.session = session
                    if not ready.done():
                        ready.set_result(None)
                    logger.info("MCP server {} started with {} tool(s)", self.name, len(conn.tools))
                    await anyio.sleep_forever()
        except Exception as exc:
            failure = exc
        finally:
            conn.lost.set()
            stderr.close()
            if not ready.done():
                reason = _reason(failure) if failure is not None else "it was stopped while starting"
                ready.set_exception(McpUnavailable(self._start_failure(reason, stderr)))
            elif failure is not None:
                logger.warning("MCP server {} connection ended: {}", self.name, _reason(failure))
            if group is not None:  # the server has exited: the transport waited for it (or killed it)
                if (verdict := group.verdict(failed=True)) is not None:
                    logger.warning("MCP server {}: {}", self.name, verdict)
                await asyncio.shield(group.remove())

    def _start_failure(self, reason: str, stderr: StderrTail) -> str:
        text = f"MCP server {self.name} could not start: {reason}"
        tail = stderr.tail()
        return f"{text}; its stderr ended with:\n{tail}" if tail else text


class McpServers:
    """The MCP servers of one process, started together on entry and stopped on exit.

    They start eagerly (not on first use): a session's tools are built synchronously from each
    server's listing. A server that cannot start is logged and offers no tools.
    """

    def __init__(self, servers: Iterable[McpServer] = ()) -> None:
        self.servers = list(servers)

    async def __aenter__(self) -> McpServers:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Start every server; failures are logged, not raised."""
        results = await asyncio.gather(*(s.start() for s in self.servers), return_exceptions=True)
        for result in results:
            if isinstance(result, McpUnavailable):
                logger.error("{}", result)
            elif isinstance(result, BaseException):
                await self.aclose()
                raise result

    def tools(self) -> list[McpTool]:
        """Every started server's tools."""
        return [tool for server in self.servers for tool in server.cached_tools()]

    async def aclose(self) -> None:
        """Stop every server."""
        await asyncio.gather(*(s.aclose() for s in self.servers))


def _reason(exc: BaseException) -> str:
    from mcp.shared.exceptions import MCPError

    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, FileNotFoundError):
        return f"command not found: {exc.filename or exc}"
    if isinstance(exc, MCPError):
        if exc.message == "Connection closed":
            return "it exited (or closed its output) before answering"
        return f"it answered the handshake with an error: {exc.message}"
    return f"{type(exc).__name__}: {exc}"
