"""The graph service over real HTTP: auth, input errors, SSE contract, health, metrics."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.factories import ac, message_body, new_session
from tests.support.graph_process import TOKEN, GraphProcess
from tests.support.llm_server import ScriptedLLMServer
from tests.support.redis_dump import dump_redis
from tests.support.sse import kinds, parse_sse_text, post_sse
from vagent_shared.events import HitlRequest, TextChunk, TextFinal

PM = "/api/v1/process_message"
FB = "/api/v1/submit_feedback"


@pytest.fixture(scope="module")
def graph(
    redis_url: str, _llm_session: ScriptedLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GraphProcess]:
    with GraphProcess(
        redis_url,
        tmp_path_factory.mktemp("graph-api"),
        _llm_session.base_url,
        MAX_MESSAGE_CHARS="500",
        SSE_KEEPALIVE_SECONDS="0.3",
        # process_message may carry files: its body limit is MAX_REQUEST_BYTES plus 1 file
        # of this size as base64 (~1.45 MB in all), the tests below send 2 MB
        ATTACHMENT_MAX_BYTES="300000",
        ATTACHMENT_MAX_PER_TURN="1",
        # one text_chunk per model chunk: the tests below count events and writes (the
        # SSE write batching); the coalescing has its own tests (test_stream_coalescing.py)
        STREAM_COALESCE_MS="0",
    ) as g:
        yield g


@pytest.fixture
async def client(graph: GraphProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=graph.url, timeout=30) as c:
        yield c


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": "Bearer"},
        {"Authorization": f"bearer {TOKEN[:-1]}"},
    ],
)
async def test_api_refuses_missing_or_forged_tokens(
    client: httpx.AsyncClient, graph: GraphProcess, headers: dict[str, str], llm_server: ScriptedLLMServer
) -> None:
    body = message_body(new_session(), "hi", ac(superuser=True))
    before = await refusals(client)
    for path, payload in [
        (PM, body),
        (FB, {"session_id": body["session_id"], "response": "yes"}),
        ("/api/v1/reset_session", {"session_id": body["session_id"]}),
    ]:
        r = await client.post(path, json=payload, headers=headers)
        assert r.status_code == 401, (path, r.text)
        assert r.json()["error_code"] == "unauthorized"
        assert r.headers["www-authenticate"] == "Bearer"
    assert llm_server.requests == []  # nothing reached the LLM
    assert await refusals(client) == before + 3  # each one a security event...
    logged = [ln for ln in graph.log_records() if ln.get("event") == "security.bad_service_token"]
    assert logged[-1]["level"] == "warning" and logged[-1]["path"] == "/api/v1/reset_session"  # ...logged
    assert logged[-1]["auth_header_present"] == ("Authorization" in headers)
    assert TOKEN not in graph.logs()


async def refusals(client: httpx.AsyncClient) -> float:
    """The service's count of refused service tokens (Prometheus text)."""
    text = (await client.get("/metrics")).text
    found = re.search(r'^vagent_graph_security_events_total\{kind="bad_service_token"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


async def test_every_api_path_needs_the_token_even_one_no_route_matches(
    client: httpx.AsyncClient, graph: GraphProcess
) -> None:
    r = await client.post("/api/v1/not_a_route", json={})
    assert r.status_code == 401 and r.json()["error_code"] == "unauthorized"  # not a 404: no map
    assert (await client.post("/api/v1/not_a_route", json={}, headers=graph.headers)).status_code == 404
    # refused before the body is read: an unauthenticated client cannot make it buffer anything
    reader, writer = await asyncio.open_connection("127.0.0.1", graph.port)
    writer.write(
        f"POST {PM} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope\r\n"
        f"Content-Type: application/json\r\nContent-Length: {10**9}\r\n\r\n{{".encode()
    )
    status = await asyncio.wait_for(reader.readline(), 10)
    writer.close()
    assert status.startswith(b"HTTP/1.1 401"), status
    assert (await client.get("/health")).status_code == 200  # outside /api/: open


async def test_the_openapi_page_says_which_routes_need_the_token(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    assert spec["components"]["securitySchemes"]["GraphApiToken"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "GRAPH_API_TOKEN",
    }
    for path, operations in spec["paths"].items():
        for operation in operations.values():
            needs = operation.get("security") == [{"GraphApiToken": []}]
            assert needs == path.startswith("/api/"), path


async def test_sse_conversation_streams_chunks_then_final_then_done(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    text = "The answer is forty two, as everybody knows by now."
    llm_server.push_text(text)
    sid = new_session()
    events = await post_sse(client, PM, message_body(sid, "What is the answer?"), graph.headers)
    chunks = [e for e in events if isinstance(e, TextChunk)]
    assert len(chunks) > 5
    assert [c.chunk_index for c in chunks] == list(range(len(chunks)))
    assert "".join(c.content for c in chunks) == text
    assert kinds(events)[-2:] == ["text_final", "done"]
    assert events[-2] == TextFinal(content=text, is_final=True)
    # every log line of that request carries the session id
    logs = graph.log_records()
    ids = {ln["request_id"] for ln in logs if ln.get("session_id") == sid.format()}
    assert len(ids) == 1
    mine = [ln for ln in logs if ln.get("request_id") in ids]
    assert len(mine) >= 2 and all(ln["session_id"] == sid.format() for ln in mine)
    assert not any("What is the answer" in str(ln) for ln in logs if ln["level"] != "debug")


def stream_closed(graph: GraphProcess, sid: str) -> dict[str, Any]:
    """The service's one log line about how a stream of that session went."""
    [line] = [
        ln for ln in graph.log_records() if ln.get("event") == "stream_closed" and ln.get("session_id") == sid
    ]
    return line


async def test_a_fast_answer_goes_out_in_a_few_writes_each_event_in_its_own_frame(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    text = " ".join(f"w{i}" for i in range(40))
    llm_server.push_text(text, chunks=40)  # all at once: the chunks wait for the final answer
    sid = new_session()
    events = await post_sse(client, PM, message_body(sid, "Say it all"), graph.headers)
    n = len(events) - 2
    assert n >= 30 and kinds(events) == ["text_chunk"] * n + ["text_final", "done"]
    assert "".join(e.content for e in events if isinstance(e, TextChunk)) == text
    closed = stream_closed(graph, sid.format())
    assert closed["events"] == len(events) + 1  # and the `turn` event that opens it
    assert closed["writes"] < 10  # not one per event (SSE_FLUSH_INTERVAL_MS)


async def test_a_slow_answer_is_streamed_as_the_model_writes_it(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    llm_server.push_text("one two three four", chunks=4, delay=0.4)
    arrivals: list[tuple[str, float]] = []
    loop = asyncio.get_running_loop()
    body = message_body(new_session(), "slowly")
    async with client.stream("POST", PM, json=body, headers=graph.headers) as r:
        async for line in r.aiter_lines():
            if line.startswith('data: {"content"') and "chunk_index" in line:
                arrivals.append((line, loop.time()))
    assert len(arrivals) == 4
    # each piece arrived on its own, long before the next one was even written by the model
    gaps = [b[1] - a[1] for a, b in itertools.pairwise(arrivals)]
    assert all(g > 0.2 for g in gaps), gaps


async def test_a_stream_opens_while_the_model_thinks_and_gets_keep_alive_comments(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    llm_server.push_text("Finally.", chunks=1, delay=1.0)  # the model thinks for a second
    loop = asyncio.get_running_loop()
    start = loop.time()
    async with client.stream(
        "POST", PM, json=message_body(new_session(), "think"), headers=graph.headers
    ) as r:
        opened = loop.time() - start  # the response headers are in
        await r.aread()
    assert r.status_code == 200
    assert opened < 0.8  # not held back until the first token
    before_answer = r.text.split("event: text_chunk")[0]
    assert ": keep-alive" in before_answer  # SSE_KEEPALIVE_SECONDS=0.3 in this module
    assert kinds(parse_sse_text(r.text)) == ["text_chunk", "text_final", "done"]


async def test_progress_is_sent_while_a_tool_runs(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    llm_server.push_tool_calls([("database_query", {"sql": "SELECT COUNT(*) FROM records"})])
    llm_server.push_text("There are many.")
    events = await post_sse(client, PM, message_body(new_session(), "count"), graph.headers)
    assert kinds(events)[0] == "progress"
    assert events[0].content == "Running “database query”…"  # type: ignore[union-attr]
    assert llm_server.requests[-1]["messages"][-1]["content"].startswith("COUNT(*)")


@pytest.mark.parametrize(
    "mutate,code",
    [
        (lambda b: b.update(session_id="not-a-session"), "invalid_request"),
        (lambda b: b.update(room_id="!other:localhost"), "invalid_request"),
        (lambda b: b.update(user_id="@mallory:localhost"), "invalid_request"),
        (lambda b: b.update(message="   "), "empty_message"),
        (lambda b: b.update(message="x" * 501), "message_too_long"),
        (lambda b: b.update(ac_context={"userId": "@alice:localhost"}), "invalid_request"),
        (lambda b: b.update(ac_context={"activeRoles": "admin"}), "invalid_request"),
        (lambda b: b.pop("ac_context"), "invalid_request"),
        (lambda b: b.update(context={"k": {"nested": 1}}), "invalid_request"),
        (lambda b: b.update(attachments="report.pdf"), "invalid_request"),
        (lambda b: b.update(attachments=[{"name": "a.pdf", "data": "%%%not base64"}]), "invalid_request"),
        (lambda b: b.update(attachments=[{"name": "", "data": "YQ=="}]), "invalid_request"),
        (lambda b: b.update(attachments=[{"name": "a.pdf"}]), "invalid_request"),
        (lambda b: b.update(attachments=[{"name": "a", "data": "YQ=="}] * 2), "too_many_attachments"),
        (lambda b: b.update(attachments=[{"name": "a", "data": "YQ=="}] * 17), "invalid_request"),
        (lambda b: b.update(message="", attachments=[]), "empty_message"),
    ],
)
async def test_bad_input_gets_a_clear_4xx(
    client: httpx.AsyncClient, graph: GraphProcess, mutate: object, code: str, llm_server: ScriptedLLMServer
) -> None:
    body = message_body(new_session(), "hello")
    mutate(body)  # type: ignore[operator]
    r = await client.post(PM, json=body, headers=graph.headers)
    assert r.status_code == 422, r.text
    assert r.json()["error_code"] == code and r.json()["message"]
    assert llm_server.requests == []


async def test_garbage_bodies_are_4xx_not_500(client: httpx.AsyncClient, graph: GraphProcess) -> None:
    h = {**graph.headers, "content-type": "application/json"}
    for raw in [b"", b"{", b"[]", b"null", b'{"session_id": 5}', "ü\x00".encode(), b"\xff\xfe"]:
        r = await client.post(PM, content=raw, headers=h)
        assert r.status_code == 422, (raw, r.status_code)
        assert r.json()["error_code"] == "invalid_request" and r.json()["message"].startswith(
            ("body", "session_id")
        )
    r = await client.post(PM, content=b"x" * 2_000_000, headers=h)
    assert r.status_code == 413 and r.json()["error_code"] == "request_too_large"
    for raw in [b'{"session_id": "\xc3"}', b"\xff", b"[" * 5000 + b"]" * 5000]:  # not UTF-8, too deep
        r = await client.post(PM, content=raw, headers=h)
        assert r.status_code == 400 and r.json()["error_code"] == "bad_request", (raw[:20], r.text)
    r = await client.post(
        FB, json={"session_id": "!r:x:main:@a:x", "response": "y" * 20000}, headers=graph.headers
    )
    assert r.status_code == 422


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded", "json"])
async def test_a_body_that_is_not_json_by_its_content_type_is_a_clear_422(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer, content_type: str | None
) -> None:
    raw = json.dumps(message_body(new_session(), "hello")).encode()
    headers = {**graph.headers, **({"content-type": content_type} if content_type else {})}
    r = await client.post(PM, content=raw, headers=headers)
    assert r.status_code == 422, r.text
    assert r.json()["error_code"] == "invalid_request" and r.json()["message"].startswith("body")
    assert llm_server.requests == []


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "application/vnd.vagent+json"])
async def test_any_json_content_type_is_accepted(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer, content_type: str
) -> None:
    llm_server.push_text("Fine.")
    raw = json.dumps(message_body(new_session(), "hello")).encode()
    r = await client.post(PM, content=raw, headers={**graph.headers, "content-type": content_type})
    assert r.status_code == 200 and parse_sse_text(r.text)[-2] == TextFinal(content="Fine.", is_final=True)


async def test_feedback_with_nothing_pending_is_409(client: httpx.AsyncClient, graph: GraphProcess) -> None:
    r = await client.post(
        FB, json={"session_id": new_session().format(), "response": "yes"}, headers=graph.headers
    )
    assert r.status_code == 409 and r.json()["error_code"] == "no_pending_question"


async def test_feedback_for_a_stale_interrupt_id_is_409(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    sid = new_session()
    llm_server.push_tool_calls([("ask_user", {"question": "Color?"})])
    events = await post_sse(client, PM, message_body(sid, "paint"), graph.headers)
    assert isinstance(events[-2], HitlRequest)
    r = await client.post(
        FB,
        json={"session_id": sid.format(), "response": "red", "interrupt_id": "not-the-one"},
        headers=graph.headers,
    )
    assert r.status_code == 409 and r.json()["error_code"] == "stale_question"
    llm_server.push_text("Red it is.")
    r = await client.post(
        FB,
        json={"session_id": sid.format(), "response": "red", "interrupt_id": events[-2].interrupt_id},
        headers={**graph.headers, "accept": "application/json"},
    )
    assert r.status_code == 200 and r.json() == {"success": True, "message": "Red it is."}


async def test_an_answer_that_looks_like_a_secret_is_refused_and_the_question_stays(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer, redis_url: str
) -> None:
    """The bot refuses such answers first; a client calling the API directly is refused too,
    and the key reaches neither the checkpoint, the log nor the model."""
    sid = new_session()
    llm_server.push_tool_calls([("ask_user", {"question": "Please paste your API key."})])
    events = await post_sse(client, PM, message_body(sid, "connect my account"), graph.headers)
    assert isinstance(events[-2], HitlRequest)
    key = "live-key-7Qx2b9LmPz4Kw8Rt3Vn6"
    r = await client.post(FB, json={"session_id": sid.format(), "response": key}, headers=graph.headers)
    assert r.status_code == 422 and r.json()["error_code"] == "answer_looks_like_secret"
    assert key not in r.text
    llm_server.push_text("Understood.")
    answered = await post_sse(
        client, FB, {"session_id": sid.format(), "response": "I have none"}, graph.headers
    )
    assert kinds(answered)[-2:] == ["text_final", "done"]  # the question was still open
    assert not any(key in k + v for k, v in (await dump_redis(redis_url)).items())
    assert key not in graph.logs() and key not in str(llm_server.requests)


async def test_one_run_per_session_at_a_time(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    sid = new_session()
    llm_server.push_text("slow " * 20, delay=0.05)
    first = asyncio.create_task(post_sse(client, PM, message_body(sid, "one"), graph.headers))
    await asyncio.sleep(0.3)
    r = await client.post(PM, json=message_body(sid, "two"), headers=graph.headers)
    assert r.status_code == 409 and r.json()["error_code"] == "session_busy"
    other = await client.post(PM, json=message_body(new_session(), "three"), headers=graph.headers)
    assert other.status_code == 200  # other sessions are not blocked
    assert kinds(await first)[-1] == "done"


async def test_many_messages_at_once_for_one_session_run_exactly_one(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    """Ten messages of one session sent together: one is answered, nine get 409; the refused
    ones leave nothing behind (no lock, no run counted as active, no LLM call)."""
    sid = new_session()
    llm_server.push_text("Only once.", delay=0.05)
    bodies = [message_body(sid, f"message {i}") for i in range(10)]
    answers = await asyncio.gather(*(client.post(PM, json=b, headers=graph.headers) for b in bodies))
    codes = sorted(r.status_code for r in answers)
    assert codes == [200] + [409] * 9, codes
    assert all(r.json()["error_code"] == "session_busy" for r in answers if r.status_code == 409)
    [ok] = [r for r in answers if r.status_code == 200]
    assert parse_sse_text(ok.text)[-2] == TextFinal(content="Only once.", is_final=True)
    assert len(llm_server.requests) == 1
    health = (await client.get("/health")).json()
    assert health["active_sessions"] == 0
    mine = [ln for ln in graph.logs().splitlines() if sid.format() in ln]
    assert not [ln for ln in mine if '"level": "error"' in ln or "Traceback" in ln]  # refusals are quiet
    llm_server.push_text("Free again.")  # and the session is not left locked
    again = await client.post(PM, json=message_body(sid, "next"), headers=graph.headers)
    assert parse_sse_text(again.text)[-2] == TextFinal(content="Free again.", is_final=True)


async def test_client_disconnect_cancels_the_run_and_the_llm_request(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    llm_server.push_text("word " * 200, delay=0.05)
    sid = new_session()
    async with client.stream("POST", PM, json=message_body(sid, "long"), headers=graph.headers) as r:
        seen = 0
        async for line in r.aiter_lines():
            seen += line.startswith("event: text_chunk")
            if seen >= 3:
                break
    await asyncio.to_thread(llm_server.wait_for_streams, disconnected=1, timeout=5)
    assert llm_server.disconnected_streams == 1
    assert llm_server.completed_streams == 0
    # the session is free again within moments (not after the lock's TTL): no stale lock
    llm_server.push_text("Next answer.")
    for _ in range(60):
        r = await client.post(PM, json=message_body(sid, "next"), headers=graph.headers)
        if r.status_code != 409:
            break
        await asyncio.sleep(0.05)
    assert r.status_code == 200
    assert parse_sse_text(r.text)[-2] == TextFinal(content="Next answer.", is_final=True)


async def test_reset_forgets_the_conversation(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    sid = new_session()
    llm_server.push_text("Noted: your name is Ada.")
    await post_sse(client, PM, message_body(sid, "my name is Ada"), graph.headers)
    r = await client.post("/api/v1/reset_session", json={"session_id": sid.format()}, headers=graph.headers)
    assert r.status_code == 200 and r.json()["success"]
    llm_server.push_text("I don't know.")
    await post_sse(client, PM, message_body(sid, "what is my name?"), graph.headers)
    assert "Ada" not in str(llm_server.requests[-1]["messages"])


async def test_health_metrics_and_docs(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    r = await client.get("/health")
    assert r.status_code == 200
    h = r.json()
    assert h["status"] == "healthy" and h["active_sessions"] == 0 and h["uptime_seconds"] > 0
    first_events = 'vagent_graph_first_event_seconds_count{endpoint="process_message"}'
    before = metric_values((await client.get("/metrics")).text).get(first_events, 0.0)
    llm_server.push_tool_calls([("delete_records", {"older_than": "2016-01-01"})])
    await post_sse(client, PM, message_body(new_session(), "delete", ac(instances=[])), graph.headers)
    m = (await client.get("/metrics")).text
    for name in [
        "vagent_graph_requests_total",
        "vagent_graph_request_duration_seconds",
        'vagent_graph_llm_tokens_total{kind="input",model="test-model"}',
        'vagent_graph_tool_calls_total{decision="denied",tool="delete_records"}',
        "vagent_graph_hitl_requests_total",
        "vagent_graph_hitl_resumes_total",
    ]:
        assert name in m, name
    assert metric_values(m)[first_events] == before + 1  # the stream's first event, timed once
    docs = await client.get("/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()
    spec = (await client.get("/openapi.json")).json()
    assert {"/api/v1/process_message", "/api/v1/submit_feedback", "/health"} <= set(spec["paths"])


def metric_values(text: str) -> dict[str, float]:
    """Prometheus text: each sample's name with its labels, and its value."""
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line[:1] != "#"
    }


def test_health_is_503_when_redis_is_unreachable(tmp_path: Path) -> None:
    from redis_local import RedisServer, free_port

    redis = RedisServer(free_port(), tmp_path / "r").start()
    with GraphProcess(redis.url, tmp_path / "g") as g:
        assert httpx.get(g.url + "/health").json()["status"] == "healthy"
        redis.stop()
        r = httpx.get(g.url + "/health", timeout=10)
        assert r.status_code == 503 and r.json()["status"] == "unhealthy"
        body = message_body(new_session(), "hi")
        r = httpx.post(g.url + PM, json=body, headers=g.headers, timeout=20)
        assert r.status_code == 503 and r.json()["error_code"] == "redis_unavailable"


def test_refuses_to_start_without_a_token(tmp_path: Path, redis_url: str) -> None:
    refused = GraphProcess(redis_url, tmp_path / "refused")
    refused.env.pop("GRAPH_API_TOKEN")
    g = GraphProcess(redis_url, tmp_path / "insecure")
    g.env.pop("GRAPH_API_TOKEN")
    g.env["GRAPH_INSECURE_DEV"] = "true"
    # Both start at once (each spends seconds importing): one refuses, the other serves.
    try:
        with ThreadPoolExecutor(1) as pool:
            refusing = pool.submit(refused.start)
            g.start()
            with pytest.raises(RuntimeError, match="GRAPH_API_TOKEN is not set"):
                refusing.result()
        r = httpx.post(g.url + PM, json=message_body(new_session(), "hi"), timeout=20)
        assert r.status_code == 200
    finally:
        g.stop()
        refused.stop()


async def test_new_message_closes_a_stale_question(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    sid = new_session()
    llm_server.push_tool_calls([("delete_records", {"older_than": "2024-01-01"})])
    events = await post_sse(client, PM, message_body(sid, "delete old stuff"), graph.headers)
    assert isinstance(events[0], HitlRequest)
    # the bot's HITL timeout expired; the user writes something new
    llm_server.push_text("Sure, hello again.")
    events = await post_sse(client, PM, message_body(sid, "hello"), graph.headers)
    assert kinds(events)[-2:] == ["text_final", "done"]
    msgs = llm_server.requests[-1]["messages"]
    calls = [tc["id"] for m in msgs if m["role"] == "assistant" for tc in m.get("tool_calls") or []]
    results = {m["tool_call_id"]: m["content"] for m in msgs if m["role"] == "tool"}
    assert calls and set(calls) == set(results)
    assert results[calls[0]].startswith("Cancelled")
    r = await client.post(FB, json={"session_id": sid.format(), "response": "yes"}, headers=graph.headers)
    assert r.status_code == 409


async def test_no_secret_reaches_redis_the_logs_or_the_llm(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer, redis_url: str
) -> None:
    llm_server.push_tool_calls([("delete_records", {"older_than": "2016-06-01"})])
    sid = new_session()
    await post_sse(client, PM, message_body(sid, "delete old"), graph.headers)
    llm_server.push_text("ok")
    await post_sse(client, FB, {"session_id": sid.format(), "response": "no"}, graph.headers)
    secrets = [TOKEN, graph.env["OPENAI_API_KEY"]]
    seen = 0
    for key, value in (await dump_redis(redis_url)).items():
        seen += sid.user_id in value or sid.room_id in value
        assert not any(s in key + value for s in secrets), key
    assert seen > 0  # the session's checkpoint was among what was searched
    logs = graph.logs()
    assert not any(s in logs for s in secrets)
    for request in llm_server.requests:
        assert not any(s in str(request["messages"]) for s in secrets)


async def test_session_keys_in_redis_stay_flat(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer, redis_url: str
) -> None:
    from redis.asyncio import Redis

    sid = new_session()
    redis = Redis.from_url(redis_url)

    async def keys() -> int:
        return len([k async for k in redis.scan_iter(match=f"*{sid.room_id}*", count=1000)])

    try:
        counts = []
        for turn in range(12):
            await post_sse(client, PM, message_body(sid, f"turn {turn}"), graph.headers)
            counts.append(await keys())
        assert counts[-1] == counts[2], counts  # no growth per turn after the first ones
    finally:
        await redis.aclose()


async def test_each_stream_ends_unlocked_pruned_and_with_the_right_question_hint(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer, redis_url: str
) -> None:
    """storage.end_of_run, after every stream: the session is unlocked, the hint says whether
    a question waits, and only the latest checkpoint's write keys are left."""
    from redis.asyncio import Redis

    from vagent_graph.state.end_of_run import write_keys_zset
    from vagent_shared import redis_keys

    sid = new_session()
    s = sid.format()
    redis = Redis.from_url(redis_url, decode_responses=True)

    async def state() -> tuple[bool, bool, set[str]]:
        members = [str(m) for m in await redis.zrange(write_keys_zset(s), 0, -1)]
        [checkpoint] = [k async for k in redis.scan_iter(match=f"checkpoint:{s}*")]
        found: Any = await redis.json().get(checkpoint, "$.checkpoint_id")  # type: ignore[misc]
        stale = {m for m in members if m.rsplit(":", 3)[1] != found[0]}
        assert all([await redis.exists(m) for m in members])
        return (
            bool(await redis.exists(redis_keys.session_lock(s))),
            bool(await redis.exists(redis_keys.graph_question_pending(s))),
            stale,
        )

    try:
        for older_than in ("2016-01-01", "2017-01-01"):
            llm_server.push_tool_calls([("delete_records", {"older_than": older_than})])
            events = await post_sse(client, PM, message_body(sid, "delete old"), graph.headers)
            assert isinstance(events[0], HitlRequest)
            assert await state() == (False, True, set())  # unlocked, a question waits
            fb = {"session_id": s, "response": "maybe", "interrupt_id": events[0].interrupt_id}
            again = await post_sse(client, FB, fb, graph.headers)  # asked again
            assert isinstance(again[0], HitlRequest)
            assert await state() == (False, True, set())
            llm_server.push_text("Nothing was deleted.")
            fb = {"session_id": s, "response": "no", "interrupt_id": again[0].interrupt_id}
            assert kinds(await post_sse(client, FB, fb, graph.headers))[-2:] == ["text_final", "done"]
            assert await state() == (False, False, set())  # unlocked, nothing waits, pruned
    finally:
        await redis.aclose()


async def test_streamed_oversized_body_is_413(client: httpx.AsyncClient, graph: GraphProcess) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"session_id": "'
        for _ in range(40):
            yield b"x" * 50_000  # 2 MB without a content-length header
        yield b'"}'

    r = await client.post(PM, content=chunks(), headers={**graph.headers, "content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error_code"] == "request_too_large"


async def test_a_body_the_client_stops_sending_is_a_400_not_a_500(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    def count(status: str, text: str) -> float:
        return metric_values(text).get(
            f'vagent_graph_requests_total{{endpoint="{PM}",status="{status}"}}', 0.0
        )

    before = (await client.get("/metrics")).text
    _reader, writer = await asyncio.open_connection("127.0.0.1", graph.port)
    writer.write(
        f"POST {PM} HTTP/1.1\r\nHost: x\r\nAuthorization: {graph.headers['Authorization']}\r\n"
        f'Content-Type: application/json\r\nContent-Length: 5000\r\n\r\n{{"session_id": '.encode()
    )
    await writer.drain()
    await asyncio.sleep(0.2)  # the service is reading the body...
    writer.close()  # ...when the client goes away
    for _ in range(50):
        after = (await client.get("/metrics")).text
        if count("400", after) > count("400", before):
            break
        await asyncio.sleep(0.05)
    assert count("400", after) == count("400", before) + 1
    assert count("500", after) == count("500", before)
    assert llm_server.requests == []
