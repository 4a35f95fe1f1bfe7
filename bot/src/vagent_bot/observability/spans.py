"""The bot's OpenTelemetry spans (docs/traces.md): one trace per Matrix event the bot handles,
with the access check and the answer to a question inside it; the graph request joins it
through the graph client's aiohttp trace config (`vagent_bot.clients.http.client_tracing`), which
sends the W3C `traceparent` the graph continues.

Without tracing set up (vagent_shared.telemetry) these are the API's no-op spans. On a span:
room, event and user ids; the message body only with OTEL_CAPTURE_CONTENT=true, masked.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

from vagent_shared.telemetry import capture_content, guarded_span, span_text

tracer = trace.get_tracer("vagent.bot")
T = TypeVar("T")


def _span(
    name: str,
    attributes: dict[str, Any],
    kind: SpanKind = SpanKind.INTERNAL,
    parent: otel_context.Context | None = None,
) -> AbstractContextManager[Span]:
    """The bot's own span (vagent_shared.telemetry.guarded_span: failures by type only)."""
    return guarded_span(tracer, name, attributes, kind=kind, parent=parent)


@contextmanager
def event_span(kind: str, room_id: str, event_id: str) -> Iterator[Span]:
    """`matrix {kind}`: the root of one event's trace (a new trace whatever task it runs in)."""
    attributes = {
        "messaging.system": "matrix",
        "messaging.operation.type": "process",
        "messaging.destination.name": room_id,
        "messaging.message.id": event_id,
    }
    with _span(f"matrix {kind}", attributes, SpanKind.CONSUMER, otel_context.Context()) as span:
        yield span


def note_message(sender: str, body: str, decision: str) -> None:
    """On the event's span: who wrote, whether the bot answers (and the body, if captured)."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.set_attribute("enduser.id", sender)
    span.set_attribute("vagent.decision", decision)
    if capture_content():
        span.set_attribute("vagent.message.body", span_text(body))


@contextmanager
def access_span(room_id: str, user_id: str) -> Iterator[Span]:
    """`access check`: the tenant of the room and the access provider's answer."""
    with _span("access check", {"enduser.id": user_id, "messaging.destination.name": room_id}) as span:
        yield span


@contextmanager
def answer_span(session_id: str) -> Iterator[Span]:
    """`hitl answer`: an answer to the agent's question going to the graph."""
    with _span("hitl answer", {"gen_ai.conversation.id": session_id}) as span:
        yield span


def carried(job: Callable[[], Coroutine[Any, Any, T]]) -> Callable[[], Coroutine[Any, Any, T]]:
    """`job`, run later in another task (a session's queue), still inside the current trace."""
    ctx = otel_context.get_current()

    async def run() -> T:
        token = otel_context.attach(ctx)
        try:
            return await job()
        finally:
            otel_context.detach(token)

    return run
