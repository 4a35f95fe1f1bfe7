"""The gateway over real HTTP, driven by the real `langgraph_sdk` client: threads, streamed runs,
confirmations approved and rejected, `runs.wait`, and who may see what.

Real parts: Redis, the graph service as a subprocess with the scripted OpenAI-compatible LLM,
the development AccessControlProvider (`vagent-acp`, the demo policy), the gateway as a
subprocess. The homeserver is a whoami stand-in (tests/support/gateway_process.py) so tokens
can be named and forged cheaply; the end-to-end test uses a real Synapse.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient
from procutil import free_port

from tests.support.gateway_process import GatewayProcess, WhoamiStandIn
from tests.support.graph_process import TOKEN as GRAPH_TOKEN
from tests.support.graph_process import GraphProcess
from tests.support.llm_server import ScriptedLLMServer
from tests.support.procs import ROOT, ServiceProcess
from tests.support.records import CUTOFF, add_old_record, older

ALICE, BOB, DAVE = "@alice:localhost", "@bob:localhost", "@dave:localhost"
#: Secret-looking tokens, as Synapse issues them: none may ever reach a log.
TOKENS = {
    f"syt_{name}_{secrets.token_urlsafe(24)}": user for name, user in (("a", ALICE), ("b", BOB), ("d", DAVE))
}
ALICE_TOKEN, BOB_TOKEN, DAVE_TOKEN = list(TOKENS)
AGENT = "vagent"
MAX_STREAMS = 2


@pytest.fixture(scope="module")
def whoami() -> Iterator[WhoamiStandIn]:
    with WhoamiStandIn(dict(TOKENS)) as server:
        yield server


@pytest.fixture(scope="module")
def acp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    tmp = tmp_path_factory.mktemp("gw-acp")
    policy = tmp / "acp-policy.yaml"
    shutil.copy(ROOT / "deploy/dev/acp-policy.yaml", policy)
    port = free_port()
    env = {"ACP_HOST": "127.0.0.1", "ACP_PORT": str(port), "ACP_POLICY_FILE": str(policy)}
    with ServiceProcess("vagent-acp", env, tmp / "acp.log", f"http://127.0.0.1:{port}/health") as server:
        yield server


@pytest.fixture(scope="module")
def graph(
    redis_url: str, _llm_session: ScriptedLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GraphProcess]:
    with GraphProcess(redis_url, tmp_path_factory.mktemp("gw-graph"), _llm_session.base_url) as g:
        yield g


@pytest.fixture(scope="module")
def gateway(
    redis_url: str,
    whoami: WhoamiStandIn,
    acp: ServiceProcess,
    graph: GraphProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GatewayProcess]:
    with GatewayProcess(
        redis_url,
        tmp_path_factory.mktemp("gw"),
        homeserver=whoami.url,
        graph_url=graph.url,
        graph_token=GRAPH_TOKEN,
        acp_url=acp.base_url,
        GATEWAY_MAX_STREAMS_PER_USER=str(MAX_STREAMS),
        GATEWAY_TOKEN_CACHE_SECONDS="2",
        FLOOD_MAX_MESSAGES="1000",
    ) as gw:
        yield gw
    for token in TOKENS:  # whatever ran, in whatever order: no token in the gateway's log
        assert token not in gw.logs()


def client(gateway: GatewayProcess, token: str) -> LangGraphClient:
    return get_client(url=gateway.url, api_key=token)


@pytest.fixture
def alice(gateway: GatewayProcess) -> LangGraphClient:
    return client(gateway, ALICE_TOKEN)


@pytest.fixture
def bob(gateway: GatewayProcess) -> LangGraphClient:
    return client(gateway, BOB_TOKEN)


async def collect(stream: AsyncIterator[Any]) -> list[tuple[str, Any]]:
    return [(part.event, part.data) for part in [p async for p in stream]]


def last_values(parts: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = [d for e, d in parts if e == "values"][-1]
    return found


def said(text: str, role: str = "") -> Any:
    """A run's input: one human message (LangChain's `type`, or OpenAI's `role`)."""
    return {"messages": [{"role": role, "content": text} if role else {"type": "human", "content": text}]}


def texts(values: Any) -> list[tuple[str, str]]:
    return [(m["type"], m["content"]) for m in values["messages"]]


async def status_of(call: Any) -> int:
    """The HTTP status an SDK call failed with (`runs.wait` raises httpx's own error)."""
    with pytest.raises(httpx.HTTPStatusError) as info:
        await call
    return info.value.response.status_code


# ---- a conversation -----------------------------------------------------------------------
async def test_stream_shows_the_answer_growing_and_the_thread_keeps_it(
    alice: LangGraphClient, llm_server: ScriptedLLMServer
) -> None:
    answer = "Paris is the capital of France"
    llm_server.push_text(answer, delay=0.06)  # ~0.3 s: several STREAM_COALESCE_MS windows
    thread = await alice.threads.create(metadata={"topic": "geo"})
    created: list[Any] = []
    parts = await collect(
        alice.runs.stream(
            thread["thread_id"],
            AGENT,
            input=said("What is the capital of France?"),
            stream_mode=["values", "messages-tuple"],
            on_run_created=created.append,
        )
    )
    events = [e for e, _ in parts]
    assert events[0] == "metadata" and events[-1] == "end"
    assert created and created[0]["run_id"] == parts[0][1]["run_id"]  # Content-Location
    chunks = [d for e, d in parts if e == "messages"]
    assert len(chunks) >= 3  # grew chunk by chunk
    assert "".join(c[0]["content"] for c in chunks) == answer
    assert all(c[0]["type"] == "AIMessageChunk" and c[1]["thread_id"] == thread["thread_id"] for c in chunks)
    assert texts(last_values(parts)) == [("human", "What is the capital of France?"), ("ai", answer)]
    assert chunks[0][0]["id"] == last_values(parts)["messages"][-1]["id"]  # chunks merge into the answer

    got = await alice.threads.get(thread["thread_id"])
    assert got["metadata"] == {"topic": "geo"} and got["status"] == "idle"
    assert texts(got["values"]) == texts(last_values(parts))
    state = await alice.threads.get_state(thread["thread_id"])
    assert texts(state["values"]) == texts(last_values(parts)) and state["next"] == []
    history = await alice.threads.get_history(thread["thread_id"])
    assert texts(history[0]["values"]) == texts(last_values(parts))
    found = await alice.threads.search(metadata={"topic": "geo"}, limit=100)
    assert thread["thread_id"] in [t["thread_id"] for t in found]
    assert await alice.threads.search(metadata={"topic": "nothing-like-it"}) == []


async def test_runs_wait_returns_the_threads_values(
    alice: LangGraphClient, llm_server: ScriptedLLMServer
) -> None:
    llm_server.push_text("Four.")
    thread = await alice.threads.create()
    result = await alice.runs.wait(thread["thread_id"], AGENT, input=said("2+2?", role="user"))
    assert texts(result) == [("human", "2+2?"), ("ai", "Four.")]
    assert "__interrupt__" not in result


async def test_the_agent_is_one_assistant(alice: LangGraphClient, gateway: GatewayProcess) -> None:
    assert (await alice.assistants.get(AGENT))["assistant_id"] == AGENT
    assert [a["assistant_id"] for a in await alice.assistants.search()] == [AGENT]
    assert await status_of(alice.assistants.get("someone-else")) == 404
    async with httpx.AsyncClient(base_url=gateway.url) as c:
        assert (await c.get("/info")).status_code == 200
        assert (await c.post("/assistants/search", json={})).status_code == 401  # people with access only


# ---- confirmations ------------------------------------------------------------------------
async def ask_to_delete(
    alice: LangGraphClient, graph: GraphProcess, llm: ScriptedLLMServer
) -> tuple[str, dict[str, Any]]:
    """A thread where alice asked to delete old records: the interrupt, nothing deleted yet."""
    add_old_record(graph.data_dir / "records.db")
    llm.push_tool_calls([("delete_records", {"older_than": CUTOFF})])
    thread = await alice.threads.create()
    parts = await collect(
        alice.runs.stream(
            thread["thread_id"],
            AGENT,
            input=said("delete old records"),
            stream_mode=["values", "messages-tuple", "updates"],
        )
    )
    values = last_values(parts)
    (interrupt,) = values["__interrupt__"]
    assert older(graph.data_dir / "records.db") > 0
    return thread["thread_id"], interrupt


async def test_a_deletion_asks_and_approve_deletes_exactly_that(
    alice: LangGraphClient, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    thread_id, interrupt = await ask_to_delete(alice, graph, llm_server)
    value = interrupt["value"]
    (action,) = value["action_requests"]
    assert CUTOFF in action["description"]
    assert value["review_configs"] == [
        {"action_name": action["name"], "allowed_decisions": ["approve", "reject"]}
    ]
    state = await alice.threads.get_state(thread_id)
    assert state["interrupts"][0]["id"] == interrupt["id"] and state["next"]
    assert (await alice.threads.get(thread_id))["status"] == "interrupted"

    llm_server.push_text("Deleted.")
    parts = await collect(
        alice.runs.stream(
            thread_id,
            AGENT,
            command={"resume": {"decisions": [{"type": "approve"}]}},
            stream_mode=["values", "messages-tuple"],
        )
    )
    assert texts(last_values(parts))[-1] == ("ai", "Deleted.")
    assert "__interrupt__" not in last_values(parts)
    assert older(graph.data_dir / "records.db") == 0
    assert all(m["type"] in ("human", "ai") for m in last_values(parts)["messages"])  # no tool results
    # answered once: a second approve finds nothing pending
    assert await status_of(alice.runs.wait(thread_id, AGENT, command={"resume": "yes"})) == 409


async def test_reject_changes_nothing(
    alice: LangGraphClient, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    thread_id, _ = await ask_to_delete(alice, graph, llm_server)
    before = older(graph.data_dir / "records.db")
    result = await alice.runs.wait(thread_id, AGENT, command={"resume": {"decisions": [{"type": "reject"}]}})
    assert "__interrupt__" not in result
    assert older(graph.data_dir / "records.db") == before
    assert (await alice.threads.get(thread_id))["status"] == "idle"


async def test_an_edited_action_is_refused(
    alice: LangGraphClient, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    thread_id, _ = await ask_to_delete(alice, graph, llm_server)
    edit = {"decisions": [{"type": "edit", "edited_action": {"name": "delete_records", "args": {}}}]}
    assert await status_of(alice.runs.wait(thread_id, AGENT, command={"resume": edit})) == 422
    assert (await alice.threads.get(thread_id))["status"] == "interrupted"


# ---- who may see what ---------------------------------------------------------------------
async def test_another_person_gets_404_on_every_path(
    alice: LangGraphClient, bob: LangGraphClient, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    thread_id, _ = await ask_to_delete(alice, graph, llm_server)
    human = said("hi")
    calls = {
        "get": bob.threads.get(thread_id),
        "state": bob.threads.get_state(thread_id),
        "history": bob.threads.get_history(thread_id),
        "stream": collect(bob.runs.stream(thread_id, AGENT, input=human)),
        "wait": bob.runs.wait(thread_id, AGENT, input=human),
        "resume": bob.runs.wait(thread_id, AGENT, command={"resume": {"decisions": [{"type": "approve"}]}}),
        "cancel": bob.runs.cancel(thread_id, secrets.token_hex(8)),
        "delete": bob.threads.delete(thread_id),
    }
    for name, call in calls.items():
        assert await status_of(call) == 404, name
    assert thread_id not in [t["thread_id"] for t in await bob.threads.search(limit=1000)]
    assert await status_of(bob.threads.get(secrets.token_hex(16))) == 404  # the same as no thread at all
    # and nothing happened to alice's thread
    assert (await alice.threads.get(thread_id))["status"] == "interrupted"
    assert older(graph.data_dir / "records.db") > 0


async def test_no_agent_access_403_forged_token_401(gateway: GatewayProcess) -> None:
    assert await status_of(client(gateway, DAVE_TOKEN).threads.create()) == 403
    forged = client(gateway, "syt_forged_" + secrets.token_urlsafe(24))
    assert await status_of(forged.threads.create()) == 401
    assert await status_of(forged.threads.search()) == 401
    async with httpx.AsyncClient(base_url=gateway.url) as c:
        r = await c.post("/threads", json={}, headers={"Authorization": f"Bearer {ALICE_TOKEN}x"})
        assert r.status_code == 401 and r.json()["error_code"] == "unauthorized"
        assert r.headers["www-authenticate"] == "Bearer"
        assert (await c.post("/threads", json={})).status_code == 401


async def test_a_revoked_token_stops_working_after_the_cache(
    gateway: GatewayProcess, whoami: WhoamiStandIn
) -> None:
    token = "syt_short_" + secrets.token_urlsafe(24)
    whoami.tokens[token] = ALICE
    c = client(gateway, token)
    await c.threads.search()
    del whoami.tokens[token]  # logged out
    await asyncio.sleep(2.5)  # GATEWAY_TOKEN_CACHE_SECONDS
    assert await status_of(c.threads.search()) == 401


async def test_provider_down_503(alice: LangGraphClient, acp: ServiceProcess) -> None:
    acp.stop()
    try:
        assert await status_of(alice.threads.search()) == 503
    finally:
        acp.start()
    await alice.threads.search()


# ---- limits ---------------------------------------------------------------------------------
async def test_busy_thread_409_and_too_many_runs_429(
    alice: LangGraphClient, llm_server: ScriptedLLMServer
) -> None:
    threads = [(await alice.threads.create())["thread_id"] for _ in range(MAX_STREAMS + 1)]
    for _ in range(MAX_STREAMS):
        llm_server.push_text("slow answer that takes a while to write", delay=0.4)
    human = said("tell me slowly")
    started = [asyncio.Event() for _ in range(MAX_STREAMS)]

    async def run(i: int) -> list[tuple[str, Any]]:
        out = []
        async for part in alice.runs.stream(threads[i], AGENT, input=human, stream_mode=["values"]):
            out.append((part.event, part.data))
            started[i].set()
        return out

    running = [asyncio.create_task(run(i)) for i in range(MAX_STREAMS)]
    for ev in started:
        await asyncio.wait_for(ev.wait(), 30)
    assert await status_of(alice.runs.wait(threads[0], AGENT, input=human)) == 409
    assert await status_of(alice.runs.wait(threads[-1], AGENT, input=human)) == 429
    for parts in await asyncio.gather(*running):
        assert parts[-1][0] == "end"


async def test_cancel_stops_the_answer(alice: LangGraphClient, llm_server: ScriptedLLMServer) -> None:
    llm_server.push_text("a very slow answer that nobody will read to the end", delay=0.5)
    thread_id = (await alice.threads.create())["thread_id"]
    created: list[Any] = []
    parts: list[tuple[str, Any]] = []
    answering = asyncio.Event()

    async def run() -> None:
        async for part in alice.runs.stream(
            thread_id,
            AGENT,
            input=said("go"),
            stream_mode=["messages-tuple"],
            on_run_created=created.append,
        ):
            parts.append((part.event, part.data))
            if part.event == "messages":
                answering.set()

    task = asyncio.create_task(run())
    await asyncio.wait_for(answering.wait(), 30)
    await alice.runs.cancel(thread_id, created[0]["run_id"])
    await asyncio.wait_for(task, 10)
    assert [e for e, _ in parts][-2:] == ["error", "end"]
    assert (await alice.threads.get(thread_id))["status"] == "idle"
    assert llm_server.wait_for_streams(disconnected=1, timeout=10)


async def test_body_and_message_limits(gateway: GatewayProcess, alice: LangGraphClient) -> None:
    thread_id = (await alice.threads.create())["thread_id"]
    async with httpx.AsyncClient(base_url=gateway.url, headers={"X-Api-Key": ALICE_TOKEN}) as c:
        r = await c.post(f"/threads/{thread_id}/runs/wait", content=b"x" * 2_000_000)
        assert r.status_code == 413 and r.json()["error_code"] == "request_too_large"
        body = {"assistant_id": AGENT, "input": said("y" * 9000)}
        r = await c.post(f"/threads/{thread_id}/runs/wait", json=body)
        assert r.status_code == 422 and r.json()["error_code"] == "message_too_long"


async def test_delete_forgets_the_thread(alice: LangGraphClient, llm_server: ScriptedLLMServer) -> None:
    llm_server.push_text("Noted.")
    thread_id = (await alice.threads.create())["thread_id"]
    await alice.runs.wait(thread_id, AGENT, input=said("hello"))
    await alice.threads.delete(thread_id)
    assert await status_of(alice.threads.get(thread_id)) == 404


def test_no_token_in_the_gateway_log(gateway: GatewayProcess) -> None:
    """Last in the module, so every token above was used by now (the fixture checks again
    at its end, whatever the order)."""
    logs = gateway.logs()
    assert "thread_created" in logs
    for token in TOKENS:
        assert token not in logs
    audit = [json.loads(ln) for ln in logs.splitlines() if ln.startswith("{") and '"audit"' in ln]
    assert any(a.get("audit", {}).get("event_type") == "hitl_decision" for a in audit)
    assert any(a.get("audit", {}).get("reason") == "not the thread's owner" for a in audit)


# ---- CORS: agent-chat-ui, a page of another origin ------------------------------------------
ALLOWED_ORIGIN, OTHER_ORIGIN = "https://chat.example.org", "https://evil.example.net"


@pytest.fixture(scope="module")
def listed_gateway(
    redis_url: str,
    whoami: WhoamiStandIn,
    acp: ServiceProcess,
    graph: GraphProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GatewayProcess]:
    """A gateway that answers browsers of listed origins only (a trailing `/` as people write it)."""
    with GatewayProcess(
        redis_url,
        tmp_path_factory.mktemp("gw-cors"),
        homeserver=whoami.url,
        graph_url=graph.url,
        graph_token=GRAPH_TOKEN,
        acp_url=acp.base_url,
        GATEWAY_CORS_ORIGINS=f"{ALLOWED_ORIGIN}/, http://localhost:3000",
        FLOOD_MAX_MESSAGES="1000",
    ) as gw:
        yield gw


def preflight(origin: str, thread_id: str) -> tuple[str, dict[str, str]]:
    """What a browser asks before agent-chat-ui's `runs.stream`: no token, the headers it will send."""
    return f"/threads/{thread_id}/runs/stream", {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type,x-api-key",
    }


def audited_paths(gateway: GatewayProcess) -> str:
    return "\n".join(ln for ln in gateway.logs().splitlines() if '"audit"' in ln)


@pytest.mark.parametrize("which", ["listed", "any"])
async def test_a_preflight_from_an_allowed_origin_needs_no_token(
    which: str, gateway: GatewayProcess, listed_gateway: GatewayProcess
) -> None:
    gw = listed_gateway if which == "listed" else gateway
    thread_id = secrets.token_hex(16)
    path, headers = preflight(ALLOWED_ORIGIN, thread_id)
    async with httpx.AsyncClient(base_url=gw.url) as c:
        r = await c.options(path, headers=headers)
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == (ALLOWED_ORIGIN if which == "listed" else "*")
    allowed = {h.strip().lower() for h in r.headers["access-control-allow-headers"].split(",")}
    assert {"authorization", "x-api-key", "content-type", "last-event-id"} <= allowed
    methods = {m.strip() for m in r.headers["access-control-allow-methods"].split(",")}
    assert {"GET", "POST", "DELETE", "PATCH"} <= methods
    assert "access-control-allow-credentials" not in r.headers  # tokens are headers, never cookies
    await asyncio.sleep(0.3)  # an audit line would have been written by now
    assert thread_id not in audited_paths(gw)  # not a refused token


async def test_a_disallowed_origin_gets_no_cors_headers(listed_gateway: GatewayProcess) -> None:
    path, headers = preflight(OTHER_ORIGIN, secrets.token_hex(16))
    async with httpx.AsyncClient(base_url=listed_gateway.url) as c:
        r = await c.options(path, headers=headers)
        assert r.status_code >= 400
        assert not [h for h in r.headers if h.startswith("access-control-")]
        # an actual request from there is answered (the browser withholds it from the page)
        r = await c.get("/info", headers={"Origin": OTHER_ORIGIN})
        assert r.status_code == 200 and not [h for h in r.headers if h.startswith("access-control-")]
        # a prefix of an allowed origin is another origin
        r = await c.get("/info", headers={"Origin": ALLOWED_ORIGIN + ".evil.example.net"})
        assert "access-control-allow-origin" not in r.headers


async def test_a_cross_origin_stream_exposes_content_location(
    listed_gateway: GatewayProcess, llm_server: ScriptedLLMServer
) -> None:
    llm_server.push_text("Hello from afar.")
    headers = {"Origin": ALLOWED_ORIGIN, "X-Api-Key": ALICE_TOKEN}
    async with httpx.AsyncClient(base_url=listed_gateway.url, headers=headers, timeout=30) as c:
        thread = (await c.post("/threads", json={})).json()
        body = {"assistant_id": AGENT, "input": said("hi"), "stream_mode": ["values"]}
        async with c.stream("POST", f"/threads/{thread['thread_id']}/runs/stream", json=body) as r:
            text = (await r.aread()).decode()
        assert r.status_code == 200, text
        assert r.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
        exposed = {h.strip().lower() for h in r.headers["access-control-expose-headers"].split(",")}
        assert "content-location" in exposed
        assert r.headers["content-location"].startswith(f"/threads/{thread['thread_id']}/runs/")
        assert "Hello from afar." in text and "event: end" in text
        # an error is readable by the page too
        r = await c.get(f"/threads/{secrets.token_hex(16)}")
        assert r.status_code == 404 and r.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
