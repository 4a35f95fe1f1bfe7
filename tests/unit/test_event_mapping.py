"""LangGraph stream items -> the SSE contract."""

from __future__ import annotations

from langchain_core.messages import AIMessage, AIMessageChunk, ToolMessage
from langgraph.types import Interrupt

from vagent_graph.turn.events import EventMapper, error_event_for
from vagent_shared.events import HitlRequest, Progress, TextChunk, TextFinal


def test_agent_tokens_become_numbered_chunks_and_tool_output_is_not_streamed() -> None:
    m = EventMapper()
    agent = {"langgraph_node": "agent"}
    assert m.map("messages", (AIMessageChunk(content="Hel"), agent)) == [
        TextChunk(content="Hel", chunk_index=0)
    ]
    assert m.map("messages", (AIMessageChunk(content=""), agent)) == []
    assert (
        m.map("messages", (ToolMessage(content="secret rows", tool_call_id="x"), {"langgraph_node": "tools"}))
        == []
    )
    assert m.map("messages", (AIMessageChunk(content="lo"), agent)) == [
        TextChunk(content="lo", chunk_index=1)
    ]
    assert m.map("custom", {"type": "progress", "content": "Running x…"}) == [Progress(content="Running x…")]


def test_final_text_comes_from_the_last_answer() -> None:
    m = EventMapper()
    m.map(
        "updates",
        {"agent": {"messages": [AIMessage(content="", tool_calls=[{"name": "t", "args": {}, "id": "1"}])]}},
    )
    assert m.map("updates", {"agent": {"messages": [AIMessage(content="All done.")]}}) == [
        TextFinal(content="All done.", is_final=True)
    ]
    assert m.closing() == []  # sent as soon as the answer was complete, never twice


def test_a_run_without_an_answer_still_ends_with_a_final_text() -> None:
    m = EventMapper()
    m.map(
        "updates",
        {"agent": {"messages": [AIMessage(content="", tool_calls=[{"name": "t", "args": {}, "id": "1"}])]}},
    )
    m.map("updates", {"tools": {"messages": [ToolMessage(content="Cancelled", tool_call_id="1")]}})
    assert m.closing() == [TextFinal(content="", is_final=True)]


def test_interrupt_becomes_a_hitl_request_instead_of_final_text() -> None:
    m = EventMapper()
    m.map(
        "updates",
        {
            "__interrupt__": (
                Interrupt(
                    value={
                        "question": "Delete 3 records?",
                        "options": ["yes", "no"],
                        "timeout_seconds": 60,
                        "kind": "confirm",
                    },
                    id="int-1",
                ),
            )
        },
    )
    assert m.closing() == [
        HitlRequest(
            question="Delete 3 records?", options=["yes", "no"], timeout_seconds=60, interrupt_id="int-1"
        )
    ]


def test_errors_are_short_and_reveal_nothing() -> None:
    ev = error_event_for(RuntimeError("connection to redis://:hunter2@db failed at 0x7f"))
    assert ev.error_code == "internal_error"
    assert "hunter2" not in ev.message and "0x7f" not in ev.message
    assert error_event_for(TimeoutError()).error_code == "timeout"
