"""Tools the agent may call: what a tool is (base.py), the registry (registry.py) and the
built-in ones (catalogue.py, one module each here). Another package adds its own through the
`vagent.tools` entry point; what tools work with is in vagent_graph.services."""

from vagent_graph.tools.base import (
    Changed,
    NothingToDo,
    Prepared,
    Question,
    Tool,
    ToolContext,
    ToolImage,
    ToolResult,
)
from vagent_graph.tools.registry import ToolRegistry, ToolSource

__all__ = [
    "Changed",
    "NothingToDo",
    "Prepared",
    "Question",
    "Tool",
    "ToolContext",
    "ToolImage",
    "ToolRegistry",
    "ToolResult",
    "ToolSource",
]
