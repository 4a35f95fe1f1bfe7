"""Per-user credentials through the real services: the graph, the development Credential
Registry and the ticket service as processes, a scripted OpenAI-compatible LLM, real Redis.

The ticket service records the SHA-256 of the key each request carried, so the tests see
whose key arrived without it storing keys.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.factories import ac, message_body, new_session
from tests.support.graph_process import GraphProcess
from tests.support.llm_server import ScriptedLLMServer
from tests.support.procs import ROOT, credential_registry, ticket_service
from tests.support.redis_dump import dump_redis
from tests.support.sse import kinds, post_sse
from vagent_shared import SessionId
from vagent_shared.events import HitlRequest, SSEEvent

PM, FB = "/api/v1/process_message", "/api/v1/submit_feedback"
DOMAIN = "localhost"
TICKET_TOOLS = ["tool:list_my_tickets", "tool:create_ticket"]
POLICY = yaml.safe_load((ROOT / "deploy/dev/credentials.yaml").read_text())
KEYS: dict[str, str] = POLICY["domains"][DOMAIN]["resources"]["tickets"]["users"]
ALICE, BOB, CAROL, DAVE = (f"@{n}:localhost" for n in ("alice", "bob", "carol", "dave"))
HELP = "Ask Kim in IT for a ticket key."


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class Stack:
    """The registry, the ticket service and the graph, each a real process."""

    def __init__(self, tmp: Path, redis_url: str, llm_url: str, **graph_env: str) -> None:
        seed = tmp / "tickets.yaml"
        shutil.copy(ROOT / "deploy/dev/tickets.yaml", seed)
        self.registry = credential_registry(tmp)
        self.tickets = ticket_service(tmp, seed)
        self.tickets_url = self.tickets.base_url
        self.stream = f"audit:test:{uuid.uuid4().hex[:8]}"
        self.graph = GraphProcess(
            redis_url,
            tmp,
            llm_url,
            CREDENTIAL_REGISTRY_URL=self.registry.base_url,
            CREDENTIAL_CACHE_KEY="yGJ0y8Hnq2rXx0wz8wq7C0v8m7a1d0yqzJm6c1N3p2k=",
            CREDENTIAL_MISSING_HELP=HELP,
            TICKETS_URL=self.tickets_url,
            AUDIT_STREAM=self.stream,
            **graph_env,
        )
        self.events: list[SSEEvent] = []

    def start(self) -> Stack:
        self.registry.start()
        self.tickets.start()
        self.graph.start()
        return self

    def stop(self) -> None:
        for p in (self.graph, self.tickets, self.registry):
            p.stop()

    async def send(self, path: str, body: dict[str, Any]) -> list[SSEEvent]:
        async with httpx.AsyncClient(base_url=self.graph.url, timeout=30) as c:
            events = await post_sse(c, path, body, self.graph.headers)
        self.events += events
        return events

    async def ask(self, sid: SessionId, text: str) -> list[SSEEvent]:
        return await self.send(PM, message_body(sid, text, ac(sid.user_id, TICKET_TOOLS, domain=DOMAIN)))

    def received(self) -> list[dict[str, Any]]:
        return list(httpx.get(f"{self.tickets_url}/debug/requests").json()["requests"])


@pytest.fixture
def stack(tmp_path: Path, redis_url: str, llm_server: ScriptedLLMServer) -> Iterator[Stack]:
    s = Stack(tmp_path, redis_url, llm_server.base_url).start()
    try:
        yield s
    finally:
        s.stop()


def tool_result(llm: ScriptedLLMServer, request: int = -1) -> str:
    return str([m for m in llm.requests[request]["messages"] if m["role"] == "tool"][-1]["content"])


async def test_two_users_two_keys_across_a_confirmation_and_a_restart(
    stack: Stack, llm_server: ScriptedLLMServer
) -> None:
    alice, bob = new_session(ALICE), new_session(BOB)
    questions: dict[str, HitlRequest] = {}
    for sid, title in ((alice, "Printer on fire"), (bob, "Monitor flickers")):
        llm_server.push_tool_calls([("create_ticket", {"title": title, "priority": "high"})])
        events = await stack.ask(sid, f"open a ticket: {title}")
        assert kinds(events) == ["hitl_request", "done"]
        q = events[0]
        assert isinstance(q, HitlRequest) and title in q.question
        questions[sid.user_id] = q
    assert stack.received() == []  # nothing reached the ticket service before a "yes"

    stack.graph.kill()  # the confirmations wait in Redis, not in the process
    stack.graph.start()

    for sid in (bob, alice):  # answered in the other order
        llm_server.push_text("Done.")
        q = questions[sid.user_id]
        events = await stack.send(
            FB, {"session_id": sid.format(), "response": "yes", "interrupt_id": q.interrupt_id}
        )
        assert kinds(events)[-2:] == ["text_final", "done"]
    created = [r for r in stack.received() if r["method"] == "POST"]
    assert [(r["owner"], r["key_sha256"], r["status"]) for r in created] == [
        (BOB, sha(KEYS[BOB]), 201),
        (ALICE, sha(KEYS[ALICE]), 201),
    ]

    for sid, mine, theirs in (
        (alice, "Printer on fire", "Monitor flickers"),
        (bob, "Monitor flickers", "Printer on fire"),
    ):
        llm_server.push_tool_calls([("list_my_tickets", {"status": "open"})])
        llm_server.push_text("Here they are.")
        await stack.ask(sid, "what are my open tickets?")
        listed = tool_result(llm_server)
        assert mine in listed and theirs not in listed
    gets = [r for r in stack.received() if r["method"] == "GET"]
    assert [r["key_sha256"] for r in gets] == [sha(KEYS[ALICE]), sha(KEYS[BOB])]


async def test_no_key_a_denied_user_and_a_registry_that_is_down(
    stack: Stack, llm_server: ScriptedLLMServer
) -> None:
    for user, expected in ((CAROL, "no credential is configured"), (DAVE, "Access denied")):
        llm_server.push_tool_calls([("list_my_tickets", {})])
        llm_server.push_text("Sorry.")
        await stack.ask(new_session(user), "what are my open tickets?")
        assert expected in tool_result(llm_server)
    assert HELP in str(llm_server.requests[-3]["messages"])  # carol was told what to do
    assert stack.received() == []  # neither call reached the ticket service

    stack.registry.stop()
    llm_server.push_tool_calls([("list_my_tickets", {})])
    llm_server.push_text("Later then.")
    events = await stack.ask(new_session(CAROL), "what are my open tickets?")
    assert "unavailable" in tool_result(llm_server) and kinds(events)[-1] == "done"
    fetches = {
        line.split('outcome="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in (await metrics_text(stack.graph.url)).splitlines()
        if line.startswith("vagent_graph_credential_fetches_total{")
    }
    assert fetches == {"missing": 1.0, "denied": 1.0, "unavailable": 1.0}


async def test_a_model_cannot_reach_a_ticket_tool_it_was_not_offered(
    stack: Stack, llm_server: ScriptedLLMServer
) -> None:
    llm_server.push_tool_calls([("create_ticket", {"title": "sneaky"})])
    llm_server.push_text("Denied.")
    sid = new_session(ALICE)
    await stack.send(PM, message_body(sid, "hi", ac(ALICE, ["tool:list_my_tickets"], domain=DOMAIN)))
    assert "Access denied" in tool_result(llm_server)
    offered = [t["function"]["name"] for t in llm_server.requests[-2].get("tools", [])]
    assert offered == ["list_my_tickets"]
    assert stack.received() == []  # and no credential was fetched for it either
    assert "credential_access" not in stack.graph.logs()


async def metrics_text(url: str) -> str:
    async with httpx.AsyncClient() as c:
        return (await c.get(f"{url}/metrics")).text


def plant(log: Path, line: str) -> None:
    with log.open("a") as f:
        f.write(line + "\n")


def secret_leaks(artifacts: dict[str, str], secrets: list[str]) -> list[str]:
    """Where any of `secrets` appears (the scan the next test trusts: proven able to fail)."""
    return [f"{where}: {s[:12]}…" for where, text in artifacts.items() for s in secrets if s in text]


async def test_no_credential_reaches_any_artifact_of_a_run(
    stack: Stack, llm_server: ScriptedLLMServer, redis_url: str
) -> None:
    alice = new_session(ALICE)
    llm_server.push_tool_calls([("create_ticket", {"title": "Badge broken", "description": "since Monday"})])
    q = (await stack.ask(alice, "open a ticket about my badge"))[0]
    assert isinstance(q, HitlRequest)
    stack.graph.kill()
    stack.graph.start()
    llm_server.push_text("Created.")
    await stack.send(FB, {"session_id": alice.format(), "response": "yes", "interrupt_id": q.interrupt_id})
    llm_server.push_tool_calls([("list_my_tickets", {"status": "all"})])
    llm_server.push_text("Listed.")
    await stack.ask(alice, "what are my tickets?")
    assert [r["owner"] for r in stack.received()] == [ALICE, ALICE]  # the key WAS used, twice

    artifacts = {
        "graph log": stack.graph.logs(),
        "LLM requests": json.dumps(llm_server.requests),
        "SSE events": json.dumps([e.model_dump(mode="json") for e in stack.events]),
        "metrics": await metrics_text(stack.graph.url),
        **{f"redis {k}": f"{k} {v}" for k, v in (await dump_redis(redis_url)).items()},
    }
    assert any(alice.user_id in v for k, v in artifacts.items() if k.startswith("redis checkpoint"))
    secrets = [KEYS[ALICE], KEYS[BOB]]
    assert secret_leaks(artifacts, secrets) == []

    # the scan can fail: a secret planted in a real log line of the service is found
    plant(stack.graph.log_path, json.dumps({"event": "oops", "key": KEYS[ALICE]}))
    assert secret_leaks({"graph log": stack.graph.logs()}, secrets) == [f"graph log: {KEYS[ALICE][:12]}…"]


async def test_an_audit_stream_that_cannot_be_written_fails_no_request(
    stack: Stack, llm_server: ScriptedLLMServer, redis_url: str
) -> None:
    from redis.asyncio import Redis

    redis = Redis.from_url(redis_url)
    try:
        await redis.set(stack.stream, "not a stream")  # every XADD now fails with WRONGTYPE
        llm_server.push_tool_calls([("list_my_tickets", {})])
        llm_server.push_text("Your tickets.")
        events = await stack.ask(new_session(ALICE), "what are my open tickets?")
        assert kinds(events)[-2:] == ["text_final", "done"]
        assert "VPN drops every hour" in tool_result(llm_server)
        failures = [
            line
            for line in (await metrics_text(stack.graph.url)).splitlines()
            if line.startswith("vagent_graph_audit_write_failures_total{")
        ]
        assert failures and float(failures[0].rsplit(" ", 1)[1]) >= 3, failures
        assert '"event_type":"credential_access"' in stack.graph.logs().replace(" ", "")  # still logged
    finally:
        await redis.delete(stack.stream)
        await redis.aclose()
