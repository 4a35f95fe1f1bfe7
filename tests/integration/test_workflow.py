"""The workflow in-process against the real Redis checkpointer and a scripted
OpenAI-compatible server reached over HTTP by langchain-openai."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.redis.ashallow import AsyncShallowRedisSaver
from langgraph.types import Command
from redis.asyncio import Redis

from tests.support.factories import ac, new_session
from tests.support.llm_server import ScriptedLLMServer, TextResponse, ToolCallResponse
from vagent_graph.agents.descriptor import AgentDescriptor, load_descriptor
from vagent_graph.services import Services
from vagent_graph.services.records import RecordsDb, ensure_records_db
from vagent_graph.tools import ToolRegistry
from vagent_graph.tools.catalogue import default_registry
from vagent_graph.turn.events import stream_run
from vagent_graph.workflow.graph import Deps, build_graph, new_turn_input
from vagent_graph.workflow.hitl import CANCEL_RESUME
from vagent_shared import AcContext
from vagent_shared.events import HitlRequest, SSEEvent, TextFinal


class Harness:
    """The compiled workflow on the real Redis checkpointer and the scripted LLM."""

    def __init__(self, graph: Any, db: Path, redis: Redis) -> None:
        self.graph, self.db, self.redis = graph, db, redis

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        redis_url: str,
        llm_url: str,
        db: Path,
        registry: ToolRegistry | None = None,
        agent: AgentDescriptor | None = None,
        *services: Any,
        **options: Any,
    ) -> AsyncIterator[Harness]:
        """`services` besides the records DB (an AuditTrail, ...); `options`: Deps fields."""
        ensure_records_db(db)
        redis = Redis.from_url(redis_url)
        saver = AsyncShallowRedisSaver(redis_client=redis, ttl={"default_ttl": 60, "refresh_on_read": True})
        await saver.asetup()
        llm = ChatOpenAI(
            model="test-model",
            base_url=llm_url,
            api_key="k",  # type: ignore[arg-type]
            streaming=True,
            stream_usage=True,
            max_retries=0,
        )
        deps = Deps(
            registry or default_registry(),
            agent or load_descriptor(),
            llm,
            "test-model",
            Services(RecordsDb(db), *services),
            **options,
        )
        try:
            yield cls(build_graph(deps, saver), db, redis)
        finally:
            await redis.aclose()

    async def _run(self, sid: str, graph_input: Any) -> list[SSEEvent]:
        return [
            e async for e in stream_run(self.graph, graph_input, {"configurable": {"thread_id": sid}}, 30)
        ]

    async def say(self, sid: str, text: str, user_ac: AcContext) -> list[SSEEvent]:
        return await self._run(sid, new_turn_input(text, user_ac))

    async def answer(self, sid: str, text: Any, update: dict[str, Any] | None = None) -> list[SSEEvent]:
        return await self._run(sid, Command(resume=text, update=update))

    def count(self, where: str = "1=1") -> int:
        with sqlite3.connect(self.db) as c:
            return int(c.execute(f"SELECT COUNT(*) FROM records WHERE {where}").fetchone()[0])


@pytest.fixture
async def wf(redis_url: str, llm_server: ScriptedLLMServer, tmp_path: Path) -> AsyncIterator[Harness]:
    async with Harness.open(redis_url, llm_server.base_url, tmp_path / "records.db") as h:
        yield h


def final(events: list[SSEEvent]) -> str:
    finals = [e for e in events if isinstance(e, TextFinal)]
    assert finals, events
    return finals[-1].content


def question(events: list[SSEEvent]) -> HitlRequest:
    qs = [e for e in events if isinstance(e, HitlRequest)]
    assert len(qs) == 1, events
    return qs[0]


def tool_results(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


async def test_withheld_tools_are_never_named_to_the_llm(wf: Harness, llm_server: ScriptedLLMServer) -> None:
    sid = new_session().format()
    llm_server.push_text("Hello there, reader.")
    events = await wf.say(sid, "hi", ac(instances=["tool:database_query"]))
    assert final(events) == "Hello there, reader."
    req = llm_server.requests[-1]
    assert llm_server.offered_tool_names() == ["database_query"]
    # not in the tool list, not in the system prompt or anywhere else in the request
    assert "delete_records" not in str(req) and "ask_user" not in str(req)


async def test_no_tools_at_all_sends_no_tool_list(wf: Harness, llm_server: ScriptedLLMServer) -> None:
    llm_server.push_text("Just chatting.")
    await wf.say(new_session().format(), "hi", ac(instances=[]))
    assert "tools" not in llm_server.requests[-1]


async def test_a_tool_the_llm_invents_or_was_not_offered_never_runs(
    wf: Harness, llm_server: ScriptedLLMServer
) -> None:
    sid = new_session().format()
    before = wf.count()
    llm_server.push_tool_calls([("delete_records", {"older_than": "2030-01-01"}), ("drop_everything", {})])
    llm_server.push_text("I could not do that.")
    events = await wf.say(sid, "wipe it all", ac(instances=["tool:database_query"]))
    assert not any(isinstance(e, HitlRequest) for e in events)  # no confirmation even asked
    assert wf.count() == before
    results = tool_results(llm_server.requests[-1])
    assert results == ["I can't do that here.", "I can't do that here."]  # never the tool's name
    assert final(events) == "I could not do that."


async def test_confirmation_states_the_real_count_and_yes_deletes(
    wf: Harness, llm_server: ScriptedLLMServer
) -> None:
    sid = new_session().format()
    n = wf.count("created_at < '2018-01-01'")
    assert n > 0
    llm_server.push_tool_calls([("delete_records", {"older_than": "2018-01-01"})])
    q = question(await wf.say(sid, "delete records older than 2018", ac()))
    assert q.question == f"Delete {n} records older than 2018-01-01?"
    assert q.options == ["yes", "no"] and q.timeout_seconds == 3600
    assert wf.count("created_at < '2018-01-01'") == n  # nothing happens while waiting

    llm_server.push_text("Done: old records removed.")
    events = await wf.answer(sid, "yes")
    assert final(events) == "Done: old records removed."
    assert wf.count("created_at < '2018-01-01'") == 0
    assert tool_results(llm_server.requests[-1]) == [f"Deleted {n} records older than 2018-01-01."]


async def test_invalid_answer_asks_again_and_no_cancels(wf: Harness, llm_server: ScriptedLLMServer) -> None:
    sid = new_session().format()
    before = wf.count()
    llm_server.push_tool_calls([("delete_records", {"older_than": "2019-01-01"})])
    q1 = question(await wf.say(sid, "delete old", ac()))
    q2 = question(await wf.answer(sid, "maybe"))
    assert q2.interrupt_id != q1.interrupt_id
    assert q2.question.startswith("Please answer yes or no.")
    assert len(llm_server.requests) == 1  # the LLM is not bothered by a wrong answer
    llm_server.push_text("Okay, nothing was deleted.")
    events = await wf.answer(sid, "No")
    assert final(events) == "Okay, nothing was deleted."
    assert wf.count() == before
    assert tool_results(llm_server.requests[-1]) == [
        "The user said no: delete_records was NOT run; nothing was changed. Tell them so."
    ]


async def test_clarification_with_options_and_free_text(wf: Harness, llm_server: ScriptedLLMServer) -> None:
    sid = new_session().format()
    llm_server.push_tool_calls(
        [("ask_user", {"question": "Which database?", "options": ["production", "staging"]})]
    )
    q = question(await wf.say(sid, "count things", ac()))
    assert (q.question, q.options) == ("Which database?", ["production", "staging"])
    assert question(await wf.answer(sid, "prod")).options == ["production", "staging"]
    llm_server.push_tool_calls([("ask_user", {"question": "Your name?"})])
    q3 = question(await wf.answer(sid, "STAGING"))
    assert q3.options == []
    llm_server.push_text("Thanks, Ada.")
    assert final(await wf.answer(sid, "Ada Lovelace")) == "Thanks, Ada."
    assert tool_results(llm_server.requests[-1]) == [
        "The user answered: staging",
        "The user answered: Ada Lovelace",
    ]


async def test_access_is_checked_again_when_the_confirmed_tool_runs(
    wf: Harness, llm_server: ScriptedLLMServer
) -> None:
    sid = new_session().format()
    before = wf.count()
    llm_server.push_tool_calls([("delete_records", {"older_than": "2021-01-01"})])
    question(await wf.say(sid, "delete", ac()))
    # between question and answer the user lost the grant; the fresh context comes with the answer
    revoked = ac(instances=["tool:database_query"]).to_wire()
    llm_server.push_text("You no longer have access.")
    await wf.answer(sid, "yes", update={"ac_context": revoked})
    assert wf.count() == before
    assert tool_results(llm_server.requests[-1]) == ["I can't do that here."]


async def test_stale_question_is_closed_and_no_dangling_call_reaches_the_llm(
    wf: Harness, llm_server: ScriptedLLMServer
) -> None:
    sid = new_session().format()
    before = wf.count()
    llm_server.push_tool_calls(
        [("delete_records", {"older_than": "2022-01-01"}), ("database_query", {"sql": "select 1"})]
    )
    question(await wf.say(sid, "delete", ac()))
    await wf.answer(sid, CANCEL_RESUME)  # what the API does when a new message arrives
    state = await wf.graph.aget_state({"configurable": {"thread_id": sid}})
    assert not state.interrupts
    llm_server.push_text("Fresh answer.")
    assert final(await wf.say(sid, "something else", ac())) == "Fresh answer."
    assert wf.count() == before
    msgs = llm_server.requests[-1]["messages"]
    call_ids = [tc["id"] for m in msgs if m["role"] == "assistant" for tc in m.get("tool_calls", [])]
    answered = [m["tool_call_id"] for m in msgs if m["role"] == "tool"]
    assert call_ids and sorted(call_ids) == sorted(answered)
    assert len(llm_server.requests) == 2  # closing the question cost no LLM call


async def test_max_turns_bounds_a_tool_loop(wf: Harness, llm_server: ScriptedLLMServer) -> None:
    llm_server.set_default(lambda req: ToolCallResponse([("database_query", {"sql": "select 1"})]))
    events = await wf.say(new_session().format(), "loop forever", ac())
    assert "stopped after 8 steps" in final(events)
    assert len(llm_server.requests) == 8


async def test_llm_failure_is_a_short_error_event(wf: Harness, llm_server: ScriptedLLMServer) -> None:
    llm_server.push_error(500, "upstream exploded: secret=abc")
    events = await wf.say(new_session().format(), "hi", ac())
    err = [e for e in events if e.EVENT == "error"]
    assert len(err) == 1 and err[0].error_code == "llm_unavailable"  # type: ignore[union-attr]
    assert "secret" not in err[0].message  # type: ignore[union-attr]


async def test_stored_history_stays_bounded(
    redis_url: str, llm_server: ScriptedLLMServer, tmp_path: Path
) -> None:
    agent = load_descriptor()
    agent = agent.model_copy(
        update={"history": agent.history.model_copy(update={"max_messages": 6, "max_context_tokens": 300})}
    )
    async with Harness.open(redis_url, llm_server.base_url, tmp_path / "r.db", agent=agent) as h:
        await _chat_15_turns(h, llm_server)


async def _chat_15_turns(h: Harness, llm_server: ScriptedLLMServer) -> None:
    sid = new_session().format()
    llm_server.set_default(lambda req: TextResponse("answer " * 40))
    for i in range(15):
        await h.say(sid, f"question {i} " + "padding " * 40, ac())
    state = await h.graph.aget_state({"configurable": {"thread_id": sid}})
    assert len(state.values["messages"]) <= 6
    assert "question 14" in str(state.values["messages"])
    sent = llm_server.requests[-1]["messages"]
    assert len(sent) < 8 and "question 0 " not in str(sent)


async def test_a_new_tool_needs_no_workflow_change(
    redis_url: str, llm_server: ScriptedLLMServer, tmp_path: Path
) -> None:
    from pydantic import BaseModel

    from vagent_graph.tools import Tool, ToolContext

    class EchoArgs(BaseModel):
        text: str

    async def echo(args: EchoArgs, ctx: ToolContext, _: str | None) -> str:
        return f"echo for {ctx.ac.user_id}: {args.text}"

    registry = default_registry()
    registry.register(
        Tool(
            name="echo",
            description="Echo text back.",
            args_model=EchoArgs,
            run=echo,
            requires_confirmation=True,
        )
    )
    agent = load_descriptor()
    agent = agent.model_copy(update={"tools": [*agent.tools, "echo"]})
    async with Harness.open(redis_url, llm_server.base_url, tmp_path / "r.db", registry, agent) as h:
        await _confirm_echo(h, llm_server)


async def _confirm_echo(h: Harness, llm_server: ScriptedLLMServer) -> None:
    sid = new_session().format()
    llm_server.push_tool_calls([("echo", {"text": "hi"})])
    q = question(await h.say(sid, "echo hi", ac(instances=["tool:echo"])))
    assert q.question == "Use the echo tool?\n`text`: `hi`" and q.options == ["yes", "no"]
    assert llm_server.offered_tool_names(0) == ["echo"]
    llm_server.push_text("Echoed.")
    assert final(await h.answer(sid, "yes")) == "Echoed."
    assert tool_results(llm_server.requests[-1]) == ["echo for @alice:localhost: hi"]
