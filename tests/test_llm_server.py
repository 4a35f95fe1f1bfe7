"""Tests for the scripted OpenAI-compatible stand-in server.

Why: every other test and the benchmarks trust this server to speak the real wire format,
so it is checked here against the real ``langchain_openai``/``openai`` clients and httpx.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_openai import ChatOpenAI

from tests.support.llm_server import ScriptedLLMServer, TextResponse, split_at, split_text
from tests.support.sample_tools import add, get_weather


@pytest.fixture(scope="module")
def module_server() -> Iterator[ScriptedLLMServer]:
    """A private server for this module (not the conftest's session one), so these
    tests also cover start/stop; one per module keeps uvicorn start-up off each test."""
    with ScriptedLLMServer() as server:
        yield server


@pytest.fixture
def server(module_server: ScriptedLLMServer) -> ScriptedLLMServer:
    """The module's server, reset so each test sees only its own requests and script."""
    module_server.clear()
    return module_server


def _chat(server: ScriptedLLMServer, streaming: bool = True) -> ChatOpenAI:
    """A real langchain client pointed at the stand-in."""
    return ChatOpenAI(
        model="test-model",
        base_url=server.base_url,
        api_key="test",  # type: ignore[arg-type]
        streaming=streaming,
        stream_usage=True,
        max_retries=0,
    )


def test_split_text_keeps_every_character() -> None:
    text = "  Hello,  streaming\nworld!  "
    assert "".join(split_text(text)) == text
    assert len(split_text(text)) > 1
    assert "".join(split_text(text, 4)) == text
    assert len(split_text(text, 4)) == 4
    assert split_text("") == []
    with pytest.raises(ValueError):
        split_text("x", 0)


@pytest.mark.asyncio
async def test_streams_text_through_langchain(server: ScriptedLLMServer) -> None:
    content = "The quick brown fox jumps over the lazy dog.\nSecond line, with  spaces."
    server.push_text(content)

    chunks: list[AIMessageChunk] = []
    async for chunk in _chat(server).astream("tell me a story"):
        chunks.append(chunk)

    text = "".join(str(c.content) for c in chunks)
    assert text == content
    assert sum(1 for c in chunks if c.content) > 1
    merged = chunks[0]
    for c in chunks[1:]:
        merged = merged + c
    assert merged.usage_metadata is not None
    assert merged.usage_metadata["output_tokens"] == len(content.split())
    assert merged.usage_metadata["input_tokens"] > 0
    assert merged.response_metadata.get("finish_reason") == "stop"

    request = server.requests[-1]
    assert request["stream"] is True
    assert request["stream_options"] == {"include_usage": True}
    assert request["model"] == "test-model"
    assert request["messages"][-1]["content"] == "tell me a story"
    assert server.offered_tool_names() == []
    assert server.completed_streams == 1
    assert server.pending == 0


@pytest.mark.asyncio
@pytest.mark.parametrize("streaming", [True, False])
async def test_tool_calls_through_langchain(server: ScriptedLLMServer, streaming: bool) -> None:
    server.push_tool_calls(
        [
            ("get_weather", {"city": "Paris", "unit": "celsius"}),
            ("add", {"a": 2, "b": 40}),
        ],
        content="Let me check.",
    )

    llm = _chat(server, streaming=streaming).bind_tools([get_weather, add])
    result = await llm.ainvoke("weather in Paris and 2+40?")

    assert isinstance(result, AIMessage)
    assert [c["name"] for c in result.tool_calls] == ["get_weather", "add"]
    assert result.tool_calls[0]["args"] == {"city": "Paris", "unit": "celsius"}
    assert result.tool_calls[1]["args"] == {"a": 2, "b": 40}
    assert all(c["id"] and str(c["id"]).startswith("call_") for c in result.tool_calls)
    assert result.content == "Let me check."
    assert not result.invalid_tool_calls
    assert server.offered_tool_names() == ["get_weather", "add"]
    assert server.requests[-1].get("stream", False) is streaming


def test_default_responder_and_models(server: ScriptedLLMServer) -> None:
    body: dict[str, Any] = {
        "model": "m1",
        "messages": [{"role": "user", "content": "ping"}],
    }
    with httpx.Client(base_url=server.base_url) as client:
        first = client.post("/chat/completions", json=body).json()
        assert first["object"] == "chat.completion"
        assert first["model"] == "m1"
        assert first["choices"][0]["message"]["content"] == "OK"
        assert first["choices"][0]["finish_reason"] == "stop"
        assert first["usage"]["total_tokens"] >= 2

        server.set_default(lambda req: TextResponse(f"echo {req['messages'][-1]['content']}"))
        second = client.post("/chat/completions", json=body).json()
        assert second["choices"][0]["message"]["content"] == "echo ping"

        server.push_error(429, "slow down")
        assert client.post("/chat/completions", json=body).status_code == 429

        models = client.get("/models").json()
        assert models["object"] == "list"
        assert [m["id"] for m in models["data"]] == ["test-model"]
    assert len(server.requests) == 3


def test_stream_wire_format(server: ScriptedLLMServer) -> None:
    server.push_tool_calls([("add", {"a": 1, "b": 2})])
    body = {
        "model": "wire",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "one two three"}],
    }
    with httpx.Client(base_url=server.base_url) as client:
        lines = client.post("/chat/completions", json=body).text.split("\n\n")
    assert lines[-1] == "" and lines[-2] == "data: [DONE]"
    events = [json.loads(line.removeprefix("data: ")) for line in lines[:-2]]
    assert all(e["object"] == "chat.completion.chunk" and e["model"] == "wire" for e in events)
    assert len({e["id"] for e in events}) == 1
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    calls = [d for e in events if e["choices"] for d in e["choices"][0]["delta"].get("tool_calls", [])]
    assert calls[0]["id"] and calls[0]["type"] == "function" and calls[0]["function"]["name"] == "add"
    assert all("id" not in c and "name" not in c["function"] and c["index"] == 0 for c in calls[1:])
    assert len(calls) >= 3  # header + at least two argument pieces
    assert json.loads("".join(c["function"]["arguments"] for c in calls)) == {
        "a": 1,
        "b": 2,
    }
    assert events[-2]["choices"][0] == {
        "index": 0,
        "delta": {},
        "finish_reason": "tool_calls",
    }
    assert events[-1]["choices"] == []
    assert events[-1]["usage"]["prompt_tokens"] == 4


@pytest.mark.asyncio
async def test_abandoned_slow_stream_is_detected(server: ScriptedLLMServer) -> None:
    server.push_text(" ".join(f"w{i}" for i in range(50)), delay=0.05)  # 50 chunks, ~2.5 s
    body = {
        "model": "test-model",
        "stream": True,
        "messages": [{"role": "user", "content": "go"}],
    }

    started = time.monotonic()
    seen = 0
    async with (
        httpx.AsyncClient(base_url=server.base_url, timeout=5) as client,
        client.stream("POST", "/chat/completions", json=body) as response,
    ):
        async for line in response.aiter_lines():
            seen += line.startswith("data: ")
            if seen >= 4:
                break  # leaving the block closes the half-read connection
    assert time.monotonic() - started < 1.5

    assert await asyncio.to_thread(server.wait_for_streams, disconnected=1, timeout=3)
    assert server.disconnected_streams == 1
    assert server.completed_streams == 0


def _deltas(server: ScriptedLLMServer, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The `delta` of every streamed chunk that has a choice, in order."""
    with httpx.Client(base_url=server.base_url) as client:
        lines = client.post("/chat/completions", json={**body, "stream": True}).text.split("\n\n")
    events = [json.loads(line.removeprefix("data: ")) for line in lines[:-2]]
    return [e["choices"][0]["delta"] for e in events if e["choices"]]


def test_reasoning_streams_before_the_content(server: ScriptedLLMServer) -> None:
    """vLLM's and DeepSeek's shape: reasoning_content deltas first, then content deltas."""
    body = {"model": "r1", "messages": [{"role": "user", "content": "2+2?"}]}
    server.push_reasoning("The user adds two and two.", "It is 4.", chunks=3)
    deltas = _deltas(server, body)[1:-1]  # without the role head and the finish chunk
    kinds = ["reasoning_content" if "reasoning_content" in d else "content" for d in deltas]
    assert kinds == ["reasoning_content"] * 3 + ["content"] * 3
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "The user adds two and two."
    assert "".join(d.get("content", "") for d in deltas) == "It is 4."
    # not streamed: the message carries both fields
    server.push_reasoning("Thinking hard.", "Done.")
    with httpx.Client(base_url=server.base_url) as client:
        message = client.post("/chat/completions", json=body).json()["choices"][0]["message"]
    assert message["reasoning_content"] == "Thinking hard." and message["content"] == "Done."
    with pytest.raises(ValueError):
        server.push_reasoning("", "no reasoning")


def test_text_split_inside_a_think_tag(server: ScriptedLLMServer) -> None:
    text = "<think>plan the answer</think>The answer."
    server.push_text(text, split_at=[3, 24, 29])
    pieces = [d["content"] for d in _deltas(server, {"model": "q", "messages": []})[1:-1]]
    assert pieces == ["<th", "ink>plan the answer</", "think", ">The answer."]
    assert split_at("abc", []) == ["abc"]
    for bad in ([0], [3], [2, 1], [1, 1]):
        with pytest.raises(ValueError):
            server.push_text("abc", split_at=bad)


def test_image_parts_of_a_request(server: ScriptedLLMServer) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    messages = [
        {"role": "system", "content": [{"type": "image_url", "image_url": {"url": "not-a-user's"}}]},
        {"role": "user", "content": "plain text"},
        {"role": "user", "content": [{"type": "text", "text": "what is this?"}, image]},
    ]
    with httpx.Client(base_url=server.base_url) as client:
        client.post("/chat/completions", json={"model": "v", "messages": messages})
        client.post("/chat/completions", json={"model": "v", "messages": messages[:2]})
    assert server.image_parts(0) == [image]
    assert server.image_parts() == []
