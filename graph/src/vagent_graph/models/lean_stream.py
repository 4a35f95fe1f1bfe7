"""A streamed answer read once, not one LangChain chunk per model chunk: the chunks go to the
call's listener as plain deltas and become one message at the end.

Why (measured, bench/README.md "The fourth lever"): per streamed model chunk, LangChain
builds an ``AIMessageChunk`` and a ``ChatGenerationChunk`` (pydantic models, tool-call chunk
parsing), runs the callback manager's ``on_llm_new_token`` for every handler and, at the
end, merges all the chunks one by one. The graph needs none of it per chunk: the only
per-chunk consumer of a streamed answer is its ``AnswerStream`` (workflow/answer_stream.py),
which coalesces the text per window anyway. In one process, a 120-chunk answer costs
~13 ms of CPU through LangChain's path and ~8 ms read here; in the service, 25% less CPU per
streamed turn.

What it does: when the model node streams the call to a listener (its ``AnswerStream``, set
with listener.py's ``listening``), ``_astream`` sends the request langchain-openai would send (its own
``_get_request_payload``, ``stream_options``, the same ``async_client``: lean_openai.py's
SDK path, its retries, timeouts, usage metering and error types), gives each chunk's delta to
the listener (text, "a tool call started", "reasoning"), merges the chunks as dicts
(``StreamMerger``, pure) and yields ONE chunk: the merged one, converted by langchain-openai's
own ``_convert_chunk_to_generation_chunk``. LangChain then finishes it as any stream
(``generate_from_stream``: tool calls parsed from the merged tool-call chunks, usage, ids,
response metadata), so the message in the checkpoint is the one the per-chunk path builds
(``tests/unit/test_lean_stream.py`` compares them). Calls without a listener, with
``response_format``, the Responses API, response headers or a gateway take langchain-openai's
own path.

On every upgrade of ``langchain-openai`` or ``langchain-core``: run
``tests/unit/test_lean_stream.py`` and ``tests/integration/test_lean_openai.py``; check that
``BaseChatOpenAI._astream`` still builds its payload as mirrored in ``_lean_payload`` and that
``_agenerate_with_cache`` still finishes a stream with ``generate_from_stream``. Then re-run
``bench/bench_capacity.py --baseline-ref <a commit without this module>``: below a 10% gain,
delete this module and its wiring in ``llm.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import openai
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun
from langchain_core.messages import AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGenerationChunk
from langchain_openai.chat_models.base import _handle_openai_api_error, _handle_openai_bad_request

from vagent_graph.models.listener import current_listener
from vagent_graph.models.reasoning import ThinkingChatOpenAI, delta_reasons

__all__ = ["LeanStreamChatOpenAI", "StreamMerger"]


@dataclass
class _Call:
    id: str | None = None
    type: str | None = None
    name: list[str] = field(default_factory=list)
    arguments: list[str] = field(default_factory=list)


@dataclass
class StreamMerger:
    """Chat-completion stream chunks (dicts) -> one chunk of the same shape holding the whole
    answer: content joined, tool calls joined per index (id and type: the first given; name
    and arguments: the pieces joined, as LangChain merges them), the finish reason, usage,
    model, system fingerprint and service tier (the last given). Only the first choice counts
    (langchain-openai reads only that one too)."""

    _top: dict[str, Any] = field(default_factory=dict)
    _content: list[str] = field(default_factory=list)
    _calls: dict[int, _Call] = field(default_factory=dict)
    _function_call: dict[str, list[str]] | None = None
    _role: str | None = None
    _finish: str | None = None
    _choices: bool = False
    _any_delta: bool = False

    def feed(self, chunk: dict[str, Any]) -> tuple[str, bool, bool]:
        """Take one chunk; its (text, tool call, reasoning) for the listener."""
        top = self._top
        for key in ("id", "model", "system_fingerprint", "service_tier", "usage", "created", "object"):
            value = chunk.get(key)
            if value is not None and (key != "id" or "id" not in top):
                top[key] = value
        choices = chunk.get("choices")
        if not choices or not isinstance(choices[0], dict):
            return "", False, False
        self._choices = True
        choice = choices[0]
        if reason := choice.get("finish_reason"):
            self._finish = reason
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return "", False, False
        self._any_delta = True
        if role := delta.get("role"):
            self._role = self._role or role
        text = delta.get("content") or ""
        if text:
            self._content.append(text)
        reasoning = delta_reasons(delta)
        if function_call := delta.get("function_call"):
            held = self._function_call = self._function_call or {"name": [], "arguments": []}
            for key in ("name", "arguments"):
                if piece := function_call.get(key):
                    held[key].append(piece)
        calls = delta.get("tool_calls")
        for raw in calls or ():
            self._add_call(raw)
        return text, bool(calls), reasoning

    def _add_call(self, raw: dict[str, Any]) -> None:
        index = raw.get("index")
        if not isinstance(index, int):
            index = len(self._calls)
        call = self._calls.setdefault(index, _Call())
        call.id = call.id or raw.get("id")
        call.type = call.type or raw.get("type")
        function = raw.get("function") or {}
        if piece := function.get("name"):
            call.name.append(piece)
        if piece := function.get("arguments"):
            call.arguments.append(piece)

    def merged(self) -> dict[str, Any]:
        """The one chunk holding everything fed."""
        chunk = dict(self._top)
        if not self._choices:
            chunk["choices"] = []
            return chunk
        delta: dict[str, Any] | None = None
        if self._any_delta:
            delta = {"role": self._role or "assistant", "content": "".join(self._content)}
            if self._function_call is not None:
                delta["function_call"] = {k: "".join(v) for k, v in self._function_call.items()}
            if self._calls:
                delta["tool_calls"] = [
                    {
                        "index": index,
                        "id": call.id,
                        "type": call.type or "function",
                        "function": {"name": "".join(call.name), "arguments": "".join(call.arguments)},
                    }
                    for index, call in sorted(self._calls.items())
                ]
        chunk["choices"] = [{"index": 0, "delta": delta, "finish_reason": self._finish}]
        return chunk


class LeanStreamChatOpenAI(ThinkingChatOpenAI):
    """ThinkingChatOpenAI whose streamed answers reach the call's listener as deltas and LangChain
    as one merged chunk (module docstring)."""

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        listener = current_listener()
        payload = self._lean_payload(messages, stop, kwargs) if listener is not None else None
        if listener is None or payload is None:
            async for chunk in super()._astream(messages, stop, run_manager, **kwargs):
                yield chunk
            return
        merger = StreamMerger()
        try:
            response = await self.async_client.create(**payload)
            async with response:
                async for raw in response:
                    data: dict[str, Any] = raw if isinstance(raw, dict) else raw.model_dump()
                    text, tool_call, reasoning = merger.feed(data)
                    listener.delta(text, tool_call=tool_call, reasoning=reasoning)
        except openai.BadRequestError as e:
            _handle_openai_bad_request(e)
        except openai.APIError as e:
            _handle_openai_api_error(e)
        generation = self._convert_chunk_to_generation_chunk(merger.merged(), AIMessageChunk, {})
        if generation is None:
            return
        listener.told(generation)
        yield generation

    def _lean_payload(
        self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]
    ) -> dict[str, Any] | None:
        """The request BaseChatOpenAI._astream sends; None where its path must be taken."""
        if self.include_response_headers or self._uses_gateway:
            return None
        kwargs = {**kwargs, "stream": True}
        stream_usage = self._should_stream_usage(kwargs.pop("stream_usage", None), **kwargs)
        if stream_usage:
            kwargs["stream_options"] = {"include_usage": stream_usage}
        payload = self._get_request_payload(messages, stop=stop, **kwargs)
        if "response_format" in payload or self._use_responses_api(payload):
            return None
        return payload
