"""A real stdio MCP server, written with the official ``mcp`` SDK, for tests/agent/test_mcp.py.

Run as ``python tests/mcp_fixture_server.py``; it speaks MCP over stdin/stdout until stdin closes.
Imported (by a daemon's ``scripted`` provider, ``script = "mcp_fixture_server:models"``), it gives
the ``caller`` model, which calls this server's tools.
"""

from __future__ import annotations

import os
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

server = MCPServer("fixture")

#: In-process state, to show that a restarted server starts afresh.
_calls = 0


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def add(a: int, b: int) -> str:
    """Add two integers and say the sum."""
    return f"{a} + {b} = {a + b}"


@server.tool()
def count() -> str:
    """Count the calls of this tool since the server started."""
    global _calls
    _calls += 1
    return f"call {_calls}"


@server.tool()
def pid() -> str:
    """The server's process id."""
    return str(os.getpid())


@server.tool()
def env(name: str) -> str:
    """The value of an environment variable, or ``(unset)``."""
    return os.environ.get(name, "(unset)")


@server.tool()
def fail(reason: str) -> str:
    """Always fail, with ``reason``."""
    raise ToolError(f"refused: {reason}")


@server.tool()
async def hang(address: str) -> str:
    """Send this process's id to the unix socket at ``address`` (the test waits for it), then never answer."""
    async with await anyio.connect_unix(address) as stream:
        await stream.send(f"{os.getpid()}\n".encode())
    await anyio.sleep_forever()
    return "unreachable"


def models(name: str) -> Any:
    """``caller``: calls ``fixture__add`` (2 + 3), then ``fixture__pid``, then says what it got."""
    from agent import Reply, ScriptedModel, ToolResultBlock

    if name != "caller":
        return None

    def rule(request: Any) -> Reply:
        results = [b.content for m in request.messages for b in m.content if isinstance(b, ToolResultBlock)]
        if not results:
            return Reply.call("fixture__add", a=2, b=3)
        if len(results) == 1:
            return Reply.call("fixture__pid")
        return Reply.say(f"the server said {results[0]!r} from process {results[1]}")

    return ScriptedModel(rule, name="caller", record=False)


if __name__ == "__main__":
    server.run("stdio")
