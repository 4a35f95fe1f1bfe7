"""OpenTelemetry through the gateway: a run streamed with the real `langgraph_sdk` leaves
gateway spans whose trace the graph continues (the same trace id, the graph's server span a
child of the gateway's request to it), and the caller's Matrix token is on no span, even when
the deployer asks the instrumentations to record every request header.

Real parts: an OTLP/HTTP receiver decoding with opentelemetry-proto, Redis, the graph and the
gateway as processes exporting to it, the scripted LLM, the development AccessControlProvider,
the whoami stand-in homeserver.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client

from tests.support.gateway_process import GatewayProcess, demo_acp, gateway_stack
from tests.support.graph_process import TOKEN as GRAPH_TOKEN
from tests.support.llm_server import ScriptedLLMServer
from tests.support.otlp_receiver import OtlpReceiver, SpanRecord
from tests.support.procs import ServiceProcess

ALICE = "@alice:localhost"
TOKEN = f"syt_trace_{secrets.token_urlsafe(24)}"
AGENT = "vagent"
SERVER, CLIENT = 2, 3
STREAM_ROUTE = "POST /threads/{thread_id}/runs/stream"
GRAPH_ROUTE = "POST /api/v1/process_message"


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


@pytest.fixture(scope="module")
def acp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    with demo_acp(tmp_path_factory.mktemp("gwt-acp")) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(
    redis_url: str,
    receiver: OtlpReceiver,
    acp: ServiceProcess,
    _llm_session: ScriptedLLMServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GatewayProcess]:
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    tmp = tmp_path_factory.mktemp("gwt")
    with gateway_stack(
        redis_url,
        _llm_session.base_url,
        tmp,
        {TOKEN: ALICE},
        acp_url=acp.base_url,
        graph_env=otel,
        # a deployer asking for every header on the spans: the token headers stay out anyway
        OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST=".*",
        OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_CLIENT_REQUEST=".*",
        **otel,
    ) as gw:
        yield gw


def said(text: str) -> Any:
    return {"messages": [{"role": "user", "content": text}]}


def in_trace(spans: list[SpanRecord], trace_id: str) -> list[SpanRecord]:
    return [s for s in spans if s.trace_id == trace_id]


def stream_span(spans: list[SpanRecord], thread_id: str) -> SpanRecord | None:
    found = [
        s
        for s in spans
        if s.service == "vagent-gateway"
        and s.name == STREAM_ROUTE
        and s.attributes.get("vagent.gateway.thread_id") == thread_id
    ]
    return found[0] if found else None


def everything(span: SpanRecord) -> str:
    """All a span carries: name, attributes, events, resource (as the exporter sent it)."""
    return f"{span.name} {span.attributes} {span.raw}"


async def test_a_streamed_run_is_one_trace_through_gateway_and_graph(
    gateway: GatewayProcess, receiver: OtlpReceiver, llm_server: ScriptedLLMServer
) -> None:
    answer = "Traced all the way down"
    llm_server.push_text(answer, delay=0.02)
    client = get_client(url=gateway.url, api_key=TOKEN)
    thread_id = (await client.threads.create())["thread_id"]
    parts: list[tuple[str, Any]] = [
        (p.event, p.data)
        async for p in client.runs.stream(
            thread_id,
            AGENT,
            input=said("trace me"),
            stream_mode=["messages-tuple", "values"],
        )
    ]
    assert parts[-1][0] == "end" and "".join(d[0]["content"] for e, d in parts if e == "messages") == answer

    def complete(spans: list[SpanRecord]) -> bool:
        root = stream_span(spans, thread_id)
        return root is not None and any(
            s.service == "vagent-graph" and s.name == GRAPH_ROUTE for s in in_trace(spans, root.trace_id)
        )

    spans = receiver.wait_for(complete, timeout=20)
    root = stream_span(spans, thread_id)
    assert root is not None and root.kind == SERVER and root.parent_id == ""
    assert root.attributes["enduser.id"] == ALICE and root.attributes["vagent.gateway.run_id"]
    trace = in_trace(spans, root.trace_id)
    by_id = {s.span_id: s for s in trace}
    # the graph continues the gateway's trace: its server span is a child of the gateway's
    # client span (the aiohttp request that carried `traceparent`), itself under the stream's
    graph_server = next(s for s in trace if s.service == "vagent-graph" and s.name == GRAPH_ROUTE)
    caller = by_id[graph_server.parent_id]
    assert caller.service == "vagent-gateway" and caller.kind == CLIENT
    assert caller.parent_id == root.span_id
    assert any(s.service == "vagent-graph" and s.name.startswith("invoke_agent") for s in trace)
    # no span per SSE event sent or body chunk received, none for probes
    gateway_spans = [s for s in receiver.snapshot() if s.service == "vagent-gateway"]
    assert not [s.name for s in gateway_spans if s.name.endswith((" send", " receive"))]
    assert not [s.name for s in gateway_spans if "/health" in s.name or "/metrics" in s.name]


async def test_the_callers_token_is_on_no_span(
    gateway: GatewayProcess, receiver: OtlpReceiver, llm_server: ScriptedLLMServer
) -> None:
    """Both ways a token comes (Authorization and X-Api-Key), a forged one too, with every
    header captured on request: the token is on no span of either service, in no attribute
    or event, and the graph's service token neither."""
    llm_server.push_text("Fine.")
    client = get_client(url=gateway.url, headers={"Authorization": f"Bearer {TOKEN}"})
    thread_id = (await client.threads.create())["thread_id"]
    await client.runs.wait(thread_id, AGENT, input=said("hello"))
    forged = "syt_forged_" + secrets.token_urlsafe(24)
    with pytest.raises(httpx.HTTPStatusError):
        await get_client(url=gateway.url, api_key=forged).threads.search()

    def complete(spans: list[SpanRecord]) -> bool:
        names = {s.name for s in spans}
        ran = any(s.attributes.get("vagent.gateway.thread_id") == thread_id for s in spans)
        return ran and "POST /threads/search" in names and GRAPH_ROUTE in names

    spans = receiver.wait_for(complete, timeout=20)
    # the headers were recorded as asked, the token headers' values redacted
    captured = [s for s in spans if s.service == "vagent-gateway" and "[REDACTED]" in everything(s)]
    assert captured
    for span in spans:
        text = everything(span)
        for secret in (TOKEN, forged, GRAPH_TOKEN):
            assert secret not in text, (span.name, span.service)


async def test_a_web_clients_traceparent_is_continued(
    gateway: GatewayProcess, receiver: OtlpReceiver
) -> None:
    """A browser or SDK that traces itself sends `traceparent`: the gateway's span joins it."""
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    headers = {"X-Api-Key": TOKEN, "traceparent": f"00-{trace_id}-{parent}-01"}
    async with httpx.AsyncClient(base_url=gateway.url, headers=headers) as c:
        assert (await c.post("/threads/search", json={})).status_code == 200
    spans = receiver.wait_for(lambda spans: any(s.trace_id == trace_id for s in spans), timeout=20)
    (server,) = [s for s in in_trace(spans, trace_id) if s.kind == SERVER]
    assert server.service == "vagent-gateway" and server.parent_id == parent
