"""`vagent-gateway`: serve LangGraph's server API on GATEWAY_PORT."""

from __future__ import annotations

import os

import uvicorn
from fastapi import FastAPI

from vagent_gateway.app import create_app
from vagent_shared.logs import configure_logging
from vagent_shared.settings import GatewaySettings
from vagent_shared.telemetry import instrumented, setup_tracing

#: Probes and scraping start no trace.
UNTRACED_URLS = r"/health$,/metrics$,/ok$"
#: Never on a span, whatever OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_* asks for: the headers
#: that carry a person's Matrix token (and a cookie, should a proxy add one).
SECRET_HEADERS = ("authorization", "x-api-key", "cookie", "set-cookie", "proxy-authorization")
SANITIZE_VARIABLE = "OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SANITIZE_FIELDS"


def sanitized_headers() -> list[str]:
    """The deployer's OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SANITIZE_FIELDS plus
    SECRET_HEADERS, also written back to the variable: the aiohttp instrumentation reads it
    from the environment only."""
    listed = [h.strip().lower() for h in os.environ.get(SANITIZE_VARIABLE, "").split(",") if h.strip()]
    merged = listed + [h for h in SECRET_HEADERS if h not in listed]
    os.environ[SANITIZE_VARIABLE] = ",".join(merged)
    return merged


def instrument(app: FastAPI) -> None:
    """The maintained instrumentations (tracing is on): the server (an incoming `traceparent`
    continues the caller's trace; no span per body chunk received or SSE event sent) and the
    aiohttp client, so the graph request carries `traceparent` and the graph continues the
    trace. All of aiohttp, not one session as in the bot: the gateway has no long poll that
    would start traces of its own, and its other calls (whoami, the access provider) are made
    inside a request's trace; the default sampler drops client calls outside any trace."""
    from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    secret = sanitized_headers()
    if instrumented("fastapi"):
        FastAPIInstrumentor.instrument_app(
            app,
            excluded_urls=UNTRACED_URLS,
            exclude_spans=["receive", "send"],
            http_capture_headers_sanitize_fields=secret,
        )
    if instrumented("aiohttp-client"):
        AioHttpClientInstrumentor().instrument()


def main() -> None:
    settings = GatewaySettings()
    configure_logging(settings.LOG_LEVEL, service="vagent-gateway")
    tracing = setup_tracing("vagent-gateway", capture=settings.OTEL_CAPTURE_CONTENT)
    app = create_app(settings)
    if tracing is not None:
        instrument(app)
    try:
        uvicorn.run(
            app,
            host=settings.GATEWAY_HOST,
            port=settings.GATEWAY_PORT,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=10,
        )
    finally:
        if tracing is not None:
            tracing.shutdown()  # what is still queued is exported before the process ends


if __name__ == "__main__":
    main()
