"""`vagent-graph`: serve the graph service on HTTP_PORT."""

from __future__ import annotations

import sys

import uvicorn
from fastapi import FastAPI

from vagent_graph.attachments.sandbox import harden_parent
from vagent_graph.http.app import InsecureConfigError, create_app
from vagent_graph.knowledge.parsing import quiet_parsers
from vagent_shared.logs import configure_logging
from vagent_shared.settings import GraphSettings
from vagent_shared.telemetry import instrumented, setup_tracing

#: Probes and scraping start no trace.
UNTRACED_URLS = r"/health$,/metrics$"


def instrument(app: FastAPI) -> None:
    """The maintained instrumentations (tracing is on): the server (an incoming `traceparent`
    continues the caller's trace; no span per body chunk received or SSE event sent) and
    the HTTP clients (httpx: credential registry, tickets, MCP; httpx2: the openai SDK's
    other clients, e.g. embeddings; aiohttp: the model's, models/read_pacing.py)."""
    from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
    from opentelemetry.instrumentation.httpx import HTTPX2ClientInstrumentor, HTTPXClientInstrumentor

    if instrumented("fastapi"):
        FastAPIInstrumentor.instrument_app(
            app, excluded_urls=UNTRACED_URLS, exclude_spans=["receive", "send"]
        )
    if instrumented("httpx"):
        HTTPXClientInstrumentor().instrument()
        HTTPX2ClientInstrumentor().instrument()
    if instrumented("aiohttp-client"):
        AioHttpClientInstrumentor().instrument()


def main() -> None:
    harden_parent()  # first: no process of this uid reads the keys in /proc/<pid>/environ
    settings = GraphSettings()
    configure_logging(settings.LOG_LEVEL, service="vagent-graph")
    quiet_parsers()  # documents uploaded to the admin API
    tracing = setup_tracing("vagent-graph", capture=settings.OTEL_CAPTURE_CONTENT)
    try:
        app = create_app(settings)
    except (InsecureConfigError, ValueError) as exc:
        print(f"vagent-graph: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if tracing is not None:
        instrument(app)
    try:
        uvicorn.run(
            app,
            host=settings.HTTP_HOST,
            port=settings.HTTP_PORT,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=10,
        )
    finally:
        if tracing is not None:
            tracing.shutdown()  # what is still queued is exported before the process ends


if __name__ == "__main__":
    main()
