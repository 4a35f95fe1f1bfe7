"""A tool the user was never offered is never named to them, nor to the model: a model that
calls one anyway (it invented the name, a document told it to, it remembers it from another
user) reads "I can't do that here.", and so does the person if the model repeats it. Only the
operator's record (the audit, the security log, the metric) keeps the name. A tool the user
WAS offered is asked about by its title, never by its internal `server__tool` name.

The workflow in-process on the real Redis checkpointer with the scripted LLM over HTTP
(test_workflow.py's Harness); the calendar's tools are built by the graph's own build_tools
from the demo calendar's tool list, their `run` records whether anything ran.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mcp.types import Tool as McpTool
from mcp.types import ToolAnnotations
from pydantic import BaseModel

from tests.integration.test_confirmations import KeptTrail
from tests.integration.test_workflow import Harness, final, question, tool_results
from tests.support.factories import ac, new_session
from tests.support.llm_server import PlannedResponse, ScriptedLLMServer, TextResponse
from vagent_graph.agents.descriptor import load_descriptor
from vagent_graph.agents.mcp_config import McpServerConfig
from vagent_graph.mcp.tools import build_tools
from vagent_graph.tools import ToolContext, ToolRegistry
from vagent_graph.tools.catalogue import builtin_tools
from vagent_shared.events import HitlRequest, SSEEvent

CALENDAR = McpServerConfig(name="calendar", url="http://127.0.0.1:9/mcp", credential="user")
SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "start": {"type": "string"}, "end": {"type": "string"}},
    "required": ["title", "start", "end"],
}
#: As the demo calendar lists it (dev/src/vagent_dev/calendar.py).
CREATE = McpTool(
    name="create_event",
    title="Book a calendar event",
    description="Create one event in the caller's own calendar and return it.",
    inputSchema=SCHEMA,
    annotations=ToolAnnotations(title="Book a calendar event", readOnlyHint=False),
)
ARGS = {"title": "Team sync", "start": "2026-12-02T10:00", "end": "2026-12-02T10:30"}
NOT_OFFERED = "I can't do that here."


def calendar_registry(ran: list[dict[str, Any]]) -> ToolRegistry:
    def make_run(name: str) -> Any:
        async def run(args: BaseModel, ctx: ToolContext, answer: str | None) -> str:
            ran.append(args.model_dump(mode="json"))
            return "created"

        return run

    tools, _ = build_tools(CALENDAR, [CREATE], make_run)
    registry = ToolRegistry(builtin_tools())
    for tool in tools:
        registry.register(tool)
    return registry


def echo_tool_results(request: dict[str, Any]) -> PlannedResponse:
    """A model that repeats to the person what its tools answered (the worst case for a name
    in a refusal: whatever the model reads, the person may read)."""
    return TextResponse(" ".join(tool_results(request)) or "Nothing.")


def dumped(events: list[SSEEvent]) -> str:
    return json.dumps([e.model_dump(mode="json") for e in events], ensure_ascii=False)


async def test_an_mcp_tool_never_offered_is_refused_without_its_name(
    redis_url: str, llm_server: ScriptedLLMServer, tmp_path: Path
) -> None:
    """carol has no `mcp_server:calendar`: the calendar is never offered to her; the model
    calls `calendar__create_event` anyway. Nothing runs, nobody is asked, and neither the
    model nor carol reads the tool's name; the audit record keeps it."""
    ran: list[dict[str, Any]] = []
    agent = load_descriptor().model_copy(update={"mcp_servers": [CALENDAR]})
    carol = ac("@carol:localhost", ["tool:database_query"])
    trail = KeptTrail()
    async with Harness.open(
        redis_url, llm_server.base_url, tmp_path / "r.db", calendar_registry(ran), agent, trail
    ) as h:
        llm_server.push_tool_calls([("calendar__create_event", ARGS)])
        llm_server.set_default(echo_tool_results)
        events = await h.say(new_session("@carol:localhost").format(), "book a team sync", carol)

    assert ran == [] and not any(isinstance(e, HitlRequest) for e in events)
    assert llm_server.offered_tool_names(0) == ["database_query"]
    reply = [m for m in llm_server.requests[-1]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in reply] == [NOT_OFFERED]
    assert "create_event" not in json.dumps(reply)  # not even as the tool message's name
    assert final(events) == NOT_OFFERED
    assert "create_event" not in dumped(events) and "calendar" not in final(events)
    [denied] = [e for e in trail.events if e.decision == "denied"]
    assert denied.resource == "tool:calendar__create_event"  # the operator's record keeps it


async def test_built_in_tools_never_offered_or_invented_are_refused_without_their_names(
    redis_url: str, llm_server: ScriptedLLMServer, tmp_path: Path
) -> None:
    """A built-in tool the user has no grant for, and one that does not exist: the same
    answer for both, so the answer does not even tell which of them exists."""
    user = ac(instances=["tool:database_query"])
    async with Harness.open(redis_url, llm_server.base_url, tmp_path / "r.db") as h:
        before = h.count()
        llm_server.push_tool_calls([("delete_records", {"older_than": "2100-01-01"}), ("drop_all", {})])
        llm_server.set_default(echo_tool_results)
        events = await h.say(new_session().format(), "wipe it all", user)
        assert h.count() == before
    assert tool_results(llm_server.requests[-1]) == [NOT_OFFERED, NOT_OFFERED]
    assert final(events) == f"{NOT_OFFERED} {NOT_OFFERED}"
    assert "delete_records" not in dumped(events) and "drop_all" not in dumped(events)


async def test_an_offered_mcp_tool_is_asked_about_by_its_title_and_no_answers_the_person(
    redis_url: str, llm_server: ScriptedLLMServer, tmp_path: Path
) -> None:
    """alice may use the calendar: the question names the tool by its title and the server,
    says it acts in her name, and lists every argument; never `calendar__create_event`.
    After "no" the model is told to tell her so, and nothing ran."""
    ran: list[dict[str, Any]] = []
    agent = load_descriptor().model_copy(update={"mcp_servers": [CALENDAR]})
    alice = ac(instances=["mcp_server:calendar"])
    async with Harness.open(
        redis_url, llm_server.base_url, tmp_path / "r.db", calendar_registry(ran), agent
    ) as h:
        sid = new_session().format()
        llm_server.push_tool_calls([("calendar__create_event", ARGS)])
        asked = question(await h.say(sid, "book a team sync", alice))
        assert asked.question == (
            "Book a calendar event (calendar server), in your name?\n"
            "`title`: `Team sync`\n`start`: `2026-12-02T10:00`\n`end`: `2026-12-02T10:30`"
        )
        llm_server.push_text("You said no; nothing was changed.")
        await h.answer(sid, "no")
    assert ran == []
    assert tool_results(llm_server.requests[-1]) == [
        "The user said no: calendar__create_event was NOT run; nothing was changed. Tell them so."
    ]
