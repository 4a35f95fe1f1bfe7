"""A reasoning model's thinking never reaches the room or the history (reasoning.py)."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, AIMessageChunk

from vagent_graph.models.reasoning import (
    REASONING_MARK,
    THINKING_STATUS,
    ThinkFilter,
    strip_reasoning,
    without_reasoning,
)
from vagent_graph.turn.events import EventMapper
from vagent_shared.events import Progress, TextChunk

ANSWER = "The answer is 42. A <b>bold</b> claim < 43."
STREAM = "<think>\nThe user wants the answer. <thinking> is not a tag here\n</think>\n\n" + ANSWER


def feed_all(pieces: list[str]) -> str:
    f = ThinkFilter()
    return "".join(f.feed(p) for p in pieces) + f.flush()


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_a_think_block_split_anywhere_never_shows(cuts: list[int]) -> None:
    points = [0, *sorted(set(cuts)), len(STREAM)]
    pieces = [STREAM[a:b] for a, b in itertools.pairwise(points)]
    assert feed_all(pieces) == ANSWER


def test_text_that_only_looks_like_a_tag_start_is_kept() -> None:
    assert feed_all(["x <", "b> and <th", "ese> <"]) == "x <b> and <these> <"


def test_an_unclosed_block_hides_everything_after_it() -> None:
    assert feed_all(["Hi <think>still thinking when cut off"]) == "Hi "
    assert strip_reasoning("<think>cut off") == ""


def test_the_final_text_loses_its_blocks_and_a_lone_closing_tag() -> None:
    assert strip_reasoning(STREAM) == ANSWER
    assert strip_reasoning("reasoning the template opened\n</think>\n\nAnswer.") == "Answer."
    assert strip_reasoning("Plain answer.") == "Plain answer."


def test_the_history_keeps_no_reasoning() -> None:
    ai = AIMessage(
        content=STREAM, additional_kwargs={REASONING_MARK: True, "reasoning_content": "secret chain"}
    )
    clean = without_reasoning(ai)
    assert clean.content == ANSWER
    assert clean.additional_kwargs == {}
    plain = AIMessage(content="ok")
    assert without_reasoning(plain) is plain


def test_the_stream_shows_thinking_once_then_only_the_answer() -> None:
    m = EventMapper()
    agent = {"langgraph_node": "agent"}
    out = []
    for piece in ["<thi", "nk>plan: call x", " then y</th", "ink>\n\nThe ", "answer."]:
        out += m.map("messages", (AIMessageChunk(content=piece, id="run-1"), agent))
    assert out == [
        Progress(content=THINKING_STATUS),
        TextChunk(content="The ", chunk_index=0),
        TextChunk(content="answer.", chunk_index=1),
    ]


def test_reasoning_deltas_show_thinking_and_nothing_of_their_text() -> None:
    m = EventMapper()
    agent = {"langgraph_node": "agent"}
    reasoning = AIMessageChunk(content="", id="run-1", additional_kwargs={REASONING_MARK: True})
    assert m.map("messages", (reasoning, agent)) == [Progress(content=THINKING_STATUS)]
    assert m.map("messages", (reasoning, agent)) == []
    assert m.map("messages", (AIMessageChunk(content="Hi", id="run-1"), agent)) == [
        TextChunk(content="Hi", chunk_index=0)
    ]


def test_each_model_call_gets_its_own_filter() -> None:
    m = EventMapper()
    agent = {"langgraph_node": "agent"}
    m.map("messages", (AIMessageChunk(content="<think>never closed", id="call-1"), agent))
    assert m.map("messages", (AIMessageChunk(content="Visible", id="call-2"), agent)) == [
        TextChunk(content="Visible", chunk_index=0)
    ]
