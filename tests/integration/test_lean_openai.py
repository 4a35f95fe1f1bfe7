"""``make_chat_model``'s transform-free ``chat.completions`` against the real SDK path.

Why: ``vagent_graph.models.lean_openai`` replaces the one call every LLM request goes through,
so each test runs real langchain-openai + openai over HTTP against the scripted server,
once through the wrapper and, where it matters, once through the unmodified SDK path,
and compares what the server received and what the caller got back.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_openai import ChatOpenAI
from openai.resources.chat.completions import completions as sdk_completions
from pydantic import SecretStr

from tests.support.llm_server import ScriptedLLMServer
from tests.support.sample_tools import add, get_weather
from vagent_graph.agents.descriptor import AgentDescriptor
from vagent_graph.models.lean_openai import PlainChatCompletions
from vagent_graph.models.llm import make_chat_model
from vagent_graph.turn.events import error_event_for
from vagent_shared.settings import GraphSettings

AGENT = AgentDescriptor(id="t", name="T", system_prompt="be brief", temperature=0.2)


def _fast(server: ScriptedLLMServer) -> ChatOpenAI:
    """The production model, exactly as ``make_chat_model`` builds it."""
    settings = GraphSettings(
        OPENAI_BASE_URL=server.base_url, OPENAI_API_KEY=SecretStr("test"), LLM_MODEL="test-model"
    )
    model = make_chat_model(settings, AGENT)
    assert isinstance(model, ChatOpenAI)
    assert isinstance(model.async_client, PlainChatCompletions)
    return model


def _sdk(server: ScriptedLLMServer) -> ChatOpenAI:
    """Same configuration, with langchain-openai's own ``async_client`` put back."""
    model = _fast(server)
    model.async_client = model.root_async_client.chat.completions
    return model


def _history(turns: int = 1) -> list[BaseMessage]:
    """System prompt, then ``turns`` x (question, tool call, tool result, answer), then a question."""
    messages: list[BaseMessage] = [SystemMessage("You are terse.")]
    for i in range(turns):
        call_id = f"call_{i:04d}"
        messages += [
            HumanMessage(f"question {i}: weather in Paris and {i}+40?"),
            AIMessage(
                content="Let me check.",
                tool_calls=[
                    {"name": "get_weather", "args": {"city": "Paris"}, "id": call_id, "type": "tool_call"},
                    {"name": "add", "args": {"a": i, "b": 40}, "id": call_id + "b", "type": "tool_call"},
                ],
            ),
            ToolMessage("sunny in Paris", tool_call_id=call_id),
            ToolMessage(str(i + 40), tool_call_id=call_id + "b"),
            AIMessage(f"Sunny; {i}+40 is {i + 40}. ünïcødé ✓"),
        ]
    messages.append(HumanMessage([{"type": "text", "text": "and tomorrow?"}]))
    return messages


async def _stream(model: BaseChatModel, messages: list[BaseMessage]) -> AIMessageChunk:
    """Stream an answer and merge the chunks the way callers see them."""
    merged: AIMessageChunk | None = None
    async for chunk in model.astream(messages):
        assert isinstance(chunk, AIMessageChunk)
        merged = chunk if merged is None else merged + chunk
    assert merged is not None
    return merged


async def test_streamed_text_and_usage(llm_server: ScriptedLLMServer) -> None:
    content = "The quick brown fox jumps over the lazy dog.\nSecond line, with  spaces."
    llm_server.push_text(content)
    fast = await _stream(_fast(llm_server), [HumanMessage("tell me a story")])
    llm_server.push_text(content)
    slow = await _stream(_sdk(llm_server), [HumanMessage("tell me a story")])

    assert fast.content == slow.content == content
    assert fast.usage_metadata is not None
    assert fast.usage_metadata == slow.usage_metadata
    assert fast.usage_metadata["output_tokens"] == len(content.split())
    assert fast.response_metadata["finish_reason"] == "stop"
    assert fast.response_metadata["model_name"] == "test-model"
    assert llm_server.requests[0] == llm_server.requests[1]
    assert llm_server.completed_streams == 2


async def test_tool_call_deltas_become_tool_calls(llm_server: ScriptedLLMServer) -> None:
    llm_server.push_tool_calls(
        [("get_weather", {"city": "Paris", "unit": "celsius"}), ("add", {"a": 2, "b": 40})],
        content="Let me check.",
    )
    result = await _fast(llm_server).bind_tools([get_weather, add]).ainvoke("weather in Paris and 2+40?")

    assert isinstance(result, AIMessage)
    assert [(c["name"], c["args"]) for c in result.tool_calls] == [
        ("get_weather", {"city": "Paris", "unit": "celsius"}),
        ("add", {"a": 2, "b": 40}),
    ]
    assert all(str(c["id"]).startswith("call_") for c in result.tool_calls)
    assert not result.invalid_tool_calls
    assert result.content == "Let me check."
    assert llm_server.offered_tool_names() == ["get_weather", "add"]


@pytest.mark.parametrize("turns", [1, 8])
async def test_request_body_equals_the_sdk_path(
    llm_server: ScriptedLLMServer, turns: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    transforms: list[object] = []
    real_transform = vars(sdk_completions)["async_maybe_transform"]

    async def counting_transform(data: object, expected_type: object) -> Any:
        transforms.append(expected_type)
        return await real_transform(data, expected_type)

    monkeypatch.setattr(sdk_completions, "async_maybe_transform", counting_transform)
    history = _history(turns)
    walks = []
    for build in (_sdk, _fast):
        await build(llm_server).bind_tools([get_weather, add], tool_choice="auto").ainvoke(history)
        walks.append(len(transforms))

    assert walks == [1, 1]  # the SDK path walked the body once, the wrapper never
    via_sdk, via_wrapper = llm_server.requests
    assert via_wrapper == via_sdk
    assert len(via_sdk["messages"]) == len(history)
    assert [m["role"] for m in via_sdk["messages"][:6]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
    ]
    assert via_sdk["messages"][2]["tool_calls"][1]["function"]["name"] == "add"
    assert via_sdk["stream"] is True and via_sdk["stream_options"] == {"include_usage": True}
    assert via_sdk["temperature"] == 0.2 and via_sdk["tool_choice"] == "auto"
    assert [t["function"]["name"] for t in via_sdk["tools"]] == ["get_weather", "add"]


@pytest.fixture
async def recorded() -> AsyncIterator[tuple[Any, list[Any]]]:
    """An httpx client of the kind the SDK uses that records each outgoing request."""
    seen: list[Any] = []

    async def record(request: Any) -> None:
        seen.append(request)

    client = openai.DefaultAsyncHttpxClient(event_hooks={"request": [record]})
    try:
        yield client, seen
    finally:
        await client.aclose()


async def test_extras_reach_the_server_like_the_sdk_path(
    llm_server: ScriptedLLMServer, recorded: tuple[Any, list[Any]]
) -> None:
    http_client, seen = recorded
    model = ChatOpenAI(
        model="test-model",
        base_url=llm_server.base_url,
        api_key=SecretStr("secret-key"),
        http_async_client=http_client,
        default_headers={"X-Client": "vagent"},
        extra_body={"top_k": 5, "temperature": 0.7},  # extra_body wins over the typed value
        model_kwargs={"extra_headers": {"X-Per-Call": "yes"}, "extra_query": {"q": "1"}},
        temperature=0.1,
        streaming=True,
        stream_usage=True,
        max_retries=0,
    )
    await model.ainvoke("hi")
    model.async_client = PlainChatCompletions(model.root_async_client)
    await model.ainvoke("hi")

    via_sdk, via_wrapper = llm_server.requests
    assert via_wrapper == via_sdk
    assert via_sdk["top_k"] == 5 and via_sdk["temperature"] == 0.7
    assert "extra_headers" not in via_sdk and "extra_query" not in via_sdk

    def wire(request: Any) -> tuple[str, str, dict[str, str]]:
        headers = {k.lower(): v for k, v in request.headers.items()}
        return request.method, str(request.url), headers

    (sdk_method, sdk_url, sdk_headers), (method, url, headers) = map(wire, seen)
    assert (method, url, headers) == (sdk_method, sdk_url, sdk_headers)
    assert url == f"{llm_server.base_url}/chat/completions?q=1"
    assert headers["authorization"] == "Bearer secret-key"
    assert headers["x-client"] == "vagent" and headers["x-per-call"] == "yes"
    assert headers["content-type"] == "application/json"


async def test_direct_create_mirrors_the_sdk(llm_server: ScriptedLLMServer) -> None:
    """Non-streaming create, sentinels, unknown keywords and a pydantic response_format."""
    client = openai.AsyncOpenAI(base_url=llm_server.base_url, api_key="k", max_retries=0)
    plain = PlainChatCompletions(client)
    kwargs: dict[str, Any] = {
        "model": "test-model",
        "messages": iter([{"role": "user", "content": "ping"}]),  # one-shot iterable
        "temperature": openai.omit,
        "user": openai.NOT_GIVEN,
        "stream": False,
    }
    completion = await plain.create(**kwargs)
    assert isinstance(completion, openai.types.chat.ChatCompletion)
    assert completion.choices[0].message.content == "OK"
    assert completion.usage is not None and completion.usage.total_tokens >= 2
    assert llm_server.requests[-1] == {
        "model": "test-model",
        "messages": [{"role": "user", "content": "ping"}],
        "stream": False,
    }

    sdk_create: Any = client.chat.completions.create  # untyped: the call is wrong on purpose
    with pytest.raises(TypeError) as from_sdk:
        await sdk_create(model="m", messages=[], bogus=1)
    with pytest.raises(TypeError) as from_plain:
        await plain.create(model="m", messages=[], bogus=1)
    assert str(from_plain.value) == str(from_sdk.value)
    with pytest.raises(TypeError, match="messages"):
        await plain.create(model="m")
    with pytest.raises(TypeError, match="parse"):
        await plain.create(model="m", messages=[], response_format=AgentDescriptor)
    assert len(llm_server.requests) == 1  # none of the rejected calls was sent
    await client.close()


async def test_per_call_timeout_is_applied(llm_server: ScriptedLLMServer) -> None:
    llm_server.push_text("slow answer arriving word by word", delay=1.0)
    client = openai.AsyncOpenAI(base_url=llm_server.base_url, api_key="k", max_retries=0)
    plain = PlainChatCompletions(client)
    with pytest.raises(openai.APITimeoutError):
        stream = await plain.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True, timeout=0.2
        )
        assert isinstance(stream, openai.AsyncStream)
        async for _ in stream:
            pass
    await client.close()


async def test_delegated_paths_still_work(llm_server: ScriptedLLMServer) -> None:
    """Non-streaming ainvoke and include_response_headers use ``with_raw_response``."""
    model = _fast(llm_server)
    model.streaming = False
    llm_server.push_text("plain answer")
    assert (await model.ainvoke("hi")).content == "plain answer"
    assert llm_server.requests[-1].get("stream") is not True

    model.streaming = True
    model.include_response_headers = True
    llm_server.push_text("with headers")
    merged = await _stream(model, [HumanMessage("hi")])
    assert merged.content == "with headers"
    assert "content-type" in {k.lower() for k in merged.response_metadata["headers"]}


async def test_retries_stay_with_the_sdk(llm_server: ScriptedLLMServer) -> None:
    llm_server.push_error(500, "flaky")
    llm_server.push_text("recovered")
    assert (await _fast(llm_server).ainvoke("hi")).content == "recovered"  # LLM_MAX_RETRIES=2
    assert len(llm_server.requests) == 2


@pytest.mark.parametrize(
    ("status", "sdk_error", "code"),
    [(429, openai.RateLimitError, "llm_rate_limited"), (500, openai.InternalServerError, "llm_unavailable")],
)
async def test_http_errors_keep_their_types(
    llm_server: ScriptedLLMServer, status: int, sdk_error: type[openai.APIStatusError], code: str
) -> None:
    chains: list[list[type[BaseException]]] = []
    for build in (_sdk, _fast):
        model = build(llm_server)
        model.max_retries = 0
        model.root_async_client = model.root_async_client.with_options(max_retries=0)
        if isinstance(model.async_client, PlainChatCompletions):
            model.async_client = PlainChatCompletions(model.root_async_client)
        else:
            model.async_client = model.root_async_client.chat.completions
        llm_server.push_error(status, "scripted")
        with pytest.raises(openai.APIStatusError) as caught:
            await model.ainvoke("hi")
        chain: list[type[BaseException]] = []
        exc: BaseException | None = caught.value
        while exc is not None:
            chain.append(type(exc))
            exc = exc.__cause__
        assert sdk_error in chain
        assert error_event_for(caught.value).error_code == code
        chains.append(chain)
    assert chains[0] == chains[1]
    assert len(llm_server.requests) == 2
