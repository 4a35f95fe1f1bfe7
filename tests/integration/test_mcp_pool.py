"""The MCP session pool under calls in flight (real MCP server processes,
tests/support/mcp_server.py): with `credential: service` every user shares a key, so one
user's slow call and another's quick one meet on the same pool.

- Alice's slow `create_event` is never killed by Bob's call (the old pool pinged the shared
  session under its lock, gave up after 5 s and closed it under Alice's call in flight: she
  was told it failed although the server went on to book it), and Bob does not wait for her.
- A wait for a free session ends with the call's own timeout, and a call that timed out is
  reported as "may or may not have happened", never as failed.
- The HTTP spans of a call on a reused session belong to the calling turn's trace, not to
  the trace of the turn that happened to open the session.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.support.factories import ac
from tests.support.mcp_server import McpTestServer, tool
from vagent_graph.agents.mcp_config import McpServerConfig
from vagent_graph.mcp import pool as mcp_pool
from vagent_graph.mcp.client import McpUnavailable
from vagent_graph.mcp.results import failure_text
from vagent_graph.mcp.servers import McpServers
from vagent_graph.tools import ToolContext, ToolRegistry

ALICE, BOB = "@alice:x", "@bob:x"
#: Long enough that a ping waiting 5 s for the session's lock gives up before it ends.
SLOW_SECONDS = 8.0
TOOLS = [
    tool("create_event", "hang", params={"text": "string"}, seconds=SLOW_SECONDS),
    tool("stuck", "hang", params={"text": "string"}, seconds=600),
    tool("echo", params={"text": "string"}, annotations={"readOnlyHint": True}),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[McpTestServer]:
    with McpTestServer({"name": "shared", "tools": TOOLS}, tmp_path_factory.mktemp("pool")) as s:
        yield s


def shared(url: str, timeout: float = 30) -> McpServerConfig:
    """A server every user reaches with the same service credential: one pool key for all."""
    return McpServerConfig(
        name="cal",
        url=url,
        credential="service",
        service_credential_env="CAL_SERVICE_KEY",
        timeout_seconds=timeout,
    )


async def run(registry: ToolRegistry, name: str, user: str, text: str) -> str:
    t = registry.get(name)
    assert t is not None, name
    ctx = ToolContext(ac=ac(user, ["mcp_server:cal"]), session_id=f"s-{user}")
    out = await t.run(t.args_model.model_validate({"text": text}), ctx, None)
    assert isinstance(out, str), out
    return out


async def until(check: Any, seconds: float = 20) -> None:
    for _ in range(int(seconds * 20)):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("never happened")


@pytest.fixture(autouse=True)
def service_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAL_SERVICE_KEY", "service-key-0123456789")


async def test_a_slow_call_is_never_killed_by_another_users_call(
    server: McpTestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A session idle this long is pinged before reuse (5 s in production): 1 s, so Bob's call
    # comes "after an idle while" without the test sitting idle for 5 s.
    monkeypatch.setattr(mcp_pool, "PING_AFTER_SECONDS", 1.0)
    server.clear()
    registry = ToolRegistry()
    servers = McpServers([shared(server.url)], registry, refresh_seconds=3600)
    await servers.start()
    try:
        assert "warm up" in await run(registry, "cal__echo", ALICE, "warm up")  # a session, now idle
        await asyncio.sleep(1.2)
        alice = asyncio.create_task(run(registry, "cal__create_event", ALICE, "Alice's design review"))
        await until(lambda: any(c["tool"] == "create_event" for c in server.calls()))
        await asyncio.sleep(1.5)  # Alice's call is in flight, past PING_AFTER_SECONDS
        bob = await run(registry, "cal__echo", BOB, "Bob's question")
        assert json.loads(bob)["arguments"] == {"text": "Bob's question"}
        assert not alice.done(), "Bob waited for Alice's slow call"
        booked = await alice
        assert json.loads(booked)["arguments"] == {"text": "Alice's design review"}, booked
    finally:
        await servers.aclose()
    assert [c["tool"] for c in server.calls()].count("create_event") == 1


async def test_a_wait_for_a_session_ends_with_the_calls_timeout(server: McpTestServer) -> None:
    """One call at a time per key here: Alice's call holds the only session; Bob's call (with
    a 1 s timeout) waits for it that long at most, and is told it did not go through. A
    cancelled call (Alice's turn ended) leaves its session closed, and the pool goes on."""
    server.clear()
    pool = mcp_pool.SessionPool(max_per_key=1)
    patient, hasty = shared(server.url, timeout=60), shared(server.url, timeout=1)
    stuck = asyncio.create_task(pool.call(patient, "stuck", {"text": "book the big room"}, None, "k"))
    try:
        await until(lambda: any(c["tool"] == "stuck" for c in server.calls()))
        with pytest.raises(McpUnavailable) as waited:
            await pool.call(hasty, "echo", {"text": "anything"}, None, "k")
        assert (waited.value.reason, waited.value.unknown) == ("busy", False)
        told = failure_text("cal__echo", waited.value, 1)
        assert told.startswith("cal__echo is unavailable right now (busy); the call did not go through")
        stuck.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stuck
        result, _ = await pool.call(hasty, "echo", {"text": "after"}, None, "k")
        assert json.loads(result.content[0].text)["arguments"] == {"text": "after"}  # type: ignore[union-attr]
        assert len(pool) == 1  # the cancelled call's session was closed, not handed on
    finally:
        stuck.cancel()
        await pool.aclose()
    assert [c["tool"] for c in server.calls()] == ["stuck", "echo"]


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """A tracer provider of the test's own (the global one is left alone) with the maintained
    httpx instrumentation on it, as the graph runs it (vagent_graph.__main__)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    HTTPXClientInstrumentor().instrument(tracer_provider=provider)
    try:
        yield provider, exporter
    finally:
        HTTPXClientInstrumentor().uninstrument()
        provider.shutdown()


def ancestors(span: ReadableSpan, by_id: dict[int, ReadableSpan]) -> list[int]:
    found = []
    parent = span.parent.span_id if span.parent else None
    while parent is not None:
        found.append(parent)
        above = by_id.get(parent)
        parent = above.parent.span_id if above is not None and above.parent else None
    return found


async def test_a_reused_sessions_http_spans_belong_to_the_calling_turn(
    server: McpTestServer, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    tracer = provider.get_tracer("test")
    registry = ToolRegistry()
    servers = McpServers([shared(server.url)], registry, refresh_seconds=3600)
    await servers.start()
    try:
        turns: dict[str, trace.Span] = {}
        for n, user in enumerate((ALICE, BOB, ALICE)):  # Alice's turn opens the session, Bob's reuses it
            with tracer.start_as_current_span(f"execute_tool cal__echo ({user})") as span:
                await run(registry, "cal__echo", user, f"from {user}")
            turns[f"{n}: {user}"] = span
        assert len(servers.pool) == 1  # one session served all three calls
    finally:
        await servers.aclose()
    finished = exporter.get_finished_spans()
    by_id = {s.context.span_id: s for s in finished}
    http = [s for s in finished if s.kind == trace.SpanKind.CLIENT and s.name in ("POST", "GET", "DELETE")]
    for name, turn in turns.items():
        ctx = turn.get_span_context()
        mine = [s for s in http if s.context.trace_id == ctx.trace_id]
        assert any(s.name == "POST" for s in mine), name  # the call itself, in its turn's trace
        for s in mine:
            assert ctx.span_id in ancestors(s, by_id), (name, s.name)
    # nothing else: no request of the session (its notification stream, the tool lists, its
    # closing) lands in a turn it does not belong to, nor as a stray trace of its own
    turn_traces = {t.get_span_context().trace_id for t in turns.values()}
    assert {s.context.trace_id for s in http} == turn_traces
