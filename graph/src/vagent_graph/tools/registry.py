"""The tools this process offers, by name, and how a source adds its own.

The workflow reads the registry and never names a tool. Tools come from sources, each added
with `add_source`: the built-in catalogue (catalogue.py), the `vagent.tools` entry points of
installed packages, and, next, MCP servers. A source is any callable returning a Tool or a
list of Tools (what an entry point names), so a new kind of source changes neither this
module nor the built-in tools. A name is registered once: a second tool of that name is
refused, whichever source brings it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from vagent_graph.tools.base import Tool

#: Where tools come from; called once, when its tools are added.
ToolSource = Callable[[], Tool | list[Tool]]


class ToolRegistry:
    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.register(t)

    def register(self, tool: Tool) -> Tool:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} registered twice")
        self._tools[tool.name] = tool
        return tool

    def add_source(self, source: ToolSource) -> list[Tool]:
        """Register every tool `source` returns, in its order (a taken name raises ValueError;
        the tools before it stay registered)."""
        found = source()
        return [self.register(t) for t in (found if isinstance(found, list) else [found])]

    def remove(self, name: str) -> None:
        """Take a tool away (an MCP server that no longer lists it); unknown names are ignored."""
        self._tools.pop(name, None)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())
