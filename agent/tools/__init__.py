"""Tools: the typed interface, the registry, and built-in tools."""

from agent.tools.base import FunctionTool, Tool, ToolContext, ToolOutput, ToolRegistry, truncate
from agent.tools.files import EditFile, ListDir, PathDenied, ReadFile, WriteFile, confine, file_tools

__all__ = [
    "EditFile",
    "FunctionTool",
    "ListDir",
    "PathDenied",
    "ReadFile",
    "Tool",
    "ToolContext",
    "ToolOutput",
    "ToolRegistry",
    "WriteFile",
    "confine",
    "file_tools",
    "truncate",
]
