"""MCP tools through the real services: the graph, the development Credential Registry and the
demo calendar MCP server (`vagent-calendar`) as processes, a scripted OpenAI-compatible LLM,
real Redis. The calendar records, for every call, whose key it carried (its SHA-256), so the
tests see whose credential arrived without anything storing keys."""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from procutil import wait_until
from redis import Redis

from tests.integration.test_calendar_server import CalendarProcess, start_calendar
from tests.integration.test_credentials_flow import secret_leaks, tool_result
from tests.support.factories import ac, message_body, new_session
from tests.support.graph_process import GraphProcess
from tests.support.llm_server import JSON, PlannedResponse, ScriptedLLMServer, TextResponse, ToolCallResponse
from tests.support.procs import ROOT, credential_registry
from tests.support.redis_dump import dump_redis
from tests.support.sse import kinds, post_sse
from vagent_shared import SessionId
from vagent_shared.audit import AuditEvent
from vagent_shared.events import HitlRequest, SSEEvent

PM, FB = "/api/v1/process_message", "/api/v1/submit_feedback"
DOMAIN = "localhost"
POLICY = yaml.safe_load((ROOT / "deploy/dev/credentials.yaml").read_text())
KEYS: dict[str, str] = POLICY["domains"][DOMAIN]["resources"]["mcp:calendar"]["users"]
ALICE, BOB, CAROL, DAVE = (f"@{n}:localhost" for n in ("alice", "bob", "carol", "dave"))
CALENDAR = ["mcp_server:calendar"]
LIST, CREATE = "calendar__list_events", "calendar__create_event"


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class Stack:
    """The registry, the calendar and the graph (with the demo agent of deploy/dev), each a
    real process; one for the module (`reset` between tests), since starting them costs seconds."""

    def __init__(self, tmp: Path, redis_url: str, llm_url: str) -> None:
        self.registry = credential_registry(tmp)
        self.calendar: CalendarProcess = start_calendar(tmp)
        self.stream = f"audit:test:{uuid.uuid4().hex[:8]}"
        self.graph = GraphProcess(
            redis_url,
            tmp,
            llm_url,
            AGENT_DESCRIPTOR=str(ROOT / "deploy/dev/agent.yaml"),
            CALENDAR_MCP_URL=self.calendar.mcp_url,
            CREDENTIAL_REGISTRY_URL=self.registry.base_url,
            CREDENTIAL_CACHE_KEY="yGJ0y8Hnq2rXx0wz8wq7C0v8m7a1d0yqzJm6c1N3p2k=",
            AUDIT_STREAM=self.stream,
            MCP_REFRESH_SECONDS="2",
        )
        self.events: list[SSEEvent] = []

    def start(self) -> Stack:
        self.registry.start()
        self.graph.start()
        return self

    def stop(self) -> None:
        for p in (self.graph, self.calendar, self.registry):
            p.stop()

    def reset(self) -> Stack:
        """Ready for the next test: every process up (a test may have stopped the registry or
        the calendar, or killed the graph), the graph seeing the calendar again and the
        calendar's request record emptied."""
        for p in (self.registry, self.calendar, self.graph):
            if not p.running:
                p.start()
        httpx.delete(self.calendar.url + "/debug/requests").raise_for_status()
        if not wait_until(self.calendar_up, 30):
            raise TimeoutError(f"the graph does not see the calendar:\n{self.graph.logs()[-3000:]}")
        return self

    def calendar_up(self) -> bool:
        try:
            health = httpx.get(f"{self.graph.url}/health", timeout=5).json()
        except httpx.HTTPError:
            return False
        return bool(health.get("mcp_servers", {}).get("calendar", {}).get("up"))

    async def send(self, path: str, body: dict[str, Any]) -> list[SSEEvent]:
        async with httpx.AsyncClient(base_url=self.graph.url, timeout=60) as c:
            events = await post_sse(c, path, body, self.graph.headers)
        self.events += events
        return events

    async def ask(self, sid: SessionId, text: str, grants: list[str] = CALENDAR) -> list[SSEEvent]:
        return await self.send(PM, message_body(sid, text, ac(sid.user_id, grants, domain=DOMAIN)))

    async def get(self, path: str) -> httpx.Response:
        async with httpx.AsyncClient(base_url=self.graph.url, timeout=30) as c:
            return await c.get(path)

    async def calls(self, tool: str | None = None) -> list[dict[str, Any]]:
        return [r for r in await self.calendar.requests() if tool is None or r["tool"] == tool]


@pytest.fixture(scope="module")
def module_stack(
    redis_url: str, _llm_session: ScriptedLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """One stack for the module: the tests use their own sessions and read only what they did."""
    s = Stack(tmp_path_factory.mktemp("mcp"), redis_url, _llm_session.base_url).start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def stack(module_stack: Stack, llm_server: ScriptedLLMServer) -> Stack:
    """The module's stack, reset for this test (the LLM is emptied by `llm_server`)."""
    return module_stack.reset()


async def test_offered_only_with_the_grant_and_never_reached_without_it(
    stack: Stack, llm_server: ScriptedLLMServer, redis_url: str
) -> None:
    alice, carol = new_session(ALICE), new_session(CAROL)
    llm_server.push_text("Hi.")
    await stack.ask(alice, "hello")
    assert {LIST, CREATE, "calendar__find_free_slot"} <= set(llm_server.offered_tool_names())
    one = ["tool:calendar__list_events"]
    llm_server.push_text("Hi.")
    await stack.ask(new_session(BOB), "hello", one)
    assert [n for n in llm_server.offered_tool_names() if n.startswith("calendar__")] == [LIST]
    # carol has no grant: never offered, and a model that calls the tool anyway is refused
    # before anything reaches the server
    llm_server.push_tool_calls(
        [(CREATE, {"title": "x", "start": "2026-12-01T10:00", "end": "2026-12-01T11:00"})]
    )
    llm_server.push_text("Denied.")
    await stack.ask(carol, "book something", ["tool:search_documents"])
    assert not [n for n in llm_server.offered_tool_names(-2) if n.startswith("calendar__")]
    assert tool_result(llm_server) == "I can't do that here."  # never the tool's name
    assert await stack.calls() == []
    with Redis.from_url(redis_url) as r:
        entries: list[tuple[bytes, dict[bytes, bytes]]] = r.xrange(stack.stream)  # type: ignore[assignment]
    mine = {alice.format(), carol.format()}  # the stream is the module's: this test's sessions only
    events = [e for _, fields in entries if (e := AuditEvent.from_stream(fields)).session_id in mine]
    offered = [e for e in events if e.event_type == "tool_offered" and e.user_id == ALICE]
    assert offered and offered[0].metadata["mcp_servers"] == ["calendar"]
    (denied,) = [e for e in events if e.event_type == "access_denied" and e.user_id == CAROL]
    assert denied.resource == "tool:calendar__create_event" and denied.reason == "tool_not_granted"
    assert denied.metadata == {"mcp_server": "calendar"}


async def test_each_call_carries_its_own_users_key_under_concurrency(
    stack: Stack, llm_server: ScriptedLLMServer
) -> None:
    def model(req: JSON) -> PlannedResponse:
        last = req["messages"][-1]
        return TextResponse("Listed.") if last["role"] == "tool" else ToolCallResponse([(LIST, {})])

    llm_server.set_default(model)
    users = [ALICE, BOB] * 26  # 52 interleaved calls
    results = await asyncio.gather(*(stack.ask(new_session(u), "what is on my calendar?") for u in users))
    assert all(kinds(r)[-1] == "done" for r in results)
    calls = await stack.calls(LIST.split("__")[1])
    assert len(calls) == len(users)
    assert {(c["owner"], c["key_sha256"]) for c in calls} == {
        (ALICE, sha(KEYS[ALICE])),
        (BOB, sha(KEYS[BOB])),
    }
    assert sum(c["owner"] == ALICE for c in calls) == 26
    # what the model read back was the asker's own calendar only
    seed = yaml.safe_load((ROOT / "deploy/dev/calendar.yaml").read_text())["events"]
    alice_title, bob_title = seed[ALICE][0]["title"], seed[BOB][0]["title"]
    for req in llm_server.requests:
        tool_msgs = [m for m in req["messages"] if m["role"] == "tool"]
        if not tool_msgs:
            continue
        text = str(tool_msgs[-1]["content"])
        user = next(str(m["content"]) for m in req["messages"] if m["role"] == "user")
        assert not (alice_title in text and bob_title in text), user


async def test_no_credential_a_denied_user_and_a_registry_that_is_down(
    stack: Stack, llm_server: ScriptedLLMServer
) -> None:
    """Each is told as for built-in tools, and the server is never called."""
    for user, told in ((CAROL, "no credential is configured"), (DAVE, "Access denied")):
        llm_server.push_tool_calls([(LIST, {})])
        llm_server.push_text("Sorry.")
        await stack.ask(new_session(user), "what is on my calendar?")  # granted, but no key
        assert told in tool_result(llm_server)
    stack.registry.stop()
    llm_server.push_tool_calls([(LIST, {})])
    llm_server.push_text("Later.")
    events = await stack.ask(new_session(CAROL), "what is on my calendar?")
    assert "unavailable" in tool_result(llm_server) and kinds(events)[-1] == "done"
    assert await stack.calls() == []


async def test_a_write_asks_first_and_yes_runs_it_once_across_a_restart(
    stack: Stack, llm_server: ScriptedLLMServer
) -> None:
    args = {
        "title": "Design review",
        "start": "2026-12-01T10:00",
        "end": "2026-12-01T11:00",
        "attendees": [BOB],
    }
    alice = new_session(ALICE)
    llm_server.push_tool_calls([(CREATE, args)])
    events = await stack.ask(alice, "book a design review with bob")
    assert kinds(events) == ["hitl_request", "done"]
    q = events[0]
    assert isinstance(q, HitlRequest)
    assert q.question.startswith("Book a calendar event (calendar server), in your name?\n"), q.question
    assert CREATE not in q.question  # the internal name is for the trace, not the question
    for shown in ("Design review", "2026-12-01T10:00", "2026-12-01T11:00", BOB):
        assert shown in q.question, shown
    assert await stack.calls("create_event") == []  # nothing before "yes"

    stack.graph.kill()
    stack.graph.start()
    llm_server.push_text("Booked.")
    events = await stack.send(
        FB, {"session_id": alice.format(), "response": "yes", "interrupt_id": q.interrupt_id}
    )
    assert kinds(events)[-2:] == ["text_final", "done"]
    created = await stack.calls("create_event")
    assert [(c["owner"], c["outcome"]) for c in created] == [(ALICE, "ok")]
    # answering again is refused and runs nothing
    async with httpx.AsyncClient(base_url=stack.graph.url, timeout=30) as c:
        again = await c.post(
            FB,
            json={"session_id": alice.format(), "response": "yes", "interrupt_id": q.interrupt_id},
            headers=stack.graph.headers,
        )
    assert again.json()["error_code"] == "no_pending_question"
    assert len(await stack.calls("create_event")) == 1

    bob = new_session(BOB)
    llm_server.push_tool_calls([(CREATE, {**args, "attendees": [ALICE]})])
    q2 = (await stack.ask(bob, "book it"))[0]
    assert isinstance(q2, HitlRequest)
    llm_server.push_text("Not booked.")
    await stack.send(FB, {"session_id": bob.format(), "response": "no", "interrupt_id": q2.interrupt_id})
    assert len(await stack.calls("create_event")) == 1  # "no" ran nothing


async def test_read_only_tools_run_directly_and_health_lists_the_server(
    stack: Stack, llm_server: ScriptedLLMServer
) -> None:
    llm_server.push_tool_calls([("calendar__find_free_slot", {"date": "2026-12-01"})])
    llm_server.push_text("Here.")
    events = await stack.ask(new_session(ALICE), "when am I free on 2026-12-01?")
    assert "hitl_request" not in kinds(events)
    assert [c["tool"] for c in await stack.calls()] == ["find_free_slot"]
    health = (await stack.get("/health")).json()
    assert health["status"] == "healthy"
    assert health["mcp_servers"]["calendar"] == {"up": True, "tools": 3, "reason": None}
    metrics = (await stack.get("/metrics")).text
    assert 'vagent_graph_mcp_servers_up{server="calendar"} 1.0' in metrics
    assert (
        'vagent_graph_tool_calls_total{decision="executed",tool="calendar__find_free_slot"}' in metrics
        or ('tool="calendar__find_free_slot"' in metrics)
    )


async def test_no_key_reaches_any_artifact(
    stack: Stack, llm_server: ScriptedLLMServer, redis_url: str
) -> None:
    alice = new_session(ALICE)
    llm_server.push_tool_calls([(LIST, {})])
    llm_server.push_text("Listed.")
    await stack.ask(alice, "what is on my calendar?")
    llm_server.push_tool_calls(
        [(CREATE, {"title": "x", "start": "2026-12-01T10:00", "end": "2026-12-01T10:30"})]
    )
    q = (await stack.ask(alice, "book x"))[0]
    assert isinstance(q, HitlRequest)
    llm_server.push_text("Done.")
    await stack.send(FB, {"session_id": alice.format(), "response": "yes", "interrupt_id": q.interrupt_id})
    artifacts = {
        "graph log": stack.graph.logs(),
        "llm requests": json.dumps(llm_server.requests),
        "sse events": json.dumps([e.model_dump(mode="json") for e in stack.events]),
        "redis": json.dumps(await dump_redis(redis_url)),
        "metrics": (await stack.get("/metrics")).text,
    }
    secrets = list(KEYS.values())
    assert secret_leaks(artifacts, secrets) == []
    # the scan can fail: a planted key is found
    planted = {**artifacts, "graph log": artifacts["graph log"] + secrets[0]}
    assert secret_leaks(planted, secrets) == [f"graph log: {secrets[0][:12]}…"]


async def test_a_server_down_at_startup_appears_without_a_restart(
    stack: Stack, llm_server: ScriptedLLMServer
) -> None:
    stack.calendar.stop()
    stack.graph.kill()
    stack.graph.start()  # the graph starts although its MCP server is down
    health = (await stack.get("/health")).json()
    assert health["status"] == "healthy" and health["mcp_servers"]["calendar"]["up"] is False
    llm_server.push_text("Hi.")
    await stack.ask(new_session(ALICE), "hello")
    assert not [n for n in llm_server.offered_tool_names() if n.startswith("calendar__")]
    stack.calendar.start()
    assert await asyncio.to_thread(wait_until, stack.calendar_up, 10), "the graph never saw the calendar"
    llm_server.push_text("Hi.")
    await stack.ask(new_session(ALICE), "hello")
    assert LIST in llm_server.offered_tool_names()
    # and down again mid-session: the model is told, the session stays usable
    stack.calendar.stop()
    llm_server.push_tool_calls([(LIST, {})])
    llm_server.push_text("It is down.")
    events = await stack.ask(new_session(ALICE), "what is on my calendar?")
    assert "unavailable right now" in tool_result(llm_server) and kinds(events)[-1] == "done"
