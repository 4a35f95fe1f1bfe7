"""A confirmation binds the action: it shows every argument the call will use, and "yes" runs
exactly that, once; if the world changed meanwhile, the human is asked again.

The workflow in-process on the real Redis checkpointer, with the scripted OpenAI-compatible
LLM over HTTP (tests/integration/test_workflow.py's Harness)."""

from __future__ import annotations

import asyncio
import re
import secrets
import sqlite3
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY
from pydantic import BaseModel
from redis.asyncio import Redis

from tests.integration.test_workflow import Harness, final, question, tool_results
from tests.support.confirmations import expected, read_back
from tests.support.factories import ac, new_session
from tests.support.llm_server import ScriptedLLMServer, TextResponse, ToolCallResponse
from vagent_graph.agents.descriptor import AgentDescriptor, load_descriptor
from vagent_graph.observability.recorder import TurnRecorder, new_trace
from vagent_graph.tools import NothingToDo, Prepared, Tool, ToolContext
from vagent_graph.tools.catalogue import default_registry
from vagent_graph.tools.confirmation import render_question
from vagent_graph.tools.schedule import Scheduling
from vagent_graph.turn.events import stream_run
from vagent_graph.workflow.graph import new_turn_input
from vagent_shared.audit import AuditEvent
from vagent_shared.audit_trail import AuditTrail
from vagent_shared.events import HitlRequest, SSEEvent
from vagent_shared.schedule_store import ScheduleStore

CUTOFF = "2016-01-01"
OLD = f"created_at < '{CUTOFF}'"


@pytest.fixture
async def wf(redis_url: str, llm_server: ScriptedLLMServer, tmp_path: Path) -> AsyncIterator[Harness]:
    async with Harness.open(redis_url, llm_server.base_url, tmp_path / "records.db") as h:
        yield h


def every_tool_confirmed() -> AgentDescriptor:
    """The packaged agent with every registered tool enabled and in `hitl.confirm_tools`."""
    names = default_registry().names()
    agent = load_descriptor()
    return agent.model_copy(
        update={"tools": names, "hitl": agent.hitl.model_copy(update={"confirm_tools": names})}
    )


# ---- every tool's confirmation shows every argument ------------------------------------------
def _string(spec: dict[str, Any], name: str, variant: str, tag: str) -> str:
    low, high = int(spec.get("minLength", 0)), int(spec.get("maxLength", 4000))
    if variant == "secret":
        value = f"{name} sk-proj-{secrets.token_hex(16)} {tag}"
    elif variant == "long":
        line = f"{name}-{tag} line of text that keeps going "
        value = "\n".join(line for _ in range(high // len(line) + 1))[:high]
        value = value[: high - len(tag) - 4] + f" END{tag}"
    else:
        value = f"{name}-{tag}"
    return value[:high] if len(value) >= low else value.ljust(low, "x")


def example(spec: dict[str, Any], name: str, variant: str, tag: str) -> Any:
    """A value for one argument of a tool's JSON schema. A type this does not know fails the
    test, so a new tool's author extends it rather than skipping the check."""
    spec = next((s for s in spec.get("anyOf", []) if s.get("type") != "null"), spec)
    if "enum" in spec:
        return spec["enum"][-1]
    kind = spec.get("type")
    if kind == "string" and spec.get("format") == "date":
        return "2030-01-01"
    if kind == "string":
        return _string(spec, name, variant, tag)
    if kind == "integer":
        return int(spec.get("maximum", 7))
    if kind == "boolean":
        return True
    if kind == "array":
        items = spec.get("items", {})
        return [example(items, f"{name}{i}", variant, tag) for i in range(min(2, spec.get("maxItems", 2)))]
    raise AssertionError(f"no example for argument {name!r} of type {kind!r}: extend this test")


#: Arguments a tool needs to make sense at all (its `prepare` refuses others before asking):
#: schedule_task takes exactly one of at/every/cron, and a real interval.
VALID: dict[str, dict[str, Any]] = {"schedule_task": {"every": "2h"}}
LEFT_OUT: dict[str, tuple[str, ...]] = {"schedule_task": ("at", "cron")}


def arguments_for(tool: Tool, variant: str) -> dict[str, Any]:
    schema = tool.openai_schema()["function"]["parameters"]
    tag = secrets.token_hex(3)
    made = {n: example(s, n, variant, tag) for n, s in schema.get("properties", {}).items()}
    made = {n: v for n, v in made.items() if n not in LEFT_OUT.get(tool.name, ())}
    return made | VALID.get(tool.name, {})


def check_shown(question_text: str, arguments: dict[str, Any], tool: Tool) -> None:
    """The question, read back as a person reads it, is exactly the call's arguments: long
    values whole, secret-looking parts masked (tests/support/confirmations.py); an argument
    the tool's headline states word for word (`Tool.shows`) is in the headline instead."""
    headline = question_text.split("\n", 1)[0]
    stated = {n for n in tool.shows if n in arguments and str(arguments[n]) in headline}
    listed = {n: v for n, v in arguments.items() if n not in stated}
    assert read_back(question_text) == expected(listed), tool.name
    for key in re.findall(r"sk-proj-[0-9a-f]+", str(arguments)):
        assert key not in question_text, tool.name


async def test_every_tool_confirmation_shows_every_argument(
    redis_url: str, llm_server: ScriptedLLMServer, tmp_path: Path
) -> None:
    """Over the whole registry, built-in tools and plugins alike: no tool can leave an argument
    out of its question, long values are shown whole, secret-looking ones masked."""
    registry = default_registry()
    jobs = Redis.from_url(redis_url)  # schedule_task's store (the question shows its next run)
    async with Harness.open(
        redis_url,
        llm_server.base_url,
        tmp_path / "r.db",
        registry,
        every_tool_confirmed(),
        Scheduling(ScheduleStore(jobs)),
    ) as h:
        for tool in registry:
            for variant in ("plain", "long", "secret"):
                arguments = arguments_for(tool, variant)
                llm_server.clear()
                llm_server.push_tool_calls([(tool.name, arguments)])
                sid = new_session().format()
                q = question(await h.say(sid, f"use {tool.name}", ac(superuser=True)))
                assert q.options == ["yes", "no"], tool.name
                check_shown(q.question, arguments, tool)
                await h.answer(sid, "no")
                assert "The user said no" in tool_results(llm_server.requests[-1])[0], tool.name
    await jobs.aclose()


async def test_confirm_tools_applies_to_a_tool_that_asks_its_own_question(
    redis_url: str, llm_server: ScriptedLLMServer, tmp_path: Path
) -> None:
    """ask_user builds its own question; listed in confirm_tools it is confirmed first."""
    agent = load_descriptor()
    agent = agent.model_copy(update={"hitl": agent.hitl.model_copy(update={"confirm_tools": ["ask_user"]})})
    async with Harness.open(redis_url, llm_server.base_url, tmp_path / "r.db", agent=agent) as h:
        sid = new_session().format()
        llm_server.push_tool_calls([("ask_user", {"question": "Which database?", "options": ["a", "b"]})])
        confirm = question(await h.say(sid, "ask me", ac()))
        assert (
            confirm.question.startswith("Use the ask user tool?\n") and "Which database?" in confirm.question
        )
        asked = question(await h.answer(sid, "yes"))
        assert (asked.question, asked.options) == ("Which database?", ["a", "b"])
        llm_server.push_text("Fine.")
        assert final(await h.answer(sid, "b")) == "Fine."
        assert tool_results(llm_server.requests[-1]) == ["The user answered: b"]


class KeptTrail(AuditTrail):
    """The real audit trail without a stream: the events it recorded, kept for the test."""

    def __init__(self) -> None:
        super().__init__("vagent-graph", None, "unused")
        self.events: list[AuditEvent] = []

    def record(self, *args: Any, **kwargs: Any) -> AuditEvent:
        event = super().record(*args, **kwargs)
        self.events.append(event)
        return event


async def test_a_call_too_long_to_show_whole_is_not_asked_and_the_model_shortens_it(
    redis_url: str, llm_server: ScriptedLLMServer, tmp_path: Path
) -> None:
    """A passage in the middle of a long body is never sent behind a question that cuts it:
    beyond CONFIRM_MAX_CHARS nothing is asked, the model reads the size and the limit, the
    call is refused on record (audit, trace), and the shortened call is asked and runs once."""
    runs: list[str] = []

    class Note(BaseModel):
        body: str

    async def run(args: Note, ctx: ToolContext, _: str | None) -> str:
        runs.append(args.body)
        return "posted"

    registry = default_registry()
    registry.register(Tool("post_note", "Post a note.", Note, run, requires_confirmation=True))
    agent = load_descriptor().model_copy(update={"tools": ["post_note"]})
    trail = KeptTrail()
    body = "filler " * 1000 + "CONFIDENTIAL: the Q3 figures are 18.4 million." + " filler" * 1000
    user = ac(instances=["tool:post_note"])
    async with Harness.open(
        redis_url, llm_server.base_url, tmp_path / "r.db", registry, agent, trail, confirm_max_chars=10_000
    ) as h:
        sid = new_session().format()
        llm_server.push_tool_calls([("post_note", {"body": body})])
        llm_server.push_tool_calls([("post_note", {"body": "A short note."})])
        turn = TurnRecorder(new_trace(sid, user, None))
        config: Any = {"configurable": {"thread_id": sid, "turn": turn}}
        asked = question([e async for e in stream_run(h.graph, new_turn_input("post it", user), config, 30)])
        assert read_back(asked.question) == {("body",): "A short note."}
        size = len(render_question("Use the post note tool?", {"body": body}).text)
        assert size > 10_000
        assert tool_results(llm_server.requests[1]) == [
            f"post_note was NOT run: its arguments are too long to be confirmed (the question showing "
            f"them would be {size} characters, the limit is 10000). Shorten them, e.g. summarise long "
            "text, and call post_note again."
        ]
        refused, short = turn.trace.tool_calls
        assert (refused.outcome, refused.confirmation_asked) == ("refused", False)
        assert refused.arguments == {"body": f"[omitted: {len(body)} chars]"}  # free text: its size
        assert (short.outcome, short.confirmation_asked) == ("asked", True)
        [denied] = [e for e in trail.events if e.decision == "denied"]
        assert (denied.resource, denied.reason) == ("tool:post_note", "unconfirmable: too_long")
        assert runs == []
        llm_server.push_text("Posted.")
        assert final(await h.answer(sid, "yes")) == "Posted."
        assert runs == ["A short note."]


# ---- delete_records acts on what was confirmed, never more --------------------------------------
def insert(db: Path, n: int, created_at: str) -> None:
    with sqlite3.connect(db) as c:
        c.executemany(
            "INSERT INTO records (customer, amount, created_at) VALUES ('Late', 1, ?)", [(created_at,)] * n
        )


def remove(db: Path, n: int) -> None:
    with sqlite3.connect(db) as c:
        c.execute(f"DELETE FROM records WHERE id IN (SELECT id FROM records WHERE {OLD} LIMIT ?)", (n,))


def shown_count(q: HitlRequest) -> int:
    found = re.search(r"Delete (\d+) records? older than " + CUTOFF, q.question)
    assert found, q.question
    return int(found.group(1))


async def test_rows_added_while_the_question_waits_are_not_deleted_the_user_is_asked_again(
    wf: Harness, llm_server: ScriptedLLMServer
) -> None:
    """The issue's case: 129 asked, 500 more arrive, "yes" must not delete 629."""
    sid = new_session().format()
    n = wf.count(OLD)
    llm_server.push_tool_calls([("delete_records", {"older_than": CUTOFF})])
    q = question(await wf.say(sid, f"delete records older than {CUTOFF}", ac()))
    assert q.question == f"Delete {n} records older than {CUTOFF}?"
    insert(wf.db, 500, "2015-06-01")
    again = question(await wf.answer(sid, "yes"))
    assert wf.count(OLD) == n + 500  # nothing deleted on the stale "yes"
    assert again.question.startswith(f"Delete {n + 500} records older than {CUTOFF}?\n")
    assert f"({n} records then); nothing was deleted yet" in again.question
    assert len(llm_server.requests) == 1  # asked again without the model
    llm_server.push_text("Deleted.")
    assert final(await wf.answer(sid, "yes")) == "Deleted."
    assert wf.count(OLD) == 0
    assert tool_results(llm_server.requests[-1]) == [f"Deleted {n + 500} records older than {CUTOFF}."]


async def test_nothing_to_delete_asks_nothing_and_runs_nothing(
    wf: Harness, llm_server: ScriptedLLMServer
) -> None:
    def decided(decision: str) -> float:
        labels = {"tool": "delete_records", "decision": decision}
        return REGISTRY.get_sample_value("vagent_graph_tool_calls_total", labels) or 0.0

    before = {d: decided(d) for d in ("nothing_to_do", "allowed", "confirmed")}
    llm_server.push_tool_calls([("delete_records", {"older_than": "1990-01-01"})])
    llm_server.push_text("There was nothing to delete.")
    events = await wf.say(new_session().format(), "delete records older than 1990", ac())
    assert not any(isinstance(e, HitlRequest) for e in events)
    assert tool_results(llm_server.requests[-1]) == [
        "There are no records older than 1990-01-01; nothing was deleted."
    ]
    assert decided("nothing_to_do") == before["nothing_to_do"] + 1
    assert (decided("allowed"), decided("confirmed")) == (before["allowed"], before["confirmed"])


async def test_a_tool_with_nothing_to_do_is_never_run(
    redis_url: str, llm_server: ScriptedLLMServer, tmp_path: Path
) -> None:
    runs: list[str] = []

    class Args(BaseModel):
        target: str

    async def prepare(args: Args, ctx: ToolContext) -> Prepared | NothingToDo:
        return NothingToDo(f"Nothing matches {args.target}.")

    async def run(args: Args, ctx: ToolContext, _: str | None) -> str:
        runs.append(args.target)
        return "acted"

    registry = default_registry()
    registry.register(Tool("purge", "Purge.", Args, run, prepare=prepare, requires_confirmation=True))
    agent = load_descriptor().model_copy(update={"tools": ["purge"]})
    async with Harness.open(redis_url, llm_server.base_url, tmp_path / "r.db", registry, agent) as h:
        llm_server.push_tool_calls([("purge", {"target": "x"})])
        llm_server.push_text("Nothing to purge.")
        events = await h.say(new_session().format(), "purge x", ac(instances=["tool:purge"]))
        assert not any(isinstance(e, HitlRequest) for e in events) and runs == []
        assert tool_results(llm_server.requests[-1]) == ["Nothing matches x."]


Step = tuple[str, int]
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("insert_old"), st.integers(1, 40)),
        st.tuples(st.just("insert_new"), st.integers(1, 5)),
        st.tuples(st.just("remove_old"), st.integers(1, 60)),
        st.tuples(st.sampled_from(["yes", "no", "maybe"]), st.just(0)),
    ),
    min_size=1,
    max_size=12,
)


def scripted_deleter(request: dict[str, Any]) -> TextResponse | ToolCallResponse:
    """The model asks to delete whenever the user spoke last; after a tool result it answers."""
    if request["messages"][-1]["role"] == "user":
        return ToolCallResponse([("delete_records", {"older_than": CUTOFF})])
    return TextResponse("Done.")


async def _interleaving(redis_url: str, llm_url: str, db: Path, steps: list[Step]) -> None:
    async with Harness.open(redis_url, llm_url, db) as h:
        sid = new_session().format()
        shown: int | None = None  # the count in the question waiting for an answer

        async def ask() -> None:
            nonlocal shown
            events = await h.say(sid, f"delete records older than {CUTOFF}", ac())
            shown = _question_count(events)

        await ask()
        for kind, n in steps:
            if kind == "insert_old":
                insert(db, n, "2015-02-02")
            elif kind == "insert_new":
                insert(db, n, "2024-02-02")
            elif kind == "remove_old":
                remove(db, n)
            elif shown is None:  # nothing is waiting: the user asks again
                await ask()
            else:
                before = h.count(OLD)
                events = await h.answer(sid, kind)
                deleted = before - h.count(OLD)
                # THE property: never more than the user saw in a question answered "yes"
                assert deleted == 0 or (kind == "yes" and deleted <= shown), (kind, shown, deleted)
                if kind == "yes" and not any(isinstance(e, HitlRequest) for e in events):
                    assert deleted == shown or deleted == 0  # exactly what was confirmed, or nothing
                shown = _question_count(events)


def _question_count(events: list[SSEEvent]) -> int | None:
    asked = [e for e in events if isinstance(e, HitlRequest)]
    return shown_count(asked[-1]) if asked else None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=STEPS)
def test_random_interleavings_never_delete_more_than_was_confirmed(
    redis_url: str, llm_server: ScriptedLLMServer, steps: list[Step]
) -> None:
    llm_server.set_default(scripted_deleter)
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(_interleaving(redis_url, llm_server.base_url, Path(tmp) / "r.db", steps))
