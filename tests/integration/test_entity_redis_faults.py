"""The entity graphs live in a Redis of their own (ENTITY_REDIS_URL), and its crash costs only
entity lookups.

Real parts: the graph service as a process over HTTP, the scripted LLM, a main Redis WITHOUT
the FalkorDB module (search + JSON only) and an entity Redis with FalkorDB only, which is
killed with SIGKILL in the middle of a conversation (as a SIGSEGV in the module would end
it). While it is away the same conversation searches documents, asks for a confirmation and
runs it after "yes", and an entity lookup gives the model a clear "unavailable" tool result;
/health stays 200 and reports the entity store apart. Started again on the same port and
directory (its append-only file replayed), the next lookup finds the entities again in the
same graph process.
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import redis

from redis_local import RedisServer, free_port
from tests.support.factories import ac, message_body, new_session
from tests.support.graph_process import GraphProcess
from tests.support.llm_server import ScriptedLLMServer
from tests.support.records import add_old_record, ask_to_delete, confirm_delete, older
from tests.support.sse import kinds, post_sse
from vagent_graph.knowledge.entity_store import EntityStore, EntityStoreUnavailable
from vagent_graph.knowledge.readers import ENTITY_KINDS, readers_for
from vagent_graph.tools.entities import UNAVAILABLE
from vagent_shared import SessionId
from vagent_shared.events import ErrorEvent, TextFinal

ADMIN = "admin-token-entity-faults-8b2e"
ADMIN_AUTH = {"Authorization": f"Bearer {ADMIN}"}
DOMAIN = "acme"
ENTITIES = {
    "entities": [
        {"id": "ana", "name": "Ana Costa", "entity_type": "person", "tags": ["public"]},
        {"id": "apollo", "name": "Project Apollo", "entity_type": "project", "tags": ["public"]},
    ],
    "relations": [{"source": "ana", "target": "apollo", "type": "works_on"}],
}
HANDBOOK = "# Handbook\n\nThe office opens at 08:30; the parking code is PARK-7731.\n"
ALICE = ac(
    "@alice:localhost",
    [
        "tool:lookup_entities",
        "tool:search_documents",
        "tool:database_query",
        "tool:delete_records",
        "entity_type:*",
        "document_category:handbook",
    ],
    domain=DOMAIN,
)
#: `always`: what FalkorDB wrote is on disk before it is answered, so kill -9 loses nothing.
AOF = ("--appendonly", "yes", "--appendfsync", "always")


@pytest.fixture(scope="module")
def main_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """Checkpoints, documents, confirmations, audit: search + JSON, no graph module."""
    server = RedisServer(free_port(), tmp_path_factory.mktemp("main-redis"), modules="main").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def entity_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(
        free_port(), tmp_path_factory.mktemp("entity-redis"), extra_args=AOF, modules="entities"
    ).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def graph(
    main_redis: RedisServer,
    entity_redis: RedisServer,
    _llm_session: ScriptedLLMServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GraphProcess]:
    index = f"entfault_{uuid.uuid4().hex[:8]}"
    with GraphProcess(
        main_redis.url,
        tmp_path_factory.mktemp("graph-entity-faults"),
        _llm_session.base_url,
        ENTITY_REDIS_URL=entity_redis.url,
        GRAPH_ADMIN_TOKEN=ADMIN,
        DOCS_INDEX=index,
        ENTITY_GRAPH=f"{index}_kg",
    ) as g:
        with httpx.Client(base_url=g.url, headers=ADMIN_AUTH, timeout=60) as c:
            r = c.put(
                f"/admin/v1/documents/{DOMAIN}/handbook",
                content=HANDBOOK,
                params={"category": "handbook"},
                headers={"Content-Type": "text/markdown"},
            )
            assert r.status_code in (200, 201), r.text
            r = c.put(f"/admin/v1/entities/{DOMAIN}", content=json.dumps(ENTITIES))
            assert r.status_code == 200, r.text  # through the graph, into ENTITY_REDIS_URL
        yield g


@pytest.fixture
async def client(graph: GraphProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=graph.url, timeout=60) as c:
        yield c


def modules(server: RedisServer) -> set[str]:
    with redis.Redis.from_url(server.url) as r:
        return {str(m[b"name"].decode()) for m in r.module_list()}


async def turn(
    c: httpx.AsyncClient,
    g: GraphProcess,
    llm: ScriptedLLMServer,
    sid: SessionId,
    tool: str,
    args: dict[str, Any],
) -> str:
    """One turn in which the model calls `tool`: what the tool gave the model. The turn must
    end with an answer, never an error event."""
    llm.push_tool_calls([(tool, args)])
    llm.push_text("Here is what I found.")
    events = await post_sse(c, "/api/v1/process_message", message_body(sid, f"use {tool}", ALICE), g.headers)
    assert kinds(events)[-2:] == ["text_final", "done"], events
    assert not [e for e in events if isinstance(e, ErrorEvent)], events
    assert [e for e in events if isinstance(e, TextFinal)][-1].content.startswith("Here is what I found.")
    (result,) = [m["content"] for m in llm.requests[-1]["messages"] if m["role"] == "tool"][-1:]
    return str(result)


async def health(c: httpx.AsyncClient) -> tuple[int, dict[str, Any]]:
    r = await c.get("/health")
    return r.status_code, r.json()


async def test_a_killed_entity_redis_costs_only_entity_lookups(
    client: httpx.AsyncClient,
    graph: GraphProcess,
    main_redis: RedisServer,
    entity_redis: RedisServer,
    llm_server: ScriptedLLMServer,
) -> None:
    c, g, llm = client, graph, llm_server
    pid = g.proc.pid if g.proc else None
    # The separation is real: the main Redis cannot even run a graph query, the entities
    # are in the entity Redis only.
    assert "graph" not in modules(main_redis) and "graph" in modules(entity_redis)
    key = f"{g.env['ENTITY_GRAPH']}:{DOMAIN}"
    with redis.Redis.from_url(main_redis.url) as r:
        assert not r.exists(key)
    with redis.Redis.from_url(entity_redis.url) as r:
        assert r.type(key) == b"graphdata"

    sid = new_session()
    found = await turn(c, g, llm, sid, "lookup_entities", {"query": "Ana"})
    assert "Ana Costa" in found and "Project Apollo" in found, found
    status, body = await health(c)
    assert (status, body["status"], body["entities"]) == (200, "healthy", "available"), body

    assert entity_redis.proc is not None
    entity_redis.proc.send_signal(signal.SIGKILL)  # as a crash of the graph module ends it
    entity_redis.proc.wait()
    entity_redis.proc = None

    status, body = await health(c)
    assert (status, body["status"], body["entities"]) == (200, "healthy", "unavailable"), body

    # The same conversation goes on: documents ...
    passage = await turn(c, g, llm, sid, "search_documents", {"query": "when does the office open"})
    assert "PARK-7731" in passage, passage
    # ... an entity lookup: a clear tool result for the model, the turn answered as usual ...
    assert await turn(c, g, llm, sid, "lookup_entities", {"query": "Ana"}) == UNAVAILABLE
    # ... and a confirmation, asked and answered "yes" while the entity Redis is away.
    db = g.data_dir / "records.db"
    add_old_record(db)
    assert older(db) > 0
    asked, question = await ask_to_delete(c, g, llm)
    await confirm_delete(c, g, llm, asked, question)
    # Loading entities now is a clear 503, not a 500.
    r = await c.put(f"/admin/v1/entities/{DOMAIN}", content=json.dumps(ENTITIES), headers=ADMIN_AUTH)
    assert r.status_code == 503 and r.json()["error_code"] == "graph_store_unavailable", r.text

    entity_redis.start()  # same port, same directory: the append-only file is replayed
    status, body = await health(c)
    assert (status, body["entities"]) == (200, "available"), body
    again = await turn(c, g, llm, sid, "lookup_entities", {"query": "Ana"})
    assert "Ana Costa" in again and "Project Apollo" in again, again
    assert g.proc is not None and g.proc.poll() is None and g.proc.pid == pid  # the same process all along


class _Silent:
    """A TCP server that accepts connections and never answers: a hung Redis."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.conns:
            conn.close()


async def test_a_lookup_on_a_hung_entity_redis_ends_at_its_deadline() -> None:
    """A Redis that takes the connection and never answers (SIGSTOP, a hung module): the
    lookup gives up at the store's deadline instead of holding the user's answer."""
    silent = _Silent()
    client = redis.asyncio.Redis(port=silent.port, socket_connect_timeout=2)
    try:
        store = EntityStore(client, "hung", deadline_s=0.5)
        readers = readers_for(ac(instances=["tool:lookup_entities", "entity_type:*"]), None, ENTITY_KINDS)
        with pytest.raises(EntityStoreUnavailable):  # redis-py alone would wait for ever
            await store.lookup(readers, "Ana")
    finally:
        await client.aclose()
        silent.close()
