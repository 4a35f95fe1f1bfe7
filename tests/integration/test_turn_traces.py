"""The stored TurnTrace of a turn, through the real services: the graph, the development
Credential Registry and a scripted MCP server as processes, a scripted OpenAI-compatible LLM
and real Redis. One turn searches the documents, calls an MCP tool, is asked to confirm
another (answered "yes" in a second request) and calls a tool it was never offered; its
trace says all of it, `vagent trace` and `/admin/v1/traces` show it, and `vagent admin
forget` removes it."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from redis import Redis

from tests.support.factories import ac, message_body, new_session
from tests.support.graph_process import GraphProcess
from tests.support.llm_server import ScriptedLLMServer, TextResponse, ToolCallResponse
from tests.support.mcp_server import McpTestServer, tool
from tests.support.procs import BIN, credential_registry
from tests.support.sse import post_sse
from vagent_shared import redis_keys
from vagent_shared.events import HitlRequest, SSEEvent, TextFinal, TurnStarted
from vagent_shared.readers import DocRef, ResultScope
from vagent_shared.traces import TurnTrace

PM, FB = "/api/v1/process_message", "/api/v1/submit_feedback"
ADMIN = "admin-token-for-traces-51a7"
ADMIN_AUTH = {"Authorization": f"Bearer {ADMIN}"}
DOMAIN = "localhost"
ALICE = "@alice:localhost"
GRANTS = ["tool:search_documents", "mcp_server:calendar", "document_category:finance"]
REPORT = "# Q3 report\n\nQ3 revenue was 18.4 million EUR, code FIN-Q3-2026, margin 21 percent.\n"


class Stack:
    def __init__(self, tmp: Path, redis_url: str, llm_url: str) -> None:
        self.tmp, self.redis_url = tmp, redis_url
        self.registry = credential_registry(tmp)
        tools = [
            tool("lookup", params={"name": "string"}, annotations={"readOnlyHint": True}),
            tool("note", params={"title": "string", "api_key": "string?"}),
        ]
        self.mcp = McpTestServer({"name": "calendar", "tools": tools}, tmp)
        agent = tmp / "agent.yaml"
        agent.write_text(
            yaml.safe_dump(
                {
                    "id": "vagent",
                    "name": "vagent",
                    "system_prompt": "You help.",
                    "tools": ["search_documents"],
                    "mcp_servers": [
                        {
                            "name": "calendar",
                            "url": self.mcp.url,
                            "credential": "user",
                            "trust_annotations": True,  # `lookup` is read-only: it runs directly
                            "confirm_tools": ["note"],
                        }
                    ],
                }
            )
        )
        index = f"trace_docs_{uuid.uuid4().hex[:8]}"
        self.graph = GraphProcess(
            redis_url,
            tmp,
            llm_url,
            AGENT_DESCRIPTOR=str(agent),
            GRAPH_ADMIN_TOKEN=ADMIN,
            DOCS_INDEX=index,
            ENTITY_GRAPH=f"{index}_kg",
            CREDENTIAL_REGISTRY_URL=self.registry.base_url,
            CREDENTIAL_CACHE_KEY="yGJ0y8Hnq2rXx0wz8wq7C0v8m7a1d0yqzJm6c1N3p2k=",
            TRACE_TTL_SECONDS="3600",
        )

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.graph.url, timeout=60)

    def vagent(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "vagent"), *args],
            env={**os.environ, "REDIS_URL": self.redis_url},
            capture_output=True,
            text=True,
            timeout=60,
        )


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str, _llm_session: ScriptedLLMServer
) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("traces"), redis_url, _llm_session.base_url)
    with s.mcp:
        s.registry.start()
        try:
            s.graph.start()
            try:
                put = httpx.put(
                    f"{s.graph.url}/admin/v1/documents/{DOMAIN}/q3-report",
                    content=REPORT,
                    params={"category": "finance"},
                    headers={**ADMIN_AUTH, "Content-Type": "text/markdown"},
                    timeout=120,
                )
                assert put.status_code == 201, put.text
                yield s
            finally:
                s.graph.stop()
        finally:
            s.registry.stop()


def the_turn_event(events: list[SSEEvent]) -> str:
    assert isinstance(events[0], TurnStarted), events[:2]
    assert sum(isinstance(e, TurnStarted) for e in events) == 1
    return events[0].turn_id


async def test_a_turn_with_search_mcp_confirmation_and_a_denied_tool_is_traced_and_forgotten(
    stack: Stack, llm_server: ScriptedLLMServer, redis_url: str
) -> None:
    sid = new_session(ALICE)
    key = f"sk-proj-{secrets.token_hex(20)}"
    llm_server.push(
        ToolCallResponse([("search_documents", {"query": "Q3 revenue"})]),
        ToolCallResponse([("calendar__lookup", {"name": "finance"})]),
        ToolCallResponse([("calendar__note", {"title": f"revenue {key}", "api_key": key})]),
    )
    body = message_body(sid, "What was the Q3 revenue? Note it.", ac(ALICE, GRANTS, domain=DOMAIN))
    async with stack.client() as c:
        asked = await post_sse(c, PM, body, stack.graph.headers, keep_turn=True)
        turn_id = the_turn_event(asked)
        question = next(e for e in asked if isinstance(e, HitlRequest))
        # the answer: yes; then the model calls a tool it was never offered, then answers
        llm_server.push(
            ToolCallResponse([("delete_records", {"where": "1=1"})]),
            TextResponse("Q3 revenue was 18.4 million EUR [1]; noted.", chunks=3),
        )
        feedback = {"session_id": sid.format(), "response": "yes", "interrupt_id": question.interrupt_id}
        answered = await post_sse(c, FB, feedback, stack.graph.headers, keep_turn=True)
    assert the_turn_event(answered) == turn_id  # the resume continues the same turn
    assert any(isinstance(e, TextFinal) and "18.4 million" in e.content for e in answered)

    redis = Redis.from_url(redis_url)
    raw = redis.get(redis_keys.trace_turn(turn_id))
    assert isinstance(raw, bytes)
    assert key.encode() not in raw  # scrubbed as the audit trail scrubs: no secret stored
    t = TurnTrace.model_validate_json(raw)
    assert (t.outcome, t.user_id, t.tenant, t.group) == ("answered", ALICE, DOMAIN, False)
    assert t.session_id == sid.format()
    assert t.question == "What was the Q3 revenue? Note it."  # the question, not the "yes"
    assert t.total_ms > 0 and t.first_token_ms is not None and t.ended_at is not None

    # every model call, with the usage the provider reported and its first token
    assert [c.purpose for c in t.llm_calls] == ["tools", "tools", "tools", "tools", "answer"]
    assert all(c.input_tokens and c.output_tokens and c.first_token_ms is not None for c in t.llm_calls)
    assert t.llm_calls[-1].finish_reason == "stop" and t.input_tokens > 0

    # every tool call: one entry each, the confirmation updated in place by the resume
    calls = {c.name: c for c in t.tool_calls}
    assert list(calls) == ["search_documents", "calendar__lookup", "calendar__note", "delete_records"]
    search, lookup, note, denied = calls.values()
    assert (search.source, search.decision, search.outcome, search.credential_used) == (
        "builtin",
        "allowed",
        "ok",
        False,
    )
    # free text is left out, as in the audit trail (AUDIT_INCLUDE_CONTENT=false)
    assert search.result_chars > 0 and search.arguments == {"query": "[omitted: 10 chars]"}
    assert (lookup.source, lookup.outcome, lookup.credential_used, lookup.confirmation_asked) == (
        "mcp:calendar",
        "ok",
        True,
        False,
    )
    assert note.confirmation_asked and note.confirmation_answer == "yes" and note.outcome == "ok"
    assert note.confirmation_seconds is not None and 0 <= note.confirmation_seconds < 60
    assert note.credential_used and note.call_id and note.arguments["api_key"] == "[REDACTED]"
    # an MCP tool's `title` is words someone wrote: its size only (OTEL_CAPTURE_CONTENT off)
    assert note.arguments["title"] == f"[omitted: {len('revenue ' + key)} chars]"
    assert (denied.decision, denied.outcome, denied.arguments) == ("denied", "denied", {})

    # the document the search found, which the asker may read
    assert [(s.kind, s.id, s.title, s.room_may_see) for s in t.sources] == [
        ("document", "q3-report", "Q3 report", True)
    ]
    # what decides who may be told about each (the 🔍 account judges it when asked for)
    q3 = ResultScope(domain=DOMAIN, documents=(DocRef(doc_id="q3-report", category="finance"),))
    assert t.sources[0].scope == q3 and search.scope == q3
    assert lookup.scope == note.scope == ResultScope(personal_to=ALICE)  # with her own credential
    assert denied.scope == ResultScope()  # it never ran: derived from nothing

    # the bot's answer event points at the turn: operators find it by either id
    event_id = f"$answer-{uuid.uuid4().hex[:8]}"
    redis.set(redis_keys.trace_event(event_id), turn_id, ex=3600)
    shown = stack.vagent("trace", "show", event_id)
    assert shown.returncode == 0, shown.stderr
    assert f"Turn {turn_id}: answered" in shown.stdout and "calendar__note" in shown.stdout
    assert "confirmation asked, answered yes after" in shown.stdout and key not in shown.stdout
    as_json = stack.vagent("trace", "show", turn_id, "--json")
    assert TurnTrace.model_validate_json(as_json.stdout) == t
    listed = stack.vagent("trace", "list", "--user", ALICE, "--since", "1d", "--outcome", "answered")
    assert listed.returncode == 0 and turn_id in listed.stdout, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if turn_id in line)
    assert row.endswith("  What was the Q3 revenue? Note it.")  # which question it answered
    assert "question 'What was the Q3 revenue? Note it.'" in shown.stdout
    # (the Redis is shared with the other tests: other turns of hers may be denied ones)
    denied_turns = stack.vagent("trace", "list", "--user", ALICE, "--outcome", "denied", "--json")
    assert turn_id not in [d["turn_id"] for d in json.loads(denied_turns.stdout)]
    missing = stack.vagent("trace", "show", "$nothing-here")
    assert missing.returncode == 1 and "no trace for" in missing.stderr

    async with stack.client() as c:
        by_event = await c.get(f"/admin/v1/traces/{event_id}", headers=ADMIN_AUTH)
        assert by_event.status_code == 200 and TurnTrace.model_validate(by_event.json()) == t
        page = await c.get("/admin/v1/traces", params={"user": ALICE, "since": "1h"}, headers=ADMIN_AUTH)
        # (the Redis is shared with the other tests: she may have other turns in that hour)
        assert page.status_code == 200 and turn_id in [x["turn_id"] for x in page.json()]
        assert {x["user_id"] for x in page.json()} == {ALICE}
        unknown = await c.get("/admin/v1/traces/0123456789abcdef0123456789abcdef", headers=ADMIN_AUTH)
        assert unknown.status_code == 404 and unknown.json()["error_code"] == "no_such_trace"
        bad = await c.get("/admin/v1/traces", params={"outcome": "great"}, headers=ADMIN_AUTH)
        assert bad.status_code == 422 and bad.json()["error_code"] == "invalid_outcome"
        bad = await c.get("/admin/v1/traces", params={"since": "yesterday"}, headers=ADMIN_AUTH)
        assert bad.status_code == 422 and bad.json()["error_code"] == "invalid_since"
        bad = await c.get("/admin/v1/traces", params={"user": "alice"}, headers=ADMIN_AUTH)
        assert bad.status_code == 422 and bad.json()["error_code"] == "invalid_user"
        assert (await c.get("/admin/v1/traces", headers=stack.graph.headers)).status_code == 401

    forgot = stack.vagent("admin", "forget", ALICE)
    assert forgot.returncode == 0, forgot.stderr
    assert "trace_turn" in forgot.stdout and "whose name mentions" not in forgot.stdout
    left = [k for k in redis.scan_iter(match="trace:*") if turn_id.encode() in k]
    assert left == [] and redis.get(redis_keys.trace_event(event_id)) is None
    assert redis.zscore(redis_keys.TRACES_ALL, turn_id) is None
    assert not redis.exists(redis_keys.trace_user(ALICE), redis_keys.trace_session(sid.format()))
    gone = stack.vagent("trace", "show", turn_id)
    assert gone.returncode == 1


async def test_refused_and_declined_turns_are_on_record_as_such(
    stack: Stack, llm_server: ScriptedLLMServer, redis_url: str
) -> None:
    """Only refusals: `denied`. A "no" through the JSON-ack path: the call `declined`."""
    bob = "@bob:localhost"
    sid = new_session(bob)
    llm_server.push(
        ToolCallResponse([("delete_records", {"where": "1=1"})]),
        TextResponse("You lack access to that."),
    )
    password = "Zq8-vault-Pw-Kx31"
    # ~15 500 characters, a password among the first 80
    message = f"delete everything, my password is {password}\n" + "and then some " * 1100
    body = message_body(sid, message, ac(bob, GRANTS, domain=DOMAIN))
    async with stack.client() as c:
        denied = await post_sse(c, PM, body, stack.graph.headers, keep_turn=True)
        refused = trace_of(redis_url, the_turn_event(denied))
        assert refused.outcome == "denied"
        # what a trace keeps of a message: its start, on one line, the password masked
        assert refused.question.startswith("delete everything, my [REDACTED] and then some and")
        assert len(refused.question) == 80 and password not in refused.question
        raw = Redis.from_url(redis_url).get(redis_keys.trace_turn(refused.turn_id))
        assert isinstance(raw, bytes) and password.encode() not in raw

        llm_server.push(ToolCallResponse([("calendar__note", {"title": "x"})]))
        asked = await post_sse(c, PM, {**body, "message": "note x"}, stack.graph.headers, keep_turn=True)
        turn_id = the_turn_event(asked)
        assert trace_of(redis_url, turn_id).outcome == "asked"
        llm_server.push(TextResponse("Not noted."))
        ack = await c.post(
            FB,
            json={"session_id": sid.format(), "response": "no"},
            headers={**stack.graph.headers, "Accept": "application/json"},
        )
        assert ack.status_code == 200 and ack.json()["message"] == "Not noted.", ack.text
    t = trace_of(redis_url, turn_id)
    assert t.outcome == "answered" and len(t.tool_calls) == 1
    note = t.tool_calls[0]
    assert (note.outcome, note.confirmation_answer, note.credential_used) == ("declined", "no", False)
    assert note.confirmation_seconds is not None


def trace_of(redis_url: str, turn_id: str) -> TurnTrace:
    raw = Redis.from_url(redis_url).get(redis_keys.trace_turn(turn_id))
    assert raw is not None
    return TurnTrace.model_validate_json(raw)
