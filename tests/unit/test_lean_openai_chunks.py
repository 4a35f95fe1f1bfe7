"""Streamed chunks reach langchain-openai as plain dicts (lean_openai._ChunkDict): what it
builds from them must equal what it builds from the SDK's model_dump() of the same chunk,
including chunks from servers that leave keys out."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from langchain_core.messages import AIMessageChunk
from langchain_openai import ChatOpenAI
from openai._models import construct_type
from openai.types.chat import ChatCompletionChunk

from vagent_graph.models.lean_openai import _ChunkDict

BASE = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
CHUNKS: list[dict[str, Any]] = [
    {**BASE, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
    {**BASE, "choices": [{"index": 0, "delta": {"content": "Hel"}}]},
    {**BASE, "choices": [{"index": 0}]},  # no delta at all
    {
        **BASE,
        "choices": [
            {
                "index": 0,
                "delta": {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "f", "arguments": ""},
                        },
                        {"id": "call_2", "function": {"name": "g", "arguments": "{}"}},  # no index
                    ]
                },
            }
        ],
    },
    {**BASE, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    {**BASE, "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}},
]


def sdk_dict(raw: dict[str, Any]) -> dict[str, Any]:
    chunk = construct_type(type_=ChatCompletionChunk, value=copy.deepcopy(raw))
    assert isinstance(chunk, ChatCompletionChunk)
    return chunk.model_dump()


@pytest.mark.parametrize("raw", CHUNKS)
def test_langchain_builds_the_same_chunk_as_from_the_sdk_model(raw: dict[str, Any]) -> None:
    llm = ChatOpenAI(model="m", api_key="k", base_url="http://127.0.0.1:9/v1")  # type: ignore[arg-type]
    ours = llm._convert_chunk_to_generation_chunk(
        _ChunkDict.build(response=None, data=copy.deepcopy(raw)), AIMessageChunk, {}
    )
    theirs = llm._convert_chunk_to_generation_chunk(sdk_dict(raw), AIMessageChunk, {})
    if theirs is None:
        assert ours is None
        return
    assert ours is not None
    assert ours.message == theirs.message
    assert ours.generation_info == theirs.generation_info


def test_keys_langchain_indexes_directly_are_filled_in() -> None:
    data = _ChunkDict.build(response=None, data=copy.deepcopy(CHUNKS[2]))
    assert data["choices"][0]["delta"] is None
    calls = _ChunkDict.build(response=None, data=copy.deepcopy(CHUNKS[3]))["choices"][0]["delta"][
        "tool_calls"
    ]
    assert calls[1]["index"] is None and calls[1]["function"] == {"name": "g", "arguments": "{}"}
