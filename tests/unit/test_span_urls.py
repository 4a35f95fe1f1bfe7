"""URLs leave on spans as scheme, host and path, the path's secrets masked (span_urls.py):
an MCP server's URL carries its token in the query or the path, and the HTTP instrumentations
put whole URLs on their spans. Spans are made with the real SDK and exported through the
wrapper into the SDK's in-memory exporter."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from vagent_shared.span_urls import REDACTED, UrlScrubbingExporter, span_path, span_url


def test_query_fragment_and_user_info_are_dropped() -> None:
    assert span_url("https://mcp.example.com/mcp?api_key=abc&x=1#frag") == "https://mcp.example.com/mcp"
    assert span_url("http://bob:hunter2@127.0.0.1:8093/mcp") == "http://127.0.0.1:8093/mcp"
    assert span_url("http://[::1]:9/v1/chat/completions?key=k") == "http://[::1]:9/v1/chat/completions"
    assert span_url("/relative/path?q=1") == "/relative/path"
    assert span_url("http://[::1") == REDACTED  # unparseable


def test_secrets_in_the_path_are_masked_ids_and_names_kept() -> None:
    hex_key = secrets.token_hex(16)
    assert span_path(f"/s/{hex_key}/mcp") == f"/s/{REDACTED}/mcp"
    assert span_path(f"/mcp/{uuid.uuid4()}/sse") == f"/mcp/{REDACTED}/sse"
    assert span_path("/actions/sk-ak-4f9c2a7b1e8d3c6a9f0b2d4e/sse") == f"/actions/{REDACTED}/sse"
    assert span_path("/token/abc/mcp") == f"/token/{REDACTED}/mcp"  # after a segment naming a key
    assert span_path("/key/xyz") == f"/key/{REDACTED}"
    assert span_path("/mcp;api_key=short") == f"/{REDACTED}"
    assert span_path("/api/v1/process_message") == "/api/v1/process_message"
    assert span_path("/v1/2026-11-25/events") == "/v1/2026-11-25/events"
    assert span_path("/api/v1/x?token=t") == "/api/v1/x"  # http.target carries the query


@settings(max_examples=200, deadline=None)
@given(
    token=st.one_of(
        st.builds(secrets.token_hex, st.integers(8, 32)),
        st.builds(secrets.token_urlsafe, st.integers(12, 32)),
        st.builds(lambda: str(uuid.uuid4())),
    ),
    where=st.sampled_from(["query", "path", "after", "userinfo", "fragment"]),
    param=st.sampled_from(["api_key", "token", "key", "x", "sig", "access_token"]),
)
def test_a_token_anywhere_in_a_url_never_survives(token: str, where: str, param: str) -> None:
    url = {
        "query": f"https://mcp.example.com/mcp?{param}={token}",
        "path": f"https://mcp.example.com/servers/{token}/mcp",
        "after": f"https://mcp.example.com/{param}/{token}",
        "userinfo": f"https://user:{token}@mcp.example.com/mcp",
        "fragment": f"https://mcp.example.com/mcp#{token}",
    }[where]
    shown = span_url(url)
    assert token not in shown and "?" not in shown and "#" not in shown and "@" not in shown
    assert shown.startswith("https://mcp.example.com/")


@pytest.fixture
def exported() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(UrlScrubbingExporter(memory)))
    yield provider, memory
    provider.shutdown()


def test_every_url_on_an_exported_span_is_reduced(
    exported: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """Client spans of both conventions, a server span, an exception event and a status
    message: whatever set the URL, and when, it leaves reduced."""
    provider, memory = exported
    tracer = provider.get_tracer("test")
    token = secrets.token_hex(16)
    url = f"http://127.0.0.1:8093/mcp?api_key={token}"
    with tracer.start_as_current_span("POST", kind=SpanKind.CLIENT, attributes={"http.url": url}) as span:
        span.set_attribute("url.full", url)  # set late, as a hook or the ASGI middleware does
        span.set_attribute("http.method", "POST")
        span.add_event("exception", {"exception.message": f"failed: {url} refused"})
        span.set_status(Status(StatusCode.ERROR, f"could not reach {url}"))
    server = {"http.target": f"/api/v1/x?token={token}", "url.path": "/api/v1/x", "url.query": f"t={token}"}
    tracer.start_span("POST /api/v1/x", kind=SpanKind.SERVER, attributes=server).end()
    tracer.start_span("chat test-model", attributes={"gen_ai.request.model": "m"}).end()
    client, srv, untouched = memory.get_finished_spans()
    assert client.attributes == {
        "http.url": "http://127.0.0.1:8093/mcp",
        "url.full": "http://127.0.0.1:8093/mcp",
        "http.method": "POST",
    }
    assert client.events[0].attributes == {"exception.message": "failed: http://127.0.0.1:8093/mcp refused"}
    assert client.status.description == "could not reach http://127.0.0.1:8093/mcp"
    assert client.kind == SpanKind.CLIENT and client.parent is None and client.end_time
    assert srv.attributes == {"http.target": "/api/v1/x", "url.path": "/api/v1/x"}  # no query at all
    assert untouched.attributes == {"gen_ai.request.model": "m"}
    assert all(token not in repr((s.attributes, s.events, s.status.description)) for s in (client, srv))
