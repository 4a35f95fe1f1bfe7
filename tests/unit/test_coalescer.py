"""outbox.Coalescer: a model call's text pieces -> what to send and when (pure, a given clock);
event_stream.AnswerStream: the chunks a model call streams -> custom stream items."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import pytest
from langchain_core.messages import AIMessageChunk
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.outputs import ChatGenerationChunk

from vagent_graph.models.reasoning import REASONING_MARK, THINKING_STATUS
from vagent_graph.turn.events import EventMapper
from vagent_graph.workflow.answer_stream import SLACK, AnswerStream, Coalescer
from vagent_shared.events import Progress, TextChunk


def run(coalescer: Coalescer, timed: list[tuple[float, str]], end: float) -> list[str]:
    """What is sent for pieces arriving at the given times, then the end of the call."""
    sent = [s for at, piece in timed if (s := coalescer.feed(piece, at))]
    last = coalescer.flush(end, last=True)
    return [*sent, *([last] if last else [])]


def test_the_first_text_goes_at_once_then_one_piece_per_window() -> None:
    pieces = [(i * 0.005, f"w{i} ") for i in range(200)]  # 5 ms apart, ~1 s
    sent = run(Coalescer(0.04), pieces, 1.0)
    assert sent[0] == "w0 "  # not held
    assert "".join(sent) == "".join(p for _, p in pieces)
    assert 20 <= len(sent) <= 30  # ~ one per 40 ms


def test_a_window_of_zero_sends_every_piece() -> None:
    pieces = [(i * 0.001, f"w{i} ") for i in range(50)]
    assert run(Coalescer(0.0), pieces, 1.0) == [p for _, p in pieces]


def test_the_window_counts_from_the_last_send() -> None:
    c = Coalescer(0.04)
    assert c.feed("a", 0.0) == "a"
    assert c.due == 0.04
    assert c.feed("b", 0.01) == ""
    assert c.feed("c", 0.034) == ""
    assert c.feed("d", 0.04) == "bcd"  # the window is over: everything held, in order
    assert c.feed("e", 0.05) == ""
    assert c.flush(0.06) == "e"  # a tool call, the end: at once
    assert c.flush(0.07) == ""


def test_a_piece_a_few_ms_before_the_window_ends_goes_out_with_it() -> None:
    """A paced read or a timer woken a little early must not hold the text a whole window more
    (the person would see the answer grow half as often)."""
    c = Coalescer(0.1)
    assert c.feed("a", 0.0) == "a"
    assert c.feed("b", 0.1 - SLACK / 2) == "b"
    assert c.feed("c", 0.2 - 2 * SLACK) == ""  # clearly early: held
    assert c.flush(0.21) == "c"


def test_pieces_cut_inside_characters_are_joined_whole() -> None:
    text = "Cafe\u0301 👩\u200d💻 🇫🇷 👍🏽"
    cuts = [0, 4, 7, 8, 9, 11, 12, 14, 15, len(text)]
    pieces = [(0.001 * i, text[a:b]) for i, (a, b) in enumerate(itertools.pairwise(cuts))]
    sent = run(Coalescer(0.04), pieces, 0.1)
    assert sent == ["Cafe", text[4:]]  # the first at once; the rest joined, never re-split


@pytest.mark.parametrize("window", [0.0, 0.04])
def test_a_think_block_split_across_windows_is_never_sent(window: float) -> None:
    text = "Hello <think>secret plan</think>\n\nvisible answer <"
    pieces = [(0.015 * i, text[i * 3 : i * 3 + 3]) for i in range(len(text) // 3 + 1)]
    c = Coalescer(window)
    sent = run(c, pieces, 1.0)
    assert "".join(sent) == "Hello visible answer <"  # the held "<" was text after all
    assert not any("secret" in s or "think" in s for s in sent)


def test_thinking_before_any_text_is_noticed_and_the_first_visible_text_is_not_held() -> None:
    c = Coalescer(0.04)
    assert c.feed("<think>hmm", 0.0) == "" and c.thinking and not c.shown
    assert c.feed(" more", 0.001) == ""
    assert c.feed("</think>An", 0.002) == "An"  # the first visible text: at once
    assert c.feed("swer", 0.003) == ""


# ---- AnswerStream: the callback handler the model call streams through ----------------------


def gen(content: str = "", **kwargs: Any) -> ChatGenerationChunk:
    return ChatGenerationChunk(message=AIMessageChunk(content=content, id="run-1", **kwargs))


def written(window: float, chunks: list[ChatGenerationChunk]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    stream = AnswerStream(out.append, window)
    run_id = uuid.uuid4()
    for chunk in chunks:
        stream.on_llm_new_token(chunk.text, chunk=chunk, run_id=run_id)
    stream.close()
    return out


def test_text_before_a_tool_call_is_sent_before_it() -> None:
    call = tool_call_chunk(name="delete_records", args="{}", id="c1", index=0)
    items = written(10.0, [gen("Let "), gen("me "), gen("check."), gen(tool_call_chunks=[call])])
    assert items == [{"type": "text", "content": "Let "}, {"type": "text", "content": "me check."}]


def test_a_chunk_told_twice_is_sent_once() -> None:
    one = gen("Hi")
    assert written(0.0, [one, one]) == [{"type": "text", "content": "Hi"}]


def test_reasoning_deltas_say_thinking_once_and_the_mapper_shows_it_before_the_text() -> None:
    reasoning = gen(additional_kwargs={REASONING_MARK: True})
    items = written(0.04, [reasoning, reasoning, gen("Answer")])
    assert items == [{"type": "thinking"}, {"type": "text", "content": "Answer"}]
    mapper = EventMapper()
    events = [e for item in items for e in mapper.map("custom", item)]
    assert events == [Progress(content=THINKING_STATUS), TextChunk(content="Answer", chunk_index=0)]
    assert mapper.map("custom", {"type": "thinking"}) == []  # never after answer text


def test_the_mapper_numbers_coalesced_text_consecutively() -> None:
    mapper = EventMapper()
    items = [{"type": "text", "content": piece} for piece in ["a", "", "b", "c"]]
    out = [e for item in items for e in mapper.map("custom", item)]
    assert out == [TextChunk(content=p, chunk_index=i) for i, p in enumerate("abc")]
