"""The admin API names the field that is wrong: a bad domain or document id in the path (or
the `?domain=` filter) is a 422 naming `domain` or `doc_id`, never "body" and never a 500,
and nothing is written. Through the real graph service, as a pipeline would call it."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from redis.asyncio import Redis

from tests.support.graph_process import GraphProcess
from tests.support.llm_server import ScriptedLLMServer
from vagent_shared import redis_keys
from vagent_shared.knowledge import MAX_NAME_CHARS

ADMIN = "admin-token-for-admin-errors-9b2e"
ADMIN_AUTH = {"Authorization": f"Bearer {ADMIN}"}
ENTITIES = {
    "entities": [{"id": "ana", "name": "Ana Costa", "entity_type": "person", "tags": ["public"]}],
    "relations": [],
}

#: Path values a pipeline might send by mistake, and the reason each is refused.
BAD_NAMES = [
    pytest.param("ac me", "must not contain whitespace", id="space"),
    pytest.param("acme\t", "must not contain control characters", id="tab"),
    pytest.param("ac\u200bme\nx", "must not contain control characters", id="newline"),
    pytest.param("a,b", "must not contain ','", id="tag_separator"),
    pytest.param("x" * (MAX_NAME_CHARS + 1), f"at most {MAX_NAME_CHARS} characters", id="too_long"),
]


@pytest.fixture(scope="module")
def graph(
    redis_url: str, _llm_session: ScriptedLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GraphProcess]:
    index = f"admin_err_{uuid.uuid4().hex[:8]}"
    with GraphProcess(
        redis_url,
        tmp_path_factory.mktemp("graph-admin-errors"),
        _llm_session.base_url,
        GRAPH_ADMIN_TOKEN=ADMIN,
        DOCS_INDEX=index,
        ENTITY_GRAPH=f"{index}_kg",
    ) as g:
        yield g


@pytest.fixture
async def client(graph: GraphProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=graph.url, timeout=60, headers=ADMIN_AUTH) as c:
        yield c


def seg(value: str) -> str:
    """A path segment as a client sends it: percent-encoded (httpx refuses raw control
    characters); the service sees the decoded value."""
    return quote(value, safe="")


def assert_names(r: httpx.Response, field: str, why: str) -> None:
    """A 422 `invalid_{field}` whose message starts with `{field}:` and says `why`."""
    assert r.status_code == 422, r.text
    body: dict[str, Any] = r.json()
    assert body["error_code"] == f"invalid_{field}", body
    assert body["message"].startswith(f"{field}: "), body
    assert why in body["message"], body
    assert "body" not in body["message"] and "Value error" not in body["message"], body


async def listed(client: httpx.AsyncClient) -> list[tuple[str, str]]:
    r = await client.get("/admin/v1/documents")
    assert r.status_code == 200, r.text
    return [(d["domain"], d["doc_id"]) for d in r.json()["documents"]]


@pytest.mark.parametrize(("domain", "why"), BAD_NAMES)
async def test_entities_with_a_bad_domain_blame_the_domain_not_the_body(
    client: httpx.AsyncClient, graph: GraphProcess, redis_url: str, domain: str, why: str
) -> None:
    r = await client.put(f"/admin/v1/entities/{seg(domain)}", json=ENTITIES)
    assert_names(r, "domain", why)
    redis = Redis.from_url(redis_url)
    try:
        assert not await redis.exists(redis_keys.entity_graph(graph.env["ENTITY_GRAPH"], domain))
    finally:
        await redis.aclose()


async def test_entities_with_a_bad_body_still_name_the_body_field(client: httpx.AsyncClient) -> None:
    bad = {"entities": [{"id": "ana", "entity_type": "person"}], "relations": []}  # no name
    r = await client.put("/admin/v1/entities/acme", json=bad)
    assert r.status_code == 422 and r.json()["error_code"] == "invalid_entities", r.text
    assert r.json()["message"].startswith("entities.0.name: "), r.text
    spaced = {"entities": [{"id": "a b", "name": "A B", "entity_type": "person"}], "relations": []}
    r = await client.put("/admin/v1/entities/acme", json=spaced)
    assert r.status_code == 422 and r.json()["error_code"] == "invalid_entities", r.text
    assert r.json()["message"] == "entities.0.id: must not contain whitespace", r.text
    garbage = await client.put(
        "/admin/v1/entities/acme", content=b"{nope", headers={"Content-Type": "application/json"}
    )
    assert garbage.status_code == 422 and garbage.json()["error_code"] == "invalid_entities", garbage.text


@pytest.mark.parametrize(("name", "why"), BAD_NAMES)
async def test_documents_with_a_bad_domain_or_id_name_that_field_and_write_nothing(
    client: httpx.AsyncClient, name: str, why: str
) -> None:
    before = await listed(client)
    doc_id = f"doc-{uuid.uuid4().hex[:6]}"
    params = {"category": "finance"}
    headers = {"Content-Type": "text/plain"}
    bad_domain = await client.put(
        f"/admin/v1/documents/{seg(name)}/{doc_id}", params=params, content=b"hello", headers=headers
    )
    assert_names(bad_domain, "domain", why)
    bad_id = await client.put(
        f"/admin/v1/documents/acme/{seg(name)}", params=params, content=b"hello", headers=headers
    )
    assert_names(bad_id, "doc_id", why)
    both = await client.put(f"/admin/v1/documents/{seg(name)}/{seg(name)}", params=params, content=b"hello")
    assert_names(both, "domain", why)  # the first path segment is reported first
    assert await listed(client) == before

    assert_names(await client.delete(f"/admin/v1/documents/{seg(name)}/{doc_id}"), "domain", why)
    assert_names(await client.delete(f"/admin/v1/documents/acme/{seg(name)}"), "doc_id", why)
    assert_names(await client.get("/admin/v1/documents", params={"domain": name}), "domain", why)


async def test_an_empty_domain_filter_is_refused_by_name(client: httpx.AsyncClient) -> None:
    assert_names(await client.get("/admin/v1/documents?domain="), "domain", "at least 1 character")


async def test_good_names_still_work_end_to_end(client: httpx.AsyncClient) -> None:
    """Unicode and ':' are fine in a domain and an id; the valid routes answer as before."""
    domain, doc_id = "acmé:eu", f"notes:{uuid.uuid4().hex[:6]}"
    created = await client.put(
        f"/admin/v1/documents/{seg(domain)}/{seg(doc_id)}",
        params={"category": "hr"},
        content=b"Meeting notes\n\nThe budget was approved.",
        headers={"Content-Type": "text/plain"},
    )
    assert created.status_code == 201, created.text
    only = await client.get("/admin/v1/documents", params={"domain": domain})
    assert [d["doc_id"] for d in only.json()["documents"]] == [doc_id]
    gone = await client.delete(f"/admin/v1/documents/{seg(domain)}/{seg(doc_id)}")
    assert gone.status_code == 200 and gone.json()["deleted_chunks"] == 1, gone.text
    missing = await client.delete(f"/admin/v1/documents/{seg(domain)}/{seg(doc_id)}")
    assert missing.status_code == 404 and missing.json()["error_code"] == "no_such_document"
    r = await client.put("/admin/v1/entities/acme", content=json.dumps(ENTITIES))
    assert r.status_code in (200, 503), r.text  # 503: no graph module in this Redis; never a 422
