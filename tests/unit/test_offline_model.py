"""The offline model: says it is offline, routes obvious requests to OFFERED tools only."""

from __future__ import annotations

from langchain_core.messages import HumanMessage, ToolMessage

from vagent_graph.offline_model import OfflineChatModel, plan_reply
from vagent_graph.tools import default_registry

REG = default_registry()


def offered(*names: str) -> list[dict[str, object]]:
    return [t.openai_schema() for t in REG if t.name in names]


def test_delete_request_becomes_a_delete_call() -> None:
    reply = plan_reply(
        [HumanMessage(content="Please delete records older than 2020")],
        offered("delete_records", "database_query"),
    )
    assert [(c["name"], c["args"]) for c in reply.tool_calls] == [
        ("delete_records", {"older_than": "2020-01-01"})
    ]


def test_count_request_becomes_a_query() -> None:
    reply = plan_reply(
        [HumanMessage(content="how many records are older than 2019-06-30?")], offered("database_query")
    )
    assert reply.tool_calls[0]["name"] == "database_query"
    assert "2019-06-30" in reply.tool_calls[0]["args"]["sql"]


def test_never_calls_a_tool_it_was_not_offered() -> None:
    reply = plan_reply([HumanMessage(content="delete records older than 2020")], offered("database_query"))
    assert not reply.tool_calls
    assert "offline" in str(reply.content) and "access" in str(reply.content)


def test_otherwise_says_it_is_offline_and_what_it_can_do() -> None:
    text = str(plan_reply([HumanMessage(content="hello")], offered("database_query")).content)
    assert "without a language model" in text
    assert "count or list records" in text and "delete" not in text


def test_tool_results_are_summarised() -> None:
    reply = plan_reply([ToolMessage(content="Deleted 5 records.", tool_call_id="x")], [])
    assert "Deleted 5 records." in str(reply.content)


async def test_streams_word_by_word_with_usage() -> None:
    model = OfflineChatModel()
    chunks = [c async for c in model.astream([HumanMessage(content="hi")])]
    text = "".join(str(c.content) for c in chunks)
    assert text.startswith("(offline model)") and len(chunks) > 5
    total = chunks[0]
    for c in chunks[1:]:
        total = total + c
    assert total.usage_metadata and total.usage_metadata["output_tokens"] > 0
