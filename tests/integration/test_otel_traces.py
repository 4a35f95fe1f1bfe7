"""OpenTelemetry through the real graph service: a real OTLP/HTTP receiver (decoding with the
official opentelemetry-proto package), the graph as a process exporting to it, the scripted
OpenAI-compatible LLM, the development Credential Registry and ticket service, real Redis.

A request carrying a W3C `traceparent` continues that trace: the server span, the run, each
model call (GenAI attributes, the token counts the provider reported), each tool call, the
document search, the credential fetch and the wait for a confirmation. No prompt text on any
span unless OTEL_CAPTURE_CONTENT=true, and no secret ever (one in the message, the LLM key,
the credential from the registry, the service token).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.factories import ac, message_body, new_session
from tests.support.graph_process import TOKEN, GraphProcess
from tests.support.llm_server import ScriptedLLMServer
from tests.support.mcp_server import McpTestServer, tool
from tests.support.otlp_receiver import OtlpReceiver, SpanRecord
from tests.support.procs import ROOT, credential_registry, ticket_service
from tests.support.sse import post_sse
from vagent_shared import SessionId
from vagent_shared.events import HitlRequest, SSEEvent, TextFinal
from vagent_shared.telemetry import instrumented, setup_tracing, tracing_wanted

PM, FB = "/api/v1/process_message", "/api/v1/submit_feedback"
ALICE = "@alice:localhost"
TOOLS = ["tool:search_documents", "tool:list_my_tickets", "tool:create_ticket"]
TICKET_KEY = yaml.safe_load((ROOT / "deploy/dev/credentials.yaml").read_text())["domains"]["localhost"][
    "resources"
]["tickets"]["users"][ALICE]
LLM_KEY = f"sk-otel-{secrets.token_hex(16)}"
#: A secret the user pastes into the message (an API key shape mask_secrets knows).
PASTED = f"sk-live-{secrets.token_hex(12)}"
#: The MCP server's token, in the query of the URL the graph reaches it by.
MCP_TOKEN = f"mcp-{secrets.token_hex(16)}"
SERVER, CLIENT = 2, 3


class Services:
    """The receiver, the credential registry and ticket service, an MCP server reached by a
    URL with a token in its query, and two graphs exporting to the receiver: `graph`
    (content off) and `capturing` (OTEL_CAPTURE_CONTENT=true, and the MCP server)."""

    def __init__(self, tmp: Path, redis_url: str, llm_url: str) -> None:
        self.receiver = OtlpReceiver()
        (tmp / "tickets.yaml").write_text((ROOT / "deploy/dev/tickets.yaml").read_text())
        self.registry = credential_registry(tmp)
        self.tickets = ticket_service(tmp, tmp / "tickets.yaml")
        lookup = tool("lookup", params={"name": "string"}, annotations={"readOnlyHint": True})
        self.mcp = McpTestServer({"name": "tokened", "tools": [lookup]}, tmp)
        agent = yaml.safe_load((ROOT / "graph/src/vagent_graph/agents/vagent.yaml").read_text())
        server = {"name": "tokened", "url": f"{self.mcp.url}?api_key={MCP_TOKEN}", "confirm": "never"}
        (tmp / "agent.yaml").write_text(yaml.safe_dump({**agent, "mcp_servers": [server]}))
        otel = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "CREDENTIAL_REGISTRY_URL": self.registry.base_url,
            "TICKETS_URL": self.tickets.base_url,
        }
        self.graph = GraphProcess(redis_url, tmp / "plain", llm_url, **otel)
        self.capturing = GraphProcess(
            redis_url,
            tmp / "capturing",
            llm_url,
            **otel,
            OTEL_CAPTURE_CONTENT="true",
            OTEL_SERVICE_NAME="vagent-graph-capturing",
            OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="",  # every instrumentation, Redis's too
            AGENT_DESCRIPTOR=str(tmp / "agent.yaml"),
        )
        for g in (self.graph, self.capturing):
            g.data_dir.mkdir(parents=True, exist_ok=True)
            g.env["OPENAI_API_KEY"] = LLM_KEY

    def start(self) -> Services:
        self.receiver.start()
        self.mcp.start()
        for p in (self.registry, self.tickets, self.graph, self.capturing):
            p.start()
        return self

    def stop(self) -> None:
        for p in (self.capturing, self.graph, self.tickets, self.registry):
            p.stop()
        self.mcp.stop()
        self.receiver.stop()


@pytest.fixture(scope="module")
def services(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str, _llm_session: ScriptedLLMServer
) -> Iterator[Services]:
    s = Services(tmp_path_factory.mktemp("otel"), redis_url, _llm_session.base_url).start()
    try:
        yield s
    finally:
        s.stop()


def traceparent() -> tuple[str, str, str]:
    """A caller's W3C trace context: (header, trace id, span id)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


async def send(graph: GraphProcess, path: str, body: dict[str, Any], parent: str) -> list[SSEEvent]:
    async with httpx.AsyncClient(base_url=graph.url, timeout=30) as c:
        return await post_sse(c, path, body, {**graph.headers, "traceparent": parent})


def ask(sid: SessionId, text: str) -> dict[str, Any]:
    return message_body(sid, text, ac(sid.user_id, TOOLS, domain="localhost"))


def one(spans: list[SpanRecord], name: str) -> SpanRecord:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, [s.name for s in spans])
    return found[0]


def children(spans: list[SpanRecord], parent: SpanRecord) -> list[SpanRecord]:
    return [s for s in spans if s.parent_id == parent.span_id]


def ended(receiver: OtlpReceiver, trace_id: str, *names: str) -> list[SpanRecord]:
    """The trace's spans once the server span and each of `names` arrived."""

    def complete(spans: list[SpanRecord]) -> bool:
        got = {s.name for s in spans if s.trace_id == trace_id}
        servers = ("POST /api/v1/process_message", "POST /api/v1/submit_feedback")
        return any({server, *names} <= got for server in servers)

    receiver.wait_for(complete)
    return receiver.trace(trace_id)


def is_redis(span: Any) -> bool:
    """A span of the redis instrumentation (either semantic-conventions generation)."""
    system = span.attributes.get("db.system", span.attributes.get("db.system.name", ""))
    return str(system) == "redis"


async def test_a_turn_continues_the_callers_trace_with_genai_spans_and_no_content_or_secret(
    services: Services, llm_server: ScriptedLLMServer
) -> None:
    receiver, graph = services.receiver, services.graph
    sid = new_session(ALICE)
    message = f"open a ticket: the printer is on fire, my key is {PASTED}"
    llm_server.push_tool_calls([("search_documents", {"query": "printer on fire"})])
    llm_server.push_tool_calls([("create_ticket", {"title": "Printer on fire", "priority": "high"})])
    header, trace_id, caller_span = traceparent()
    events = await send(graph, PM, ask(sid, message), header)
    question = next(e for e in events if isinstance(e, HitlRequest))

    spans = ended(receiver, trace_id, "invoke_agent vagent", "execute_tool create_ticket")
    server = one(spans, "POST /api/v1/process_message")
    assert (server.kind, server.parent_id, server.service) == (SERVER, caller_span, "vagent-graph")
    run = one(spans, "invoke_agent vagent")
    assert run.parent_id == server.span_id
    assert run.attributes["gen_ai.conversation.id"] == sid.format()
    assert run.attributes["vagent.run.outcome"] == "asked"
    chats = [s for s in spans if s.name == "chat test-model"]
    assert len(chats) == 2 and all(c.parent_id in {s.span_id for s in spans} for c in chats)
    for chat in chats:
        a = chat.attributes
        assert chat.kind == CLIENT
        assert (a["gen_ai.operation.name"], a["gen_ai.provider.name"]) == ("chat", "openai")
        assert (a["gen_ai.request.model"], a["gen_ai.response.model"]) == ("test-model", "test-model")
        assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
        assert a["gen_ai.response.finish_reasons"] == ["tool_calls"]
        # the openai SDK's own HTTP request (httpx2 instrumentation) is the call's child
        assert [c.name for c in children(spans, chat) if c.kind == CLIENT] == ["POST"]
    search = one(spans, "execute_tool search_documents")
    assert search.attributes["vagent.tool.source"] == "builtin"
    assert search.attributes["vagent.tool.outcome"] == "ok"
    retrieval = one(spans, "retrieval documents")
    assert retrieval.parent_id == search.span_id and "vagent.retrieval.results" in retrieval.attributes
    create = [s for s in spans if s.name == "execute_tool create_ticket"]
    # the confirmation is saved, then asked (the run pauses)
    assert [s.attributes["vagent.tool.outcome"] for s in create] == ["confirmation_needed", "asked"]
    assert all(s.attributes["gen_ai.tool.call.id"] for s in create)

    llm_server.push_text("Ticket created.")
    header2, trace2, _ = traceparent()
    events = await send(
        graph,
        FB,
        {"session_id": sid.format(), "response": "yes", "interrupt_id": question.interrupt_id},
        header2,
    )
    assert any(isinstance(e, TextFinal) for e in events)
    spans2 = ended(receiver, trace2, "credential fetch", "confirmation wait", "chat test-model")
    run2 = one(spans2, "invoke_agent vagent")
    assert run2.attributes["vagent.run.kind"] == "resume"
    assert run2.attributes["vagent.run.outcome"] == "answered"
    tool = one(spans2, "execute_tool create_ticket")
    assert tool.attributes["vagent.tool.outcome"] == "ok"
    assert tool.attributes["vagent.tool.decision"] == "allowed"
    wait = one(spans2, "confirmation wait")
    assert wait.parent_id == tool.span_id and wait.attributes["vagent.confirmation.outcome"] == "approved"
    assert wait.start_ns < run2.start_ns  # it began when the question was asked
    fetch = one(spans2, "credential fetch")
    assert fetch.parent_id == tool.span_id
    assert fetch.attributes["vagent.credential.resource"] == "tickets"
    assert fetch.attributes["vagent.credential.cache_hit"] is False
    assert any(c.kind == CLIENT for c in children(spans2, fetch))  # the registry call (httpx)
    assert one(spans2, "chat test-model").attributes["gen_ai.response.finish_reasons"] == ["stop"]

    # by default no Redis command spans (OTEL_PYTHON_DISABLED_INSTRUMENTATIONS unset: `redis`)
    assert not [s for s in receiver.trace(trace_id) + receiver.trace(trace2) if is_redis(s)]
    everything = "\n".join(s.raw for s in receiver.snapshot() if s.service == "vagent-graph")
    for content in ("printer is on fire", "Printer on fire", "Ticket created", "You are"):
        assert content not in everything, content
    for secret in (PASTED, LLM_KEY, TICKET_KEY, TOKEN):
        assert secret not in everything, secret[:10]
    # the logs written inside the request carry its trace id
    assert any(trace_id in line for line in graph.logs().splitlines())


async def test_with_capture_content_the_prompt_is_on_the_span_but_never_a_secret(
    services: Services, llm_server: ScriptedLLMServer
) -> None:
    receiver, graph = services.receiver, services.capturing
    llm_server.push_text("The printer is fine.")
    header, trace_id, _ = traceparent()
    await send(graph, PM, ask(new_session(ALICE), f"is the printer on fire? my key is {PASTED}"), header)
    spans = ended(receiver, trace_id, "chat test-model")
    chat = one(spans, "chat test-model")
    assert chat.service == "vagent-graph-capturing"
    sent = json.loads(chat.attributes["gen_ai.input.messages"])
    assert sent[0]["role"] == "system"
    user = sent[-1]
    assert user["role"] == "user" and "is the printer on fire?" in user["parts"][0]["content"]
    assert "The printer is fine." in chat.attributes["gen_ai.output.messages"]
    spans = receiver.trace(trace_id)
    # with every instrumentation switched on, Redis commands are spans too (arguments as `?`)
    assert [s for s in spans if is_redis(s)], "no Redis command span"
    everything = "\n".join(s.raw for s in spans)
    for secret in (PASTED, LLM_KEY, TOKEN):
        assert secret not in everything, secret[:10]


async def test_an_http_client_span_of_a_url_with_a_token_exports_no_token(
    services: Services, llm_server: ScriptedLLMServer
) -> None:
    """The MCP server's URL has its token in the query: the HTTP client spans of the call
    (httpx instrumentation) show scheme, host and path only, even with content captured."""
    receiver, graph = services.receiver, services.capturing
    llm_server.push_tool_calls([("tokened__lookup", {"name": "printer"})])
    llm_server.push_text("Found it.")
    header, trace_id, _ = traceparent()
    grants = [*TOOLS, "mcp_server:tokened"]
    body = message_body(new_session(ALICE), "look up the printer", ac(ALICE, grants, domain="localhost"))
    events = await send(graph, PM, body, header)
    assert any(isinstance(e, TextFinal) for e in events)
    assert services.mcp.calls()  # the tool was called, over that URL
    spans = ended(receiver, trace_id, "tools/call lookup", "chat test-model")
    where = f"127.0.0.1:{services.mcp.port}"
    posts = [s for s in spans if s.kind == CLIENT and where in str(s.attributes)]
    assert posts, [s.name for s in spans]
    for post in posts:
        urls = {k: v for k, v in post.attributes.items() if k in ("http.url", "url.full")}
        assert urls and set(urls.values()) == {services.mcp.url}, urls
    assert MCP_TOKEN not in "\n".join(s.raw for s in receiver.snapshot())


def test_without_an_endpoint_nothing_is_installed() -> None:
    assert not tracing_wanted({})
    assert not tracing_wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"})
    assert tracing_wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x"})
    # the standard switch to leave one maintained instrumentation out (or all of them)
    # unset: every one but redis (its ~15 command spans per turn cost +4% CPU, bench/README.md)
    assert instrumented("fastapi", {}) and not instrumented("redis", {})
    assert instrumented("redis", {"OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": ""})
    assert instrumented("redis", {"OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "x"})
    assert not instrumented("redis", {"OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "fastapi, redis"})
    assert not instrumented("httpx", {"OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "*"})
    assert setup_tracing("vagent-graph", env={"OTEL_SERVICE_NAME": "x"}) is None
