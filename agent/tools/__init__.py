"""Tools: the typed interface, the registry, and built-in tools."""

from agent.tools.base import FunctionTool, Tool, ToolContext, ToolOutput, ToolRegistry, truncate

__all__ = ["FunctionTool", "Tool", "ToolContext", "ToolOutput", "ToolRegistry", "truncate"]
