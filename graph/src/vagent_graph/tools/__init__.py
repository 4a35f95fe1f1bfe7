"""Tools the agent may call. Register new ones here or via the `vagent.tools` entry point."""

from vagent_graph.tools.registry import (
    Question,
    Services,
    ServiceUnavailable,
    Tool,
    ToolContext,
    ToolRegistry,
    ToolResult,
    default_registry,
)

__all__ = [
    "Question",
    "ServiceUnavailable",
    "Services",
    "Tool",
    "ToolContext",
    "ToolRegistry",
    "ToolResult",
    "default_registry",
]
