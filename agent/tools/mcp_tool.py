"""One tool of an MCP server as the model sees it (:class:`McpTool`), and its result as text.

Its name is ``{server}__{tool}`` (OpenAI tool names allow only ``[a-zA-Z0-9_-]``, so a double
underscore is the separator and other characters become ``_``). The server validates its own
arguments against the schema it published, so the tool's argument model accepts any object and
passes it through; the call goes to its :class:`~agent.tools.mcp.McpServer`.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from agent.models.base import ToolSpec
from agent.tools.base import Tool, ToolContext, ToolOutput

if TYPE_CHECKING:
    from mcp.types import CallToolResult
    from mcp.types import Tool as RemoteTool

    from agent.tools.mcp import McpServer

_MAX_NAME = 64  # the longest tool name OpenAI accepts
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def tool_name(server: str, tool: str) -> str:
    """The name a server's tool goes by: ``{server}__{tool}``, made safe for every provider."""
    return (server + "__" + _UNSAFE.sub("_", tool))[:_MAX_NAME]


class McpArgs(BaseModel):
    """Any JSON object: the server checks the arguments against the schema it published."""

    model_config = ConfigDict(extra="allow")


class McpTool(Tool[McpArgs]):
    """One tool of an MCP server, offered with the server's own input schema."""

    Args = McpArgs

    def __init__(self, server: McpServer, remote: RemoteTool) -> None:
        self.server = server
        #: The tool's name on its server.
        self.remote_name = remote.name
        self.name = tool_name(server.name, remote.name)  # type: ignore[misc]
        self.description = (  # type: ignore[misc]
            remote.description or remote.title or f"{remote.name} (from MCP server {server.name})"
        )
        schema = dict(remote.input_schema)
        schema.setdefault("type", "object")
        if schema["type"] == "object":
            schema.setdefault("properties", {})
        self.input_schema = schema
        hints = remote.annotations
        self.repeat_safe = bool(hints and (hints.read_only_hint or hints.idempotent_hint))
        self.timeout = server.call_timeout

    def spec(self) -> ToolSpec:
        """The tool with the schema its server published."""
        return ToolSpec(name=self.name, description=self.description, input_schema=self.input_schema)

    async def run(self, args: McpArgs, ctx: ToolContext) -> ToolOutput:
        return await self.server.call(self.remote_name, args.model_dump())


def render(result: CallToolResult) -> ToolOutput:
    """A tool result as text for the model (binary content is described, not shown)."""
    from mcp.types import AudioContent, EmbeddedResource, ImageContent, ResourceLink, TextContent

    parts: list[str] = []
    for block in result.content:
        if isinstance(block, TextContent):
            parts.append(block.text)
        elif isinstance(block, ImageContent | AudioContent):
            parts.append(f"[{block.type} ({block.mime_type}, {len(block.data) * 3 // 4} bytes) not shown]")
        elif isinstance(block, ResourceLink):
            parts.append(f"[resource {block.uri}]")
        elif isinstance(block, EmbeddedResource):
            text = getattr(block.resource, "text", None)
            parts.append(text if isinstance(text, str) else f"[resource {block.resource.uri} (binary) not shown]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content))
    return ToolOutput("\n".join(parts) or "(no output)", is_error=result.is_error)
