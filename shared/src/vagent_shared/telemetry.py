"""OpenTelemetry traces of both services, exported over OTLP only when an endpoint is set
(docs/traces.md, "Traces (OpenTelemetry)").

Why this shape:
- Off by default. Without OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (or
  with OTEL_SDK_DISABLED=true) nothing is installed: every span the code starts is the API's
  no-op span, nothing is exported, and the instrumentations are never switched on.
- The standard variables, read by the SDK itself: OTEL_SERVICE_NAME and
  OTEL_RESOURCE_ATTRIBUTES (the service's own name only when neither names one),
  OTEL_EXPORTER_OTLP_{TRACES_,}PROTOCOL (http/protobuf; grpc when its exporter is installed),
  OTEL_EXPORTER_OTLP_* (endpoint, headers, timeout, compression), OTEL_BSP_* (the batch
  processor), OTEL_TRACES_SAMPLER[_ARG], and OTEL_PYTHON_DISABLED_INSTRUMENTATIONS (read here:
  `instrumented`).
- A trace starts with work the service was asked to do (an HTTP request, a Matrix event).
  Unless OTEL_TRACES_SAMPLER says otherwise, a client call made outside any trace (the bot's
  Redis polling, a health probe to the graph, an MCP session's own traffic) is not recorded:
  it would be a root span of its own, on every poll.
- Text on a span is content: only with OTEL_CAPTURE_CONTENT=true (`capture_content`), and
  then through `span_text` (secret-looking parts masked, bounded). Credentials never.
- URLs leave as scheme, host and path, the path's secrets masked, whatever put them on a
  span (`span_urls.UrlScrubbingExporter` around the exporter): an MCP URL carries its token.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from vagent_shared.secrets import mask_secrets

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

log = structlog.get_logger(__name__)

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
#: At most this many characters of one text attribute (a prompt, an answer, arguments).
MAX_TEXT_CHARS = 8000

_capture = False
_enabled = False


def tracing_wanted(env: Mapping[str, str] | None = None) -> bool:
    """An OTLP endpoint is set and the SDK is not disabled."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(env.get(name, "").strip() for name in ENDPOINT_VARIABLES)


#: What OTEL_PYTHON_DISABLED_INSTRUMENTATIONS means when it is not set at all: the Redis
#: command spans stay out. They are ~15 of a turn's ~23 spans and cost +4% graph CPU per
#: conversation on their own (measured: tracing +6.8% with them, +2.5% without; bench/README.md,
#: "Tracing"), over the 5% tracing may cost. Set the variable (even empty) to choose yourself.
DEFAULT_DISABLED_INSTRUMENTATIONS = "redis"


def instrumented(name: str, env: Mapping[str, str] | None = None) -> bool:
    """Is the maintained instrumentation `name` (`redis`, `fastapi`, `httpx`, `aiohttp-client`)
    wanted? The standard OTEL_PYTHON_DISABLED_INSTRUMENTATIONS lists those that are not (`*`:
    none is); unset, it is DEFAULT_DISABLED_INSTRUMENTATIONS (`redis`); set empty, all are."""
    env = os.environ if env is None else env
    listed = env.get("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", DEFAULT_DISABLED_INSTRUMENTATIONS)
    disabled = {n.strip().lower() for n in listed.split(",")}
    return not ({name, "*"} & disabled)


def tracing_enabled() -> bool:
    """Did `setup_tracing` install the SDK in this process?"""
    return _enabled


def capture_content() -> bool:
    """May prompt, answer and argument text go on spans (OTEL_CAPTURE_CONTENT, read at setup)?"""
    return _capture


def span_text(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """`text` fit for a span attribute: secret-looking parts masked, at most `limit` characters."""
    masked = mask_secrets(text)
    return masked if len(masked) <= limit else masked[: limit - 1] + "…"


def span_json(value: Any, limit: int = MAX_TEXT_CHARS) -> str:
    """`value` as JSON for a span attribute, masked and bounded as `span_text`."""
    return span_text(json.dumps(value, ensure_ascii=False, default=str), limit)


def failed(span: Span, error_type: str) -> None:
    """Mark `span` failed, by a short kind only (`error.type`), never a message."""
    span.set_attribute("error.type", error_type)
    span.set_status(Status(StatusCode.ERROR))


@contextmanager
def guarded_span(
    tracer: trace.Tracer,
    name: str,
    attributes: dict[str, Any],
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    parent: otel_context.Context | None = None,
    error_type: Callable[[Exception], str] = lambda exc: type(exc).__qualname__,
    not_a_failure: Callable[[Exception], bool] = lambda exc: False,
) -> Iterator[Span]:
    """The one way both services open a span of their own: current while the block runs, a
    failure recorded by `error_type(exc)` only (an exception's message may quote a secret, so
    the SDK's own recording is off), a cancellation (`!stop`, a client gone, shutdown) and
    whatever `not_a_failure` says (the graph's pause for a question) not failures."""
    with tracer.start_as_current_span(
        name,
        context=parent,
        kind=kind,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except asyncio.CancelledError:
            span.set_attribute("vagent.cancelled", True)
            raise
        except Exception as exc:
            if not not_a_failure(exc):
                failed(span, error_type(exc))
            raise


@dataclass
class Tracing:
    """The installed SDK; `shutdown` exports what is still queued (call it on exit)."""

    provider: TracerProvider

    def shutdown(self) -> None:
        self.provider.shutdown()


def setup_tracing(
    service_name: str, *, capture: bool = False, env: Mapping[str, str] | None = None
) -> Tracing | None:
    """Install the SDK as the global tracer provider when tracing is wanted (see the module's
    docstring); None, and nothing installed, otherwise. `service_name` is the default
    OTEL_SERVICE_NAME; `capture` is OTEL_CAPTURE_CONTENT. Also instruments redis-py."""
    global _capture, _enabled
    env = os.environ if env is None else env
    if not tracing_wanted(env):
        return None
    from opentelemetry.instrumentation.redis import RedisInstrumentor
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from vagent_shared.span_urls import UrlScrubbingExporter

    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    sampler = None if env.get("OTEL_TRACES_SAMPLER") else _default_sampler()
    provider = TracerProvider(resource=resource, sampler=sampler)
    # every span leaves with URLs reduced to scheme, host and path (span_urls.py: MCP URLs
    # carry tokens, and the HTTP instrumentations put whole URLs on their spans)
    provider.add_span_processor(BatchSpanProcessor(UrlScrubbingExporter(_exporter(env))))
    trace.set_tracer_provider(provider)
    if instrumented("redis", env):
        RedisInstrumentor().instrument(tracer_provider=provider)
    _capture, _enabled = capture, True
    log.info(
        "tracing_enabled",
        service_name=resource.attributes.get(SERVICE_NAME),
        protocol=_protocol(env),
        capture_content=capture,
    )
    return Tracing(provider)


def _protocol(env: Mapping[str, str]) -> str:
    chosen = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    return (chosen or "http/protobuf").strip().lower()


def _exporter(env: Mapping[str, str]) -> SpanExporter:
    """The OTLP exporter the protocol asks for; http/protobuf when that one is not installed."""
    protocol = _protocol(env)
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError:
            log.warning(
                "tracing_grpc_unavailable",
                detail="OTEL_EXPORTER_OTLP_PROTOCOL=grpc, but opentelemetry-exporter-otlp-proto-grpc is "
                "not installed: exporting over http/protobuf instead",
            )
        else:
            exporter: SpanExporter = GrpcExporter()
            return exporter
    elif protocol != "http/protobuf":
        log.warning("tracing_protocol_unsupported", protocol=protocol[:40], using="http/protobuf")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def _default_sampler() -> Any:
    """Parent-based; a span without a parent is recorded unless it is a client call."""
    from opentelemetry.sdk.trace.sampling import (
        ALWAYS_ON,
        Decision,
        ParentBased,
        Sampler,
        SamplingResult,
    )
    from opentelemetry.trace import Link, SpanKind
    from opentelemetry.util.types import Attributes

    class WorkRoots(Sampler):
        def should_sample(
            self,
            parent_context: Any,
            trace_id: int,
            name: str,
            kind: SpanKind | None = None,
            attributes: Attributes = None,
            links: Sequence[Link] | None = None,
            trace_state: Any = None,
        ) -> SamplingResult:
            if kind == SpanKind.CLIENT:
                return SamplingResult(Decision.DROP)
            return ALWAYS_ON.should_sample(parent_context, trace_id, name, kind, attributes, links)

        def get_description(self) -> str:
            return "WorkRoots{no client calls outside a trace}"

    return ParentBased(root=WorkRoots())


def add_trace_ids(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: `trace_id` and `span_id` of the span being recorded, if any, so a
    log line leads to its trace (and back)."""
    span = trace.get_current_span()
    if span.is_recording():
        ctx = span.get_span_context()
        event_dict.setdefault("trace_id", format(ctx.trace_id, "032x"))
        event_dict.setdefault("span_id", format(ctx.span_id, "016x"))
    return event_dict
