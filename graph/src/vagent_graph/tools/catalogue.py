"""The built-in tools, and the registry the service starts with: those plus the tools of every
installed package's `vagent.tools` entry point. A new built-in tool is one line here (and its
module in tools/); a tool from elsewhere is a source (registry.py) and needs no line here."""

from __future__ import annotations

from importlib.metadata import entry_points

import structlog

from vagent_graph.tools import ask_user, documents, entities, memory, records, schedule, tickets
from vagent_graph.tools.base import Tool
from vagent_graph.tools.registry import ToolRegistry

log = structlog.get_logger(__name__)

ENTRY_POINT_GROUP = "vagent.tools"


def builtin_tools() -> list[Tool]:
    """The tools that ship with the service (an agent descriptor enables some of them)."""
    return [
        documents.TOOL,
        entities.TOOL,
        *records.TOOLS,
        *tickets.TOOLS,
        ask_user.TOOL,
        memory.TOOL,
        schedule.TOOL,
    ]


def default_registry() -> ToolRegistry:
    """Built-in tools plus any installed package's `vagent.tools` entry points.

    An entry point names a callable returning a Tool or a list of Tools (a ToolSource).
    """
    registry = ToolRegistry()
    registry.add_source(builtin_tools)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            registry.add_source(ep.load())
        except Exception:  # a broken plugin must not take the service down
            log.exception("tool_plugin_failed", entry_point=ep.name)
    return registry
