"""What the bot's own HTTP calls (graph service, access provider) share.

They use aiohttp, which matrix-nio already runs on. Proxy variables (HTTP_PROXY,
HTTPS_PROXY, NO_PROXY, any case) are honoured like most HTTP clients do, but read once
per target: aiohttp's `trust_env` re-reads them, and ~/.netrc, on every request
(~0.3 ms each, on every message's path).
"""

from __future__ import annotations

import urllib.request
from urllib.parse import urlsplit

import aiohttp

from vagent_shared.telemetry import instrumented, tracing_enabled


def proxy_for(url: str) -> str | None:
    """The proxy the environment asks for to reach `url`, or None (none set, or NO_PROXY)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if urllib.request.proxy_bypass(host):  # NO_PROXY (on Linux: the environment only)
        return None
    return urllib.request.getproxies_environment().get(parts.scheme) or None


def client_tracing() -> list[aiohttp.TraceConfig]:
    """For the graph client's session only: a span per request, and the W3C `traceparent`
    that lets the graph continue the Matrix event's trace. None when tracing is off. Not
    aiohttp as a whole: matrix-nio's long-poll sync would start a trace of its own every 30 s."""
    if not tracing_enabled() or not instrumented("aiohttp-client"):
        return []
    from opentelemetry.instrumentation.aiohttp_client import create_trace_config

    return [create_trace_config()]


