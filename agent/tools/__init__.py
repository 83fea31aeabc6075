"""Tools: the typed interface, the registry, and built-in tools."""

from agent.tools.base import FunctionTool, Tool, ToolContext, ToolOutput, ToolRegistry, truncate
from agent.tools.files import EditFile, ListDir, PathDenied, ReadFile, WriteFile, confine, file_tools
from agent.tools.mcp import McpServer, McpServers, McpUnavailable
from agent.tools.mcp_tool import McpTool
from agent.tools.policy import ToolPolicy, split_command
from agent.tools.shell import Shell, ShellArgs

__all__ = [
    "EditFile",
    "FunctionTool",
    "ListDir",
    "McpServer",
    "McpServers",
    "McpTool",
    "McpUnavailable",
    "PathDenied",
    "ReadFile",
    "Shell",
    "ShellArgs",
    "Tool",
    "ToolContext",
    "ToolOutput",
    "ToolPolicy",
    "ToolRegistry",
    "WriteFile",
    "confine",
    "file_tools",
    "split_command",
    "truncate",
]
