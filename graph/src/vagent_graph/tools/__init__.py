"""Tools the agent may call. Register new ones here or via the `vagent.tools` entry point."""

from vagent_graph.tools.registry import Question, Tool, ToolContext, ToolRegistry, default_registry

__all__ = ["Question", "Tool", "ToolContext", "ToolRegistry", "default_registry"]
