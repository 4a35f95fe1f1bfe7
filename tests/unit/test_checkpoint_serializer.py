"""The checkpoint's serializer revives exactly what the library's does, and looks each stored
class up once per process, not once per message read (a failed import of the legacy
`langchain.schema` module per message was ~55 µs a message a turn)."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.redis.jsonplus_redis import JsonPlusRedisSerializer
from langgraph.types import Interrupt

from vagent_graph.state.checkpointer import CONSTRUCTOR_CACHE_MAX, CheckpointSerializer


def history() -> list[Any]:
    return [
        HumanMessage("what is in the travel policy?", id="h1"),
        AIMessage(
            "",
            id="a1",
            tool_calls=[{"id": "c1", "name": "search_documents", "args": {"query": "travel"}}],
        ),
        ToolMessage("economy class only", tool_call_id="c1", id="t1"),
        AIMessage("Economy class, always.", id="a2"),
        {"pending": Interrupt(value={"tool": "delete_records"}, id="i1"), "tags": {"x", "y"}},
    ]


@pytest.fixture
def imports(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every module import the serializers ask for."""
    asked: list[str] = []
    real = importlib.import_module

    def counting(name: str, package: str | None = None) -> Any:
        asked.append(name)
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", counting)
    return asked


def test_it_revives_what_the_library_revives_and_imports_each_class_once(imports: list[str]) -> None:
    stored = JsonPlusRedisSerializer().dumps_typed(history())
    library = JsonPlusRedisSerializer().loads_typed(stored)
    # the library looks up the legacy module of each message on every read, and fails
    assert imports.count("langchain.schema.messages") == 4, imports
    per_read_by_library = len(imports)

    ours = CheckpointSerializer()
    assert ours.loads_typed(stored) == library == history()
    for _ in range(5):  # every later turn reads the history again
        imports.clear()
        assert ours.loads_typed(stored) == library
        assert not [name for name in imports if name.startswith("langchain.")], imports
        assert len(imports) == per_read_by_library - 4  # only the reviver's own (found) lookups


def test_an_unknown_class_is_refused_as_the_library_refuses_it() -> None:
    envelope = {"lc": 1, "type": "constructor", "id": ["no_such_pkg", "Thing"], "kwargs": {}}
    ours = CheckpointSerializer()
    for _ in range(2):  # also when the failure is remembered
        with pytest.raises(ValueError, match="Cannot import Thing from no_such_pkg"):
            ours._constructor_class(envelope)
    with pytest.raises(ValueError, match="Invalid constructor format"):
        ours._constructor_class({"lc": 1, "type": "constructor", "id": "not-a-list"})


def test_the_memo_is_bounded() -> None:
    ours = CheckpointSerializer()
    for n in range(CONSTRUCTOR_CACHE_MAX + 50):
        with pytest.raises(ValueError):
            ours._constructor_class({"id": [f"pkg{n}", "Thing"]})
    assert len(ours._constructors) == CONSTRUCTOR_CACHE_MAX
