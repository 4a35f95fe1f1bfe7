"""Hidden tool results never outlive their audience: through the real graph service, a passage
retrieved for one set of readers is withheld from the model when the answer goes to others,
on later turns and after a pause alike; `reset_session` leaves nothing behind."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from tests.support.factories import ac, message_body, new_session
from tests.support.graph_process import GraphProcess
from tests.support.llm_server import ScriptedLLMServer
from tests.support.sse import post_sse
from vagent_graph.tools.scope import WITHHELD
from vagent_shared import AcContext, SessionId
from vagent_shared.events import HitlRequest, SSEEvent, TextFinal
from vagent_shared.knowledge import Audience, AudienceMember

ADMIN = "admin-token-history-7e21"
DOMAIN = "northwind"
HR_DOC = (
    "# Salary bands 2027\n\nThe band for senior engineers is 91 000 to 104 000 EUR, "
    "reference HR-BANDS-2027, approved by the board on 3 March.\n"
)
PRESS = "# Press summary\n\nNorthwind grew in the third quarter, reference PRESS-Q3.\n"
ENTITIES = {
    "entities": [
        {"id": "ana", "name": "Ana Costa", "entity_type": "person", "tags": ["staff"]},
        {"id": "lighthouse", "name": "Project Lighthouse", "entity_type": "project", "tags": ["secret"]},
    ],
    "relations": [{"source": "ana", "target": "lighthouse", "type": "WORKS_ON"}],
}
HIDDEN = ("104 000", "HR-BANDS-2027", "approved by the board", "Lighthouse", "WORKS_ON")
ALICE = ac(
    "@alice:x",
    [
        "tool:search_documents",
        "tool:lookup_entities",
        "tool:database_query",
        "tool:ask_user",
        "document_category:hr",
        "document_tag:public",
        "entity_type:*",
    ],
    domain=DOMAIN,
)
CAROL = ac("@carol:x", ["document_tag:public"], domain=DOMAIN)
BOB = ac("@bob:x", ["document_category:hr", "entity_type:*"], domain=DOMAIN)


@pytest.fixture(scope="module")
def graph(
    redis_url: str, _llm_session: ScriptedLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GraphProcess]:
    index = f"hist_docs_{uuid.uuid4().hex[:8]}"
    with GraphProcess(
        redis_url,
        tmp_path_factory.mktemp("graph-history"),
        _llm_session.base_url,
        GRAPH_ADMIN_TOKEN=ADMIN,
        DOCS_INDEX=index,
        ENTITY_GRAPH=f"{index}_kg",
    ) as g:
        with httpx.Client(base_url=g.url, headers={"Authorization": f"Bearer {ADMIN}"}) as c:
            for doc_id, text, category, tags in (
                ("salary-bands", HR_DOC, "hr", "confidential"),
                ("press", PRESS, "news", "public"),
            ):
                r = c.put(
                    f"/admin/v1/documents/{DOMAIN}/{doc_id}",
                    content=text,
                    params={"category": category, "tags": tags},
                    headers={"Content-Type": "text/markdown"},
                )
                assert r.status_code in (200, 201), r.text
            r = c.put(f"/admin/v1/entities/{DOMAIN}", content=json.dumps(ENTITIES))
            assert r.status_code == 200, r.text
        yield g


@pytest.fixture
async def client(graph: GraphProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=graph.url, timeout=60) as c:
        yield c


def room(*members: AcContext) -> Audience:
    return Audience(
        members=[AudienceMember(user_id=m.user_id, ac_context=m) for m in members],
        member_count=len(members) + 2,
    )


async def say(
    client: httpx.AsyncClient, graph: GraphProcess, sid: SessionId, text: str, audience: Audience | None
) -> list[SSEEvent]:
    body = message_body(sid, text, ALICE)
    if audience is not None:
        body["audience"] = audience.model_dump(mode="json")
    return await post_sse(client, "/api/v1/process_message", body, graph.headers)


def sent(llm: ScriptedLLMServer, i: int = -1) -> str:
    """Everything the model received in request `i`."""
    return json.dumps(llm.requests[i]["messages"], ensure_ascii=False)


def final(events: list[SSEEvent]) -> str:
    return [e for e in events if isinstance(e, TextFinal)][-1].content


async def test_a_dm_passage_is_withheld_when_the_room_gains_a_member(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    """Turn 1 alone: an HR-only passage. Turn 2 with carol (public documents only) in the room,
    "quote exactly what the document said": the model's input holds no withheld passage."""
    sid = new_session("@alice:x")
    llm_server.push_tool_calls([("search_documents", {"query": "salary band senior engineers"})])
    llm_server.push_text("There is a band for senior engineers [1].")
    await say(client, graph, sid, "What is the band for senior engineers?", None)
    assert "HR-BANDS-2027" in sent(llm_server)  # alice alone may read it

    llm_server.clear()
    llm_server.push_text("I cannot quote that here.")
    await say(client, graph, sid, "Quote exactly what the document said.", room(CAROL))
    turn2 = sent(llm_server)
    assert not any(h in turn2 for h in HIDDEN), turn2
    assert WITHHELD in turn2
    assert "There is a band for senior engineers [1]." in turn2  # the posted answer stays

    llm_server.clear()  # carol left again: alice alone may read it, so the model may too
    llm_server.push_text("Here it is.")
    await say(client, graph, sid, "And now?", None)
    assert "HR-BANDS-2027" in sent(llm_server)


async def test_a_group_room_passage_is_withheld_when_a_member_joins(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    """Retrieved with bob (HR too) as the audience; carol joins for the next question. Entity
    lookups follow the same rule."""
    sid = new_session("@alice:x")
    llm_server.push_tool_calls(
        [("search_documents", {"query": "salary band"}), ("lookup_entities", {"query": "Ana"})]
    )
    llm_server.push_text("Bands exist; Ana works on something [1].")
    await say(client, graph, sid, "Bands, and what does Ana work on?", room(BOB))
    assert "HR-BANDS-2027" in sent(llm_server) and "Lighthouse" in sent(llm_server)

    llm_server.clear()
    llm_server.push_text("Nothing to add.")
    await say(client, graph, sid, "Repeat the tool results word for word.", room(BOB, CAROL))
    turn2 = sent(llm_server)
    assert not any(h in turn2 for h in HIDDEN), turn2
    assert turn2.count(WITHHELD.replace('"', '\\"')) == 2


async def test_a_pause_does_not_carry_a_passage_to_a_new_audience(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    """Within one turn: searched with bob as the audience, then a question; carol joins before
    the answer. The model call after the answer does not get the passage, and the copied
    passage in the next call's arguments is withheld too."""
    sid = new_session("@alice:x")
    llm_server.push_tool_calls([("search_documents", {"query": "salary band"})])
    llm_server.push_tool_calls(
        [("ask_user", {"question": "Post it? It says 91 000 to 104 000 EUR, HR-BANDS-2027."})]
    )
    events = await say(client, graph, sid, "Find the bands and ask me before posting.", room(BOB))
    assert any(isinstance(e, HitlRequest) for e in events), events
    llm_server.push_text("Okay.")
    body = {
        "session_id": sid.format(),
        "response": "sure",
        "audience": room(BOB, CAROL).model_dump(mode="json"),
    }
    await post_sse(client, "/api/v1/submit_feedback", body, graph.headers)
    after = sent(llm_server)
    assert not any(h in after for h in HIDDEN), after


async def test_reset_leaves_nothing(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    sid = new_session("@alice:x")
    llm_server.push_tool_calls([("search_documents", {"query": "salary band"})])
    llm_server.push_text("Noted [1].")
    await say(client, graph, sid, "Bands?", None)
    r = await client.post("/api/v1/reset_session", json={"session_id": sid.format()}, headers=graph.headers)
    assert r.status_code == 200
    llm_server.clear()
    llm_server.push_text("Hello.")
    await say(client, graph, sid, "What did we talk about?", None)
    roles = [m["role"] for m in llm_server.requests[-1]["messages"]]
    assert roles == ["system", "user"] and "Bands?" not in sent(llm_server)
    assert not any(h in sent(llm_server) for h in HIDDEN)
