"""Per-user credentials through the real services: the graph, the development Credential
Registry and the ticket service as processes, a scripted OpenAI-compatible LLM, real Redis.

The ticket service records the SHA-256 of the key each request carried, so the tests see
whose key arrived without it storing keys.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

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
    """The registry, the ticket service and the graph, each a real process.

    Why `reset` and `variant`: starting the three costs seconds, so a module shares one stack
    (each test with its own sessions and reads) and a test needing another graph configuration
    starts only a graph of its own."""

    def __init__(self, tmp: Path, redis_url: str, llm_url: str, **graph_env: str) -> None:
        seed = tmp / "tickets.yaml"
        shutil.copy(ROOT / "deploy/dev/tickets.yaml", seed)
        self.registry = credential_registry(tmp)
        self.tickets = ticket_service(tmp, seed)
        self.tickets_url = self.tickets.base_url
        self.stream = f"audit:test:{uuid.uuid4().hex[:8]}"
        self.redis_url, self.llm_url, self.graph_env = redis_url, llm_url, graph_env
        self.graph = self.new_graph(tmp)
        self.events: list[SSEEvent] = []
        self.owns_services = True

    def new_graph(self, tmp: Path, **graph_env: str) -> GraphProcess:
        """A graph (not started) using this stack's registry and ticket service, with this
        stack's extra environment and then `graph_env`."""
        return GraphProcess(
            self.redis_url,
            tmp,
            self.llm_url,
            CREDENTIAL_REGISTRY_URL=self.registry.base_url,
            CREDENTIAL_CACHE_KEY="yGJ0y8Hnq2rXx0wz8wq7C0v8m7a1d0yqzJm6c1N3p2k=",
            CREDENTIAL_MISSING_HELP=HELP,
            TICKETS_URL=self.tickets_url,
            AUDIT_STREAM=self.stream,
            **{**self.graph_env, **graph_env},
        )

    def start(self) -> Stack:
        self.registry.start()
        self.tickets.start()
        self.graph.start()
        return self

    def stop(self) -> None:
        """Stop the graph, and the registry and ticket service unless shared (a variant)."""
        for p in (self.graph, self.tickets, self.registry) if self.owns_services else (self.graph,):
            p.stop()

    def reset(self) -> Stack:
        """Ready for the next test sharing this stack: every process up (a test may have stopped
        the registry or killed the graph) and the ticket service's request record emptied."""
        for p in (self.registry, self.tickets, self.graph):
            if not p.running:
                p.start()
        httpx.delete(f"{self.tickets_url}/debug/requests").raise_for_status()
        return self

    def variant(self, tmp: Path, **graph_env: str) -> Stack:
        """This stack's registry and ticket service with a started graph of its own, configured
        with `graph_env` too; its `stop` stops only that graph."""
        other = copy.copy(self)
        other.graph = self.new_graph(tmp, **graph_env).start()
        other.events = []
        other.owns_services = False
        return other

    async def send(self, path: str, body: dict[str, Any]) -> list[SSEEvent]:
        async with httpx.AsyncClient(base_url=self.graph.url, timeout=30) as c:
            events = await post_sse(c, path, body, self.graph.headers)
        self.events += events
        return events

    async def ask(self, sid: SessionId, text: str) -> list[SSEEvent]:
        return await self.send(PM, message_body(sid, text, ac(sid.user_id, TICKET_TOOLS, domain=DOMAIN)))

    def received(self) -> list[dict[str, Any]]:
        return list(httpx.get(f"{self.tickets_url}/debug/requests").json()["requests"])


@pytest.fixture(scope="module")
def module_stack(
    redis_url: str, _llm_session: ScriptedLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """One stack for the module: the tests use their own sessions and read only what they did."""
    s = Stack(tmp_path_factory.mktemp("credentials"), redis_url, _llm_session.base_url).start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def stack(module_stack: Stack, llm_server: ScriptedLLMServer) -> Stack:
    """The module's stack, reset for this test (the LLM is emptied by `llm_server`)."""
    return module_stack.reset()


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
    before = await counter(stack.graph.url, "vagent_graph_credential_fetches_total", "outcome")
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
    after = await counter(stack.graph.url, "vagent_graph_credential_fetches_total", "outcome")
    fetches = {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}
    assert fetches == {"missing": 1.0, "denied": 1.0, "unavailable": 1.0}  # this test's, no other


async def test_a_model_cannot_reach_a_ticket_tool_it_was_not_offered(
    stack: Stack, llm_server: ScriptedLLMServer
) -> None:
    log_start = len(stack.graph.logs())  # the module's graph: read only what this test logged
    llm_server.push_tool_calls([("create_ticket", {"title": "sneaky"})])
    llm_server.push_text("Denied.")
    sid = new_session(ALICE)
    await stack.send(PM, message_body(sid, "hi", ac(ALICE, ["tool:list_my_tickets"], domain=DOMAIN)))
    assert tool_result(llm_server) == "I can't do that here."
    offered = [t["function"]["name"] for t in llm_server.requests[-2].get("tools", [])]
    assert offered == ["list_my_tickets"]
    assert stack.received() == []  # and no credential was fetched for it either
    assert "credential_access" not in stack.graph.logs()[log_start:]


async def metrics_text(url: str) -> str:
    async with httpx.AsyncClient() as c:
        return (await c.get(f"{url}/metrics")).text


async def counter(url: str, name: str, label: str) -> dict[str, float]:
    """The counter `name` by the value of `label`. Why: the module's graph counts every test's
    calls, so a test compares its before and after."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(await metrics_text(url)):
        for sample in family.samples:
            if sample.name == name:
                key = sample.labels[label]
                values[key] = values.get(key, 0.0) + sample.value
    return values


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
    size = stack.graph.log_path.stat().st_size
    try:
        plant(stack.graph.log_path, json.dumps({"event": "oops", "key": KEYS[ALICE]}))
        found = secret_leaks({"graph log": stack.graph.logs()}, secrets)
        assert found == [f"graph log: {KEYS[ALICE][:12]}…"]
    finally:  # the log is the module's graph's: leave no planted secret for later tests
        os.truncate(stack.graph.log_path, size)


async def test_an_audit_stream_that_cannot_be_written_fails_no_request(
    stack: Stack, llm_server: ScriptedLLMServer, redis_url: str
) -> None:
    from redis.asyncio import Redis

    redis = Redis.from_url(redis_url)
    log_start = len(stack.graph.logs())
    before = await counter(stack.graph.url, "vagent_graph_audit_write_failures_total", "reason")
    try:
        await redis.set(stack.stream, "not a stream")  # every XADD now fails with WRONGTYPE
        llm_server.push_tool_calls([("list_my_tickets", {})])
        llm_server.push_text("Your tickets.")
        events = await stack.ask(new_session(ALICE), "what are my open tickets?")
        assert kinds(events)[-2:] == ["text_final", "done"]
        assert "VPN drops every hour" in tool_result(llm_server)
        after = await counter(stack.graph.url, "vagent_graph_audit_write_failures_total", "reason")
        failures = sum(after.values()) - sum(before.values())
        assert failures >= 3, (before, after)
        logged = stack.graph.logs()[log_start:].replace(" ", "")
        assert '"event_type":"credential_access"' in logged  # still logged
    finally:
        await redis.delete(stack.stream)
        await redis.aclose()
