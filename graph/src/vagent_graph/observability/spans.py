"""The graph's own OpenTelemetry spans, where no instrumentation sees the work: the run, each
model call (GenAI semantic conventions), each tool call, an MCP call, a document search, a
credential fetch and the wait for a confirmation (docs/traces.md lists them).

Each is a context manager around the one line that does the work, so the modules that call
them change by a line or two. Without tracing set up they are the API's no-op spans (a few
µs). What goes on a span: names, ids, counts, outcomes; prompt, answer, argument and query
text only with OTEL_CAPTURE_CONTENT=true, masked (`vagent_shared.telemetry.span_text`);
credentials and exception messages never (an exception is recorded by its type only).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import RunnableConfig
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

from vagent_graph.observability.recorder import turn_of
from vagent_shared.telemetry import capture_content, failed, guarded_span, span_json, span_text

tracer = trace.get_tracer("vagent.graph")

#: The agent's name on the run's span (`invoke_agent vagent`).
AGENT_NAME = "vagent"
OFFLINE_PROVIDER = "vagent.offline"


def _span(
    name: str, attributes: dict[str, Any], kind: SpanKind = SpanKind.INTERNAL
) -> AbstractContextManager[Span]:
    """The graph's own span (vagent_shared.telemetry.guarded_span): a failure by its short
    kind (`error_type`), and a question to the human (`_interrupt`) is not one."""
    return guarded_span(tracer, name, attributes, kind=kind, error_type=error_type, not_a_failure=_interrupt)


def _interrupt(exc: BaseException) -> bool:
    """LangGraph's way to pause a run for a question (raised through the spans around it)."""
    return type(exc).__name__ == "GraphInterrupt"


def error_type(exc: BaseException) -> str:
    """What `error.type` says: the failure's own short kind where it has one (a credential's
    `kind`, an MCP call's `reason`), else the exception's class."""
    for name in ("kind", "reason"):
        value = getattr(exc, name, None)
        if isinstance(value, str) and 0 < len(value) <= 40:
            return value
    return type(exc).__qualname__


# ---- the run -------------------------------------------------------------------------------
async def traced_run(
    work: Awaitable[None], config: RunnableConfig, resume: bool, outcome: Callable[[], str]
) -> None:
    """The graph run of one request (`event_stream.Run`), as `invoke_agent vagent`;
    `outcome()` tells how it ended once `work` is done."""
    configurable = config.get("configurable", {})
    turn = turn_of(config)
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": AGENT_NAME,
        "gen_ai.conversation.id": str(configurable.get("thread_id", "")),
        "vagent.run.kind": "resume" if resume else "message",
    }
    if turn is not None:
        attributes["vagent.turn_id"] = turn.trace.turn_id
    with _span(f"invoke_agent {AGENT_NAME}", attributes) as span:
        try:
            await work
        except asyncio.CancelledError:
            span.set_attribute("vagent.run.outcome", "cancelled")
            raise
        result = outcome()
        span.set_attribute("vagent.run.outcome", result)
        if result == "failed":
            failed(span, "run_failed")


# ---- a model call --------------------------------------------------------------------------
class LlmSpan:
    """The span of one model call; `answered` adds what the response says."""

    def __init__(self, span: Span) -> None:
        self.span = span

    def answered(self, ai: AIMessage) -> None:
        span = self.span
        if not span.is_recording():
            return
        meta = ai.response_metadata or {}
        model = meta.get("model_name") or meta.get("model")
        if model:
            span.set_attribute("gen_ai.response.model", str(model))
        if meta.get("id"):
            span.set_attribute("gen_ai.response.id", str(meta["id"]))
        if meta.get("finish_reason"):
            span.set_attribute("gen_ai.response.finish_reasons", [str(meta["finish_reason"])])
        usage = ai.usage_metadata
        if usage:
            span.set_attribute("gen_ai.usage.input_tokens", int(usage["input_tokens"]))
            span.set_attribute("gen_ai.usage.output_tokens", int(usage["output_tokens"]))
        if capture_content():
            span.set_attribute("gen_ai.output.messages", span_json([_message(ai)]))


@contextmanager
def llm_span(
    model: str, llm: Any, messages: Sequence[BaseMessage], tools: int = 0
) -> Iterator[LlmSpan]:
    """`chat {model}` around one call of `llm` (ChatOpenAI or the offline model) with `messages`."""
    offline = type(llm).__name__ == "OfflineChatModel"
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": OFFLINE_PROVIDER if offline else "openai",
        "gen_ai.request.model": model,
    }
    temperature = getattr(llm, "temperature", None)
    if isinstance(temperature, int | float):
        attributes["gen_ai.request.temperature"] = float(temperature)
    if tools:
        attributes["vagent.llm.tools_offered"] = tools
    with _span(f"chat {model}", attributes, SpanKind.CLIENT) as span:
        if capture_content() and span.is_recording():
            span.set_attribute("gen_ai.input.messages", span_json([_message(m) for m in messages]))
        yield LlmSpan(span)


def _message(message: BaseMessage) -> dict[str, Any]:
    """One message as the GenAI conventions write it (role, parts); images by kind only."""
    role = {"human": "user", "ai": "assistant"}.get(message.type, message.type)
    parts: list[dict[str, Any]] = []
    content = message.content
    for part in [content] if isinstance(content, str) else content:
        if isinstance(part, str):
            parts.append({"type": "text", "content": part})
        elif isinstance(part, dict) and part.get("type") == "text":
            parts.append({"type": "text", "content": str(part.get("text", ""))})
        elif isinstance(part, dict):
            parts.append({"type": str(part.get("type", "other"))})
    for call in getattr(message, "tool_calls", None) or []:
        parts.append(
            {"type": "tool_call", "id": call.get("id"), "name": call["name"], "arguments": call["args"]}
        )
    return {"role": role, "parts": [p for p in parts if p.get("content") != ""]}


# ---- a tool call ---------------------------------------------------------------------------
@contextmanager
def tool_span(raw: Mapping[str, Any], registry: Any) -> Iterator[Span]:
    """`execute_tool {name}` around one call of the tools node: `raw` is the model's call,
    `registry` the ToolRegistry that says where the tool comes from (built in, or an MCP
    server). The decision is added by `tool_decision`, the outcome by `tool_step`."""
    asked_for = str(raw.get("name", ""))
    name = span_text(asked_for, 100)
    tool = registry.get(asked_for)
    server = getattr(tool, "server", None)
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
        "gen_ai.tool.call.id": str(raw.get("id", ""))[:100],
        "gen_ai.tool.type": "extension" if server else "function",
        "vagent.tool.source": f"mcp:{server}" if server else "builtin" if tool is not None else "unknown",
    }
    with _span(f"execute_tool {name}", attributes) as span:
        if capture_content() and span.is_recording():
            span.set_attribute("gen_ai.tool.call.arguments", span_json(raw.get("args")))
        try:
            yield span
        except Exception as exc:
            if _interrupt(exc):  # the question is being asked: the run pauses here
                span.set_attribute("vagent.tool.outcome", "asked")
            raise


def tool_step(span: Span, step: Any) -> None:
    """How the call ended (`ToolCalls.execute`'s step): ok, error, cancelled, or
    confirmation_needed (the question is saved, then asked)."""
    if not isinstance(step, tuple):
        span.set_attribute("vagent.tool.outcome", "confirmation_needed")
        return
    message, cancelled = step
    failed = getattr(message, "status", "") == "error"
    span.set_attribute("vagent.tool.outcome", "cancelled" if cancelled else "error" if failed else "ok")
    if capture_content() and span.is_recording():
        span.set_attribute("gen_ai.tool.call.result", span_text(str(getattr(message, "content", ""))))


def tool_decision(decision: str, reason: str = "") -> None:
    """The access decision on the tool call being run (its span is the current one)."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attribute("vagent.tool.decision", decision)
        if reason:
            span.set_attribute("vagent.tool.decision_reason", span_text(reason, 200))


def wait_outcome(answer: Any) -> str:
    """What became of a confirmation (`ToolCalls._ask`'s answer): a str is its yes, an
    outcome cancelled is no answer in time, any other outcome a no."""
    if isinstance(answer, str):
        return "approved"
    return "expired" if isinstance(answer, tuple) and len(answer) == 2 and answer[1] else "declined"


def confirmation_waited(stored: Mapping[str, Any], tool: str, outcome: str) -> None:
    """On a resume: `confirmation wait`, from when the question was asked (`asked_at`, epoch
    seconds, in the saved confirmation) to now. Nothing when that time is not known."""
    asked = stored.get("asked_at")
    if not isinstance(asked, int | float):
        return
    now = time.time_ns()
    start = min(int(asked * 1e9), now)
    span = tracer.start_span(
        "confirmation wait",
        start_time=start,
        attributes={
            "gen_ai.tool.name": span_text(tool, 100),
            "vagent.confirmation.outcome": outcome,
            "vagent.confirmation.wait_ms": round((now - start) / 1e6, 1),
        },
    )
    span.end(end_time=now)


# ---- what a tool does ----------------------------------------------------------------------
@contextmanager
def mcp_span(server: str, tool: str) -> Iterator[Span]:
    """`tools/call {tool}` to an MCP server."""
    attributes = {
        "mcp.method.name": "tools/call",
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "vagent.mcp.server": server,
    }
    with _span(f"tools/call {tool}", attributes, SpanKind.CLIENT) as span:
        yield span


@contextmanager
def retrieval_span(source: str, query: str) -> Iterator[Span]:
    """`retrieval {source}`: a search of the knowledge store; `results(span, n)` after it."""
    attributes = {"gen_ai.operation.name": "retrieval", "vagent.retrieval.source": source}
    with _span(f"retrieval {source}", attributes) as span:
        if capture_content() and span.is_recording():
            span.set_attribute("vagent.retrieval.query", span_text(query, 1000))
        yield span


def results(span: Span, count: int) -> None:
    span.set_attribute("vagent.retrieval.results", count)


@contextmanager
def credential_span(resource: str) -> Iterator[Span]:
    """`credential fetch` for one resource (never the value); `cache_hit` after it."""
    with _span("credential fetch", {"vagent.credential.resource": resource}) as span:
        yield span


def cache_hit(span: Span, hit: bool) -> None:
    span.set_attribute("vagent.credential.cache_hit", hit)
