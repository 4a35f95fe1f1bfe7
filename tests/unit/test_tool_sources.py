"""A new tool source (MCP servers come next) adds tools to the registry without touching the
built-in ones: a source is any callable returning a Tool or a list of Tools, added with
`ToolRegistry.add_source`; a name is registered once, whichever source brings it; a broken
`vagent.tools` entry point is skipped, never fatal."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest
from pydantic import BaseModel

from vagent_graph.tools import Tool, ToolContext, ToolRegistry, catalogue
from vagent_graph.tools.catalogue import builtin_tools, default_registry


class NoArgs(BaseModel):
    pass


async def _run(args: NoArgs, ctx: ToolContext, answer: str | None) -> str:
    return "ok"


def tool(name: str) -> Tool:
    return Tool(name=name, description=f"the {name} tool", args_model=NoArgs, run=_run)


def test_a_source_adds_its_tools_beside_the_built_in_ones() -> None:
    registry = ToolRegistry()
    registry.add_source(builtin_tools)
    before = registry.names()
    added = registry.add_source(lambda: [tool("calendar__list_events"), tool("calendar__create_event")])
    assert [t.name for t in added] == ["calendar__list_events", "calendar__create_event"]
    assert registry.names() == sorted([*before, "calendar__list_events", "calendar__create_event"])
    one = registry.add_source(lambda: tool("single"))
    assert [t.name for t in one] == ["single"] and "single" in registry


def test_a_name_taken_by_another_source_is_refused_and_the_first_tool_stays() -> None:
    registry = ToolRegistry()
    registry.add_source(builtin_tools)
    original = registry.get("search_documents")
    with pytest.raises(ValueError, match="'search_documents' registered twice"):
        registry.add_source(lambda: [tool("fresh"), tool("search_documents")])
    assert registry.get("search_documents") is original
    assert "fresh" in registry  # the tools before the collision stay


def test_a_broken_entry_point_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    good = EntryPoint("good", "tests.unit.test_tool_sources:plugin", catalogue.ENTRY_POINT_GROUP)
    bad = EntryPoint("bad", "tests.unit.test_tool_sources:missing", catalogue.ENTRY_POINT_GROUP)
    monkeypatch.setattr(catalogue, "entry_points", lambda group: [bad, good])
    registry = default_registry()
    assert "plugin_tool" in registry
    assert {t.name for t in builtin_tools()} <= set(registry.names())


def plugin() -> list[Tool]:
    return [tool("plugin_tool")]
