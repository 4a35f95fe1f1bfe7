"""models/lean_stream.py: a streamed answer read as deltas and merged once must end as the very
message LangChain's per-chunk path builds from the same chunks (content, tool calls, invalid
tool calls, usage, metadata), and the listener must see every piece of text, in order, once.

No network: the model's ``async_client`` is a stand-in that yields the chunk dicts (as
lean_openai's SDK path does); everything above it (langchain-core's ``ainvoke`` with
``stream=True``, langchain-openai's payload and chunk conversion) is the real code.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.outputs import ChatGenerationChunk

from vagent_graph.models.lean_openai import _ChunkDict
from vagent_graph.models.lean_stream import LeanStreamChatOpenAI, StreamMerger
from vagent_graph.models.listener import listening
from vagent_graph.models.reasoning import without_reasoning
from vagent_graph.workflow.answer_stream import AnswerStream

BASE = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m-1"}


def text(piece: str, **extra: Any) -> dict[str, Any]:
    return {**BASE, "choices": [{"index": 0, "delta": {"content": piece, **extra}, "finish_reason": None}]}


def call(
    index: int | None, *, id: str | None = None, name: str | None = None, args: str | None = None
) -> dict[str, Any]:
    raw: dict[str, Any] = {"function": {}}
    if index is not None:
        raw["index"] = index
    if id is not None:
        raw |= {"id": id, "type": "function"}
    if name is not None:
        raw["function"]["name"] = name
    if args is not None:
        raw["function"]["arguments"] = args
    return {**BASE, "choices": [{"index": 0, "delta": {"tool_calls": [raw]}, "finish_reason": None}]}


ROLE = {
    **BASE,
    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
}


def end(reason: str = "stop") -> dict[str, Any]:
    return {
        **BASE,
        "system_fingerprint": "fp_1",
        "choices": [{"index": 0, "delta": {}, "finish_reason": reason}],
    }


USAGE = {**BASE, "choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}}

STREAMS: dict[str, list[dict[str, Any]]] = {
    "text": [ROLE, text("Hel"), text("lo, wör"), text("ld ✓\n"), text("bye."), end(), USAGE],
    "think block across chunks": [ROLE, text("<thi"), text("nk>hmm</th"), text("ink>\n\nYes."), end(), USAGE],
    "reasoning deltas": [
        ROLE,
        {**BASE, "choices": [{"index": 0, "delta": {"reasoning_content": "let me see"}}]},
        {**BASE, "choices": [{"index": 0, "delta": {"reasoning_content": " more"}}]},
        text("42"),
        end(),
        USAGE,
    ],
    "text then two tool calls": [
        ROLE,
        text("Let me "),
        text("check."),
        call(0, id="call_a", name="get_weather", args=""),
        call(0, args='{"city": '),
        call(0, args='"Paris"}'),
        call(1, id="call_b", name="add", args='{"a": 2,'),
        call(1, args=' "b": 40}'),
        end("tool_calls"),
        USAGE,
    ],
    "tool call without arguments": [
        ROLE,
        call(0, id="call_x", name="now", args=""),
        end("tool_calls"),
        USAGE,
    ],
    "truncated arguments": [ROLE, call(0, id="call_t", name="add", args='{"a": 2, "b'), end("length"), USAGE],
    "no usage, no role, empty and missing deltas": [
        text("a"),
        {**BASE, "choices": [{"index": 0}]},
        {**BASE, "choices": [{"index": 0, "delta": {}}]},
        text("b"),
        end(),
    ],
    "tool call without index": [ROLE, call(None, id="call_n", name="now", args="{}"), end("tool_calls")],
    "usage only": [USAGE],
}


class _Stream:
    def __init__(self, chunks: list[dict[str, Any]], delay: float) -> None:
        self._chunks = copy.deepcopy(chunks)
        self._delay = delay
        self.closed = False

    async def __aenter__(self) -> _Stream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.closed = True

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        for chunk in self._chunks:
            if self._delay:
                await asyncio.sleep(self._delay)
            yield _ChunkDict.build(response=None, data=chunk)  # as the SDK's stream gives them


class _Completions:
    """Stands in for lean_openai's PlainChatCompletions: `create` gives the chunks as dicts."""

    def __init__(self, chunks: list[dict[str, Any]], delay: float = 0.0) -> None:
        self.chunks, self.delay = chunks, delay
        self.payloads: list[dict[str, Any]] = []
        self.streams: list[_Stream] = []

    async def create(self, **payload: Any) -> _Stream:
        self.payloads.append(payload)
        self.streams.append(_Stream(self.chunks, self.delay))
        return self.streams[-1]


class _Listener:
    """A listener that records what it is told (the reads are not paced: nothing is shown)."""

    window = 0.0
    shown = False
    due = 0.0

    def __init__(self) -> None:
        self.deltas: list[tuple[str, bool, bool]] = []
        self.told_chunks: list[ChatGenerationChunk] = []
        self.two = asyncio.Event()  # two deltas came

    def delta(self, text: str, *, tool_call: bool, reasoning: bool) -> None:
        self.deltas.append((text, tool_call, reasoning))
        if len(self.deltas) >= 2:
            self.two.set()

    def told(self, chunk: ChatGenerationChunk) -> None:
        self.told_chunks.append(chunk)


def model(chunks: list[dict[str, Any]], delay: float = 0.0) -> tuple[LeanStreamChatOpenAI, _Completions]:
    llm = LeanStreamChatOpenAI(model="m", api_key="k", base_url="http://127.0.0.1:9/v1", stream_usage=True)  # type: ignore[arg-type]
    client = _Completions(chunks, delay)
    llm.async_client = client
    return llm, client


def comparable(ai: AIMessage) -> dict[str, Any]:
    ai = without_reasoning(ai)
    assert ai.id is not None and ai.id.startswith("lc_run-")  # LangChain's run id, as per chunk
    return {
        "content": ai.content,
        "tool_calls": ai.tool_calls,
        "invalid_tool_calls": ai.invalid_tool_calls,
        "usage": ai.usage_metadata,
        "metadata": ai.response_metadata,
        "kwargs": ai.additional_kwargs,
    }


@pytest.mark.parametrize("name", list(STREAMS))
async def test_the_merged_answer_is_the_message_langchain_builds_per_chunk(name: str) -> None:
    chunks = STREAMS[name]
    per_chunk, per_chunk_client = model(chunks)
    expected = await per_chunk.ainvoke([HumanMessage("hi")], stream=True)

    lean, lean_client = model(chunks)
    listener = _Listener()
    with listening(listener):
        got = await lean.ainvoke([HumanMessage("hi")], stream=True)

    assert isinstance(expected, AIMessage) and isinstance(got, AIMessage)
    assert comparable(got) == comparable(expected)
    assert lean_client.payloads == per_chunk_client.payloads  # the same request
    assert lean_client.payloads[0]["stream_options"] == {"include_usage": True}
    assert lean_client.streams[0].closed
    # every chunk reached the listener once, in order, and the whole answer was never told again
    assert len(listener.deltas) == len(chunks)
    assert "".join(t for t, _, _ in listener.deltas) == "".join(
        c["choices"][0].get("delta", {}).get("content") or "" for c in chunks if c["choices"]
    )
    assert len(listener.told_chunks) == 1


async def test_the_listener_is_told_which_chunks_carry_tool_calls_and_reasoning() -> None:
    listener = _Listener()
    lean, _ = model(STREAMS["text then two tool calls"])
    with listening(listener):
        await lean.ainvoke([HumanMessage("hi")], stream=True)
    assert [i for i, (_, tool_call, _) in enumerate(listener.deltas) if tool_call] == [3, 4, 5, 6, 7]

    listener = _Listener()
    lean, _ = model(STREAMS["reasoning deltas"])
    with listening(listener):
        await lean.ainvoke([HumanMessage("hi")], stream=True)
    assert [i for i, (_, _, reasoning) in enumerate(listener.deltas) if reasoning] == [1, 2]


async def test_without_a_listener_langchains_own_path_streams_per_chunk() -> None:
    lean, client = model(STREAMS["text"])
    pieces = [c.content async for c in lean.astream([HumanMessage("hi")])]
    assert "".join(str(p) for p in pieces) == "Hello, wörld ✓\nbye."
    assert len(pieces) >= 4  # one chunk per model chunk, not one merged answer
    assert client.payloads


async def test_answer_stream_sends_the_text_once_with_the_think_block_cut() -> None:
    sent: list[dict[str, Any]] = []
    stream = AnswerStream(sent.append, 0.05)
    lean, _ = model(STREAMS["think block across chunks"], delay=0.01)
    with listening(stream):
        ai = await lean.ainvoke([HumanMessage("hi")], stream=True, config={"callbacks": [stream]})
    stream.close()
    texts = [s["content"] for s in sent if s["type"] == "text"]
    assert "".join(texts) == "Yes." == without_reasoning(ai).content  # said once: not again at the end
    assert sent[0] == {"type": "thinking"}
    assert stream.first_chunk is not None


async def test_cancelling_mid_answer_closes_the_stream() -> None:
    lean, client = model(STREAMS["text"], delay=0.05)
    listener = _Listener()

    async def call() -> None:
        with listening(listener):
            await lean.ainvoke([HumanMessage("hi")], stream=True)

    task = asyncio.create_task(call())
    await asyncio.wait_for(listener.two.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert client.streams[0].closed
    assert len(listener.deltas) < len(STREAMS["text"])


def test_merger_keeps_the_first_id_and_the_last_model_and_usage() -> None:
    merger = StreamMerger()
    merger.feed({**text("a"), "id": "first"})
    merger.feed({**text("b"), "id": "second", "model": "m-2"})
    merger.feed(USAGE)
    merged = merger.merged()
    assert merged["id"] == "first"
    assert merged["model"] == "m-1"  # USAGE names m-1 again, last
    assert merged["usage"] == USAGE["usage"]
    assert merged["choices"][0]["delta"]["content"] == "ab"
