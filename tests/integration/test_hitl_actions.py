"""A confirmation carries what "yes" runs (`HitlRequest.actions`): the tool's name and every
argument, masked as the question masks them. The gateway offers them to LangGraph clients as
`action_requests`; a question that runs no tool carries none.

The real graph service over HTTP, on the scripted OpenAI-compatible LLM and the real Redis;
each test in a tenant of its own (its own demo records database).
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from langgraph.types import Interrupt
from redis.asyncio import Redis

from tests.support.confirmations import Hidden, read_back
from tests.support.factories import ac, message_body, new_session
from tests.support.graph_process import GraphProcess
from tests.support.llm_server import ScriptedLLMServer
from tests.support.sse import kinds, post_sse
from vagent_graph.state.checkpointer import open_checkpointer
from vagent_graph.tools.confirmation import MASK, question_text, shown_arguments
from vagent_shared import AcContext, SessionId
from vagent_shared.events import HitlAction, HitlRequest, SSEEvent, TextFinal

PM = "/api/v1/process_message"
FB = "/api/v1/submit_feedback"
TOOLS = ["tool:database_query", "tool:delete_records", "tool:ask_user", "tool:create_ticket"]


@pytest.fixture(scope="module")
def graph(
    redis_url: str, _llm_session: ScriptedLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GraphProcess]:
    with GraphProcess(redis_url, tmp_path_factory.mktemp("graph-hitl-actions"), _llm_session.base_url) as g:
        yield g


@pytest.fixture
async def client(graph: GraphProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=graph.url, timeout=30) as c:
        yield c


def person() -> tuple[SessionId, AcContext]:
    """A new conversation of a person in a tenant of their own (a fresh records database)."""
    sid = new_session(f"@u{uuid.uuid4().hex[:8]}:localhost")
    return sid, ac(sid.user_id, TOOLS, domain=f"t{uuid.uuid4().hex[:8]}")


async def ask(client: httpx.AsyncClient, graph: GraphProcess, text: str) -> tuple[SessionId, list[SSEEvent]]:
    sid, who = person()
    return sid, await post_sse(client, PM, message_body(sid, text, who), graph.headers)


async def answer(
    client: httpx.AsyncClient, graph: GraphProcess, sid: SessionId, q: HitlRequest, response: str
) -> list[SSEEvent]:
    body = {"session_id": sid.format(), "response": response, "interrupt_id": q.interrupt_id}
    return await post_sse(client, FB, body, graph.headers)


def the_question(events: list[SSEEvent]) -> HitlRequest:
    assert kinds(events)[-2:] == ["hitl_request", "done"], kinds(events)
    q = events[-2]
    assert isinstance(q, HitlRequest)
    return q


async def saved_interrupts(redis_url: str, sid: SessionId) -> tuple[list[Any], dict[str, Any]]:
    """What the checkpoint keeps of the pending question: the interrupt values and the saved
    confirmation (`AgentState.action`), read with the graph's own checkpointer."""
    redis = Redis.from_url(redis_url)
    try:
        saver = await open_checkpointer(redis, 60)
        saved = await saver.aget_tuple({"configurable": {"thread_id": sid.format(), "checkpoint_ns": ""}})
        assert saved is not None
        values = [
            i.value
            for _, channel, value in saved.pending_writes or []
            if channel == "__interrupt__"
            for i in value
            if isinstance(i, Interrupt)
        ]
        return values, dict(saved.checkpoint["channel_values"].get("action") or {})
    finally:
        await redis.aclose()


async def test_a_deletions_question_carries_the_tool_and_every_argument(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    llm_server.push_tool_calls([("delete_records", {"older_than": "2016-01-01"})])
    sid, events = await ask(client, graph, "delete the old records")
    q = the_question(events)
    # the headline states the date itself (the question lists no argument line), but the action
    # has every argument: a client shows what will run, not a sentence about it
    assert q.question.startswith("Delete ") and "2016-01-01" in q.question
    assert q.actions == [HitlAction(name="delete_records", args={"older_than": "2016-01-01"})]
    # what "yes" runs is what ran
    llm_server.push_text("Done.")
    after = await answer(client, graph, sid, q, "yes")
    assert kinds(after)[-2:] == ["text_final", "done"]
    tool_results = [m for m in llm_server.requests[-1]["messages"] if m["role"] == "tool"]
    assert (
        tool_results[-1]["content"].startswith("Deleted ")
        and "older than 2016-01-01" in tool_results[-1]["content"]
    )


async def test_a_secret_looking_argument_is_masked_in_the_question_the_actions_and_the_checkpoint(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer, redis_url: str
) -> None:
    key = f"sk-proj-{secrets.token_hex(16)}"
    arguments = {
        "title": "VPN down",
        "description": f"It fails with my key {key} since Monday",
        "priority": "high",
    }
    llm_server.push_tool_calls([("create_ticket", arguments)])
    sid, events = await ask(client, graph, "open a ticket about the VPN")
    q = the_question(events)
    shown = read_back(q.question)
    assert shown[("description",)] == f"It fails with my key {MASK} since Monday"
    [action] = q.actions
    assert action.name == "create_ticket"
    assert action.args == {
        "title": "VPN down",
        "description": f"It fails with my key {MASK} since Monday",  # masked exactly as the question shows it
        "priority": "high",
    }
    assert key not in q.model_dump_json()
    values, saved = await saved_interrupts(redis_url, sid)
    assert values and all(v["actions"] == [action.model_dump()] for v in values)
    assert saved["actions"] == [action.model_dump()]
    assert key not in str(values) and key not in str(saved)
    # a wrong answer asks again: the same actions
    again = the_question(await answer(client, graph, sid, q, "maybe"))
    assert again.actions == q.actions and again.interrupt_id != q.interrupt_id
    llm_server.push_text("Not created.")
    assert kinds(await answer(client, graph, sid, again, "no"))[-2:] == ["text_final", "done"]


async def test_two_calls_in_one_reply_are_asked_in_turn_each_listing_its_own_action(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    """The graph asks one call at a time (workflow.py): each question lists exactly the call
    that "yes" to it runs; together they list both."""
    ticket = {"title": "Archive cleanup", "description": "", "priority": "low"}
    llm_server.push_tool_calls([("delete_records", {"older_than": "2017-01-01"}), ("create_ticket", ticket)])
    sid, events = await ask(client, graph, "delete old records and open a ticket about it")
    first = the_question(events)
    assert first.actions == [HitlAction(name="delete_records", args={"older_than": "2017-01-01"})]
    second = the_question(await answer(client, graph, sid, first, "yes"))
    assert second.actions == [HitlAction(name="create_ticket", args=ticket)]
    llm_server.push_text("Deleted; no ticket.")
    done = await answer(client, graph, sid, second, "no")
    assert [e.content for e in done if isinstance(e, TextFinal)] == ["Deleted; no ticket."]


async def test_a_question_that_runs_no_tool_carries_no_action(
    client: httpx.AsyncClient, graph: GraphProcess, llm_server: ScriptedLLMServer, redis_url: str
) -> None:
    llm_server.push_tool_calls(
        [("ask_user", {"question": "Which environment?", "options": ["prod", "staging"]})]
    )
    sid, events = await ask(client, graph, "deploy it")
    q = the_question(events)
    assert q.question == "Which environment?" and q.options == ["prod", "staging"]
    assert q.actions == []
    values, _ = await saved_interrupts(redis_url, sid)
    assert [v["actions"] for v in values] == [[]]
    llm_server.push_text("Staging it is.")
    assert kinds(await answer(client, graph, sid, q, "staging"))[-2:] == ["text_final", "done"]


# ---- the actions' masking is the question's (pure) ----------------------------------------------
def test_actions_mask_what_the_question_masks_at_every_depth() -> None:
    key = f"ghp_{secrets.token_hex(16)}"
    arguments = {
        "title": "Rotate",
        "password": "hunter2-long-enough",  # a secret's name: hidden whole, whatever the value
        "notes": f"use Bearer {key}",  # a secret's shape: that part hidden
        "options": {"api_key": {"v": 1}, "plain": [f"x {key}", 3, None, True]},
        "deep": {"a": {"b": {"c": {"token": "abc", "ok": "fine"}}}},  # deeper than the question's lines
        "hidden\u200bname": "a\u202eb",  # invisible characters: escaped, as the question shows them
        "empty_secret": "",
    }
    shown = shown_arguments(arguments)
    assert shown["title"] == "Rotate"
    assert shown["password"] == MASK
    assert shown["notes"] == f"use {MASK}"
    assert shown["options"] == {"api_key": MASK, "plain": [f"x {MASK}", 3, None, True]}
    assert shown["deep"] == {"a": {"b": {"c": {"token": MASK, "ok": "fine"}}}}
    assert shown["hidden\\u200bname"] == "a\\u202eb"
    assert shown["empty_secret"] == ""
    assert key not in str(shown) and "hunter2" not in str(shown) and "abc" not in str(shown)
    # what the question shows of the same call reads the same (a value hidden whole: MASK)
    question = read_back(question_text("Rotate the key", arguments))
    assert question[("title",)] == shown["title"] and question[("notes",)] == shown["notes"]
    assert question[("password",)] == Hidden(len("hunter2-long-enough"))
    assert question[("options", "plain", 0)] == shown["options"]["plain"][0]
    assert question[("options", "api_key", "v")] == Hidden(1)
