"""End to end in Matrix: a cited answer from the documents, and the room audience: alice (who
may read the confidential financials) asks in a room with carol (who may read only public
documents) and gets nothing of what carol may not read; the same question in a DM gets it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.e2e.conftest import DOMAIN, Stack
from tests.e2e.test_bot_e2e import dm_with_bot, tenant_room
from tests.support.knowledge import doc_store, ingest
from tests.support.llm_server import ScriptedLLMServer
from tests.support.matrix_human import HumanClient, Msg

pytestmark = pytest.mark.e2e


@pytest.fixture
async def q3(stack: Stack) -> AsyncIterator[dict[str, str]]:
    """Two documents in the stack's index (the service's default one): their ids."""
    ids = {"press": f"q3-press-{uuid.uuid4().hex[:6]}", "secret": f"q3-financials-{uuid.uuid4().hex[:6]}"}
    async with doc_store(stack.redis_url, index="vagent_docs") as store:
        await ingest(
            store,
            ids["press"],
            "# Q3 press summary\n\nRevenue grew by more than 20 percent in the third quarter.",
            domain=DOMAIN,
            category="finance",
            tags=("public", "q3"),
        )
        await ingest(
            store,
            ids["secret"],
            "# Q3 financials\n\nQ3 revenue was EUR 18.4 million (FIN-Q3-2026), confidential.",
            domain=DOMAIN,
            category="finance",
            tags=("confidential", "q3"),
        )
        yield ids
        for doc_id in ids.values():
            await store.delete(DOMAIN, doc_id)


def searching(llm: ScriptedLLMServer, answer: str) -> None:
    """The model searches the documents, then answers (citing passage [1])."""
    llm.push_tool_calls([("search_documents", {"query": "Q3 revenue"})])
    llm.push_text(answer)


def tool_result(llm: ScriptedLLMServer) -> str:
    messages: list[dict[str, Any]] = llm.requests[-1]["messages"]
    return str([m for m in messages if m["role"] == "tool"][-1]["content"])


def final(text: str) -> Any:
    return lambda m: m.body.startswith(text) and "Sources:" in m.body and m.formatted_body is not None


async def test_a_dm_answer_cites_its_sources(
    stack: Stack, alice: HumanClient, llm: ScriptedLLMServer, q3: dict[str, str]
) -> None:
    room = await dm_with_bot(alice, stack)
    searching(llm, "Q3 revenue was EUR 18.4 million [1].")
    await alice.send(room, "What was the Q3 revenue?")
    reply: Msg = await alice.wait_for_reply(
        stack.users.bot, room, final("Q3 revenue was EUR 18.4 million [1].")
    )
    assert "EUR 18.4 million" in tool_result(llm)  # alice may read the financials
    assert reply.body.endswith(f"Sources:\n- [1] Q3 financials (`{q3['secret']}`)")
    assert "<li>" in (reply.formatted_body or "") and q3["secret"] in (reply.formatted_body or "")


async def test_in_a_room_with_carol_alice_gets_only_what_carol_may_read(
    stack: Stack, alice: HumanClient, carol: HumanClient, llm: ScriptedLLMServer, q3: dict[str, str]
) -> None:
    room = await tenant_room(alice, "q3 review", [stack.users.bot, stack.users.carol])
    searching(llm, "Revenue grew [1].")
    await alice.send(room, "!ai What was the Q3 revenue?")
    reply = await alice.wait_for_reply(stack.users.bot, room, final("Revenue grew [1]."))
    result = tool_result(llm)
    assert "18.4" not in result and q3["secret"] not in result and "Q3 financials" not in result
    assert "everyone in this room" in result and "more than 20 percent" in result
    assert reply.body.endswith(f"Sources:\n- [1] Q3 press summary (`{q3['press']}`)")
    # what carol sees in the room is the same message, with nothing of the financials in it
    seen = await carol.wait_for_reply(stack.users.bot, room, final("Revenue grew [1]."))
    assert q3["secret"] not in seen.body and "18.4" not in seen.body
