"""Documents through the real graph service: the admin API feeds them, `search_documents`
finds them for the LLM, filtered per user and room, and the answer cites them."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.factories import ac, message_body, new_session
from tests.support.graph_process import TOKEN, GraphProcess
from tests.support.llm_server import ScriptedLLMServer
from tests.support.sse import post_sse
from vagent_shared.events import TextFinal
from vagent_shared.knowledge import Audience, AudienceMember

ADMIN = "admin-token-for-tests-4c1d"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "docs"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ADMIN_AUTH = {"Authorization": f"Bearer {ADMIN}"}
PRESS = "# Q3 press summary\n\nNorthwind grew in the third quarter; details follow in the annual report.\n"
SECRET = "# Q3 financials\n\nQ3 revenue was 18.4 million EUR, code FIN-Q3-2026, margin 21 percent.\n"


@pytest.fixture(scope="module")
def graph(
    redis_url: str, _llm_session: ScriptedLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GraphProcess]:
    index = f"api_docs_{uuid.uuid4().hex[:8]}"
    with GraphProcess(
        redis_url,
        tmp_path_factory.mktemp("graph-knowledge"),
        _llm_session.base_url,
        GRAPH_ADMIN_TOKEN=ADMIN,
        DOCS_INDEX=index,
        ENTITY_GRAPH=f"{index}_kg",
        MAX_INGEST_BYTES="20000",
    ) as g:
        yield g


@pytest.fixture
async def client(graph: GraphProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=graph.url, timeout=60) as c:
        yield c


async def put(
    client: httpx.AsyncClient, domain: str, doc_id: str, body: bytes | str, content_type: str, **params: str
) -> httpx.Response:
    return await client.put(
        f"/admin/v1/documents/{domain}/{doc_id}",
        content=body,
        params=params,
        headers={**ADMIN_AUTH, "Content-Type": content_type},
    )


async def test_the_admin_api_adds_replaces_lists_and_deletes(client: httpx.AsyncClient) -> None:
    created = await put(
        client, "acme", "notes", "Meeting notes\n\nThe budget was approved.", "text/plain", category="hr"
    )
    assert created.status_code == 201, created.text
    assert created.json()["chunks"] == 1 and created.json()["format"] == "text"
    pdf = await put(
        client,
        "acme",
        "q3",
        (FIXTURES / "report.pdf").read_bytes(),
        "application/pdf",
        category="finance",
        tags="q3,confidential",
    )
    assert pdf.status_code == 201 and pdf.json()["tags"] == ["q3", "confidential"]
    replaced = await put(
        client, "acme", "notes", "Meeting notes\n\nThe budget was cut.", "text/plain", category="hr"
    )
    assert replaced.status_code == 200
    listed = (await client.get("/admin/v1/documents", params={"domain": "acme"}, headers=ADMIN_AUTH)).json()
    assert [d["doc_id"] for d in listed["documents"]] == ["notes", "q3"]
    status = (await client.get("/admin/v1/index", headers=ADMIN_AUTH)).json()
    assert status["embedding_model"] == "all-MiniLM-L6-v2-onnx-int8" and status["dimensions"] == 384
    gone = await client.delete("/admin/v1/documents/acme/notes", headers=ADMIN_AUTH)
    assert gone.status_code == 200 and gone.json()["deleted_chunks"] == 1
    again = await client.delete("/admin/v1/documents/acme/notes", headers=ADMIN_AUTH)
    assert again.status_code == 404 and again.json()["error_code"] == "no_such_document"


@pytest.mark.parametrize(
    ("body", "content_type", "params", "status", "code"),
    [
        (
            (FIXTURES / "corrupt.pdf").read_bytes(),
            "application/pdf",
            {"category": "x"},
            422,
            "invalid_document",
        ),
        (b"caf\xe9 \xc3\x28 not utf-8", "text/plain", {"category": "x"}, 422, "invalid_document"),
        (b"hello", "application/zip", {"category": "x"}, 422, "invalid_document"),
        (b"hello", "text/plain", {"category": "a,b"}, 422, "invalid_document"),
        (b"hello", "text/plain", {}, 422, "invalid_request"),
        (b"x" * 30000, "text/plain", {"category": "x"}, 413, "request_too_large"),
    ],
)
async def test_bad_uploads_are_clear_errors_and_write_nothing(
    client: httpx.AsyncClient, body: bytes, content_type: str, params: dict[str, str], status: int, code: str
) -> None:
    doc_id = f"bad-{uuid.uuid4().hex[:6]}"
    r = await put(client, "acme", doc_id, body, content_type, **params)
    assert (r.status_code, r.json()["error_code"]) == (status, code), r.text
    listed = (await client.get("/admin/v1/documents", headers=ADMIN_AUTH)).json()["documents"]
    assert doc_id not in {d["doc_id"] for d in listed}


@pytest.mark.parametrize(
    "headers", [{}, AUTH, {"Authorization": f"Bearer {ADMIN}x"}, {"Authorization": ADMIN}]
)
async def test_the_admin_api_wants_its_own_token(client: httpx.AsyncClient, headers: dict[str, str]) -> None:
    r = await client.put(
        "/admin/v1/documents/acme/x", params={"category": "x"}, content=b"hi", headers=headers
    )
    assert r.status_code == 401 and r.json()["error_code"] == "unauthorized"
    assert (await client.get("/admin/v1/documents", headers=headers)).status_code == 401


async def test_without_an_admin_token_the_admin_api_is_off(redis_url: str, tmp_path: Path) -> None:
    with GraphProcess(redis_url, tmp_path) as g:
        async with httpx.AsyncClient(base_url=g.url) as c:
            r = await c.get("/admin/v1/documents", headers=ADMIN_AUTH)
            assert r.status_code == 403 and r.json()["error_code"] == "admin_disabled"


def searching(llm: ScriptedLLMServer, query: str, answer: str) -> None:
    """The LLM searches, then answers `answer` (citing what it found)."""
    llm.push_tool_calls([("search_documents", {"query": query})])
    llm.push_text(answer)


def tool_result(llm: ScriptedLLMServer) -> str:
    """What search_documents answered the LLM this turn (the last tool message of the LLM's
    second request; earlier turns are in the history before it)."""
    messages: list[dict[str, Any]] = llm.requests[1]["messages"]
    return str([m for m in messages if m["role"] == "tool"][-1]["content"])


async def ask(client: httpx.AsyncClient, body: dict[str, Any]) -> str:
    events = await post_sse(client, "/api/v1/process_message", body, AUTH)
    finals = [e for e in events if isinstance(e, TextFinal)]
    return finals[-1].content


@pytest.fixture
async def q3_docs(client: httpx.AsyncClient) -> None:
    for doc_id, text, tags in (
        ("q3-press", PRESS, "q3,public"),
        ("q3-financials", SECRET, "q3,confidential"),
    ):
        r = await put(client, "northwind", doc_id, text, "text/markdown", category="finance", tags=tags)
        assert r.status_code in (200, 201), r.text


async def test_users_get_different_cited_answers_from_what_each_may_read(
    client: httpx.AsyncClient, llm_server: ScriptedLLMServer, q3_docs: None
) -> None:
    alice = ac("@alice:x", ["tool:search_documents", "document_category:finance"], domain="northwind")
    searching(llm_server, "Q3 results", "Revenue was 18.4 million EUR [1].")
    answer = await ask(client, message_body(new_session("@alice:x"), "What were the Q3 results?", alice))
    assert "FIN-Q3-2026" in tool_result(llm_server)
    assert answer.startswith(
        "Revenue was 18.4 million EUR [1].\n\nSources:\n- [1] Q3 financials (`q3-financials`)"
    )

    llm_server.clear()
    bob = ac("@bob:x", ["tool:search_documents", "document_tag:public"], domain="northwind")
    searching(llm_server, "Q3 results", "Northwind grew [1].")
    answer = await ask(client, message_body(new_session("@bob:x"), "What were the Q3 results?", bob))
    result = tool_result(llm_server)
    assert "18.4" not in result and "q3-financials" not in result and "Q3 financials" not in result
    assert "Northwind grew" in result
    assert answer.endswith("Sources:\n- [1] Q3 press summary (`q3-press`)")


async def test_in_a_room_only_what_every_member_may_read(
    client: httpx.AsyncClient, llm_server: ScriptedLLMServer, q3_docs: None
) -> None:
    alice = ac("@alice:x", ["tool:search_documents", "document_category:finance"], domain="northwind")
    carol = ac("@carol:x", ["document_tag:public"], domain="northwind")
    sid = new_session("@alice:x")
    body = message_body(sid, "What were the Q3 results?", alice)
    body["audience"] = Audience(
        members=[AudienceMember(user_id="@carol:x", ac_context=carol)], member_count=3
    ).model_dump(mode="json", by_alias=True)
    searching(llm_server, "Q3 revenue FIN-Q3-2026", "Only the summary [1].")
    answer = await ask(client, body)
    result = tool_result(llm_server)
    assert "18.4" not in result and "financials" not in result
    assert "everyone in this room" in result
    assert "q3-financials" not in answer and "(`q3-press`)" in answer

    llm_server.clear()  # the same room with someone the provider could not answer for
    body["audience"]["members"].append({"user_id": "@eve:x", "ac_context": None})
    searching(llm_server, "Q3 results", "Nothing.")
    assert "Sources:" not in await ask(client, body)
    assert tool_result(llm_server).startswith("No passages")


async def test_a_model_calling_search_without_the_grant_is_refused(
    client: httpx.AsyncClient, llm_server: ScriptedLLMServer, q3_docs: None
) -> None:
    dave = ac("@dave:x", ["document:*"], domain="northwind")  # may read, may not use the tool
    searching(llm_server, "Q3 results", "I could not search.")
    answer = await ask(client, message_body(new_session("@dave:x"), "What were the Q3 results?", dave))
    assert "search_documents" not in llm_server.offered_tool_names(0)
    assert tool_result(llm_server) == "I can't do that here."
    assert "Sources:" not in answer and "18.4" not in answer
