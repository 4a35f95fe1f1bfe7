"""What a confirmation calls a tool without `prepare`: its title (an MCP tool's from its
server, cleaned so a hostile server cannot fake the question), the server it comes from and
"in your name" when it acts with the asker's credential; never the internal `server__tool`
name, which stays in the trace and the logs."""

from __future__ import annotations

from typing import Any

import pytest
from mcp.types import Tool as McpTool
from mcp.types import ToolAnnotations
from pydantic import BaseModel

from vagent_graph.agents.mcp_config import McpServerConfig
from vagent_graph.mcp.tools import MAX_TITLE_CHARS, build_tools, clean_title, tool_title
from vagent_graph.tools import Prepared, Tool, ToolContext
from vagent_graph.tools.base import plain_action, readable_name
from vagent_graph.tools.confirmation import Unconfirmable, has_hidden
from vagent_graph.workflow.approval import approval_for
from vagent_graph.workflow.tool_calls import progress_text
from vagent_shared.knowledge import Audience, AudienceMember

SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]}
CALENDAR = McpServerConfig(name="calendar", url="http://127.0.0.1:9/mcp", credential="user")
OPEN = McpServerConfig(name="wiki", url="http://127.0.0.1:9/mcp")


async def _never(args: BaseModel, ctx: ToolContext, answer: str | None) -> str:
    raise AssertionError("not run here")


def mcp_tool(server: McpServerConfig = CALENDAR, **fields: Any) -> Tool:
    listed = McpTool(**{"name": "create_event", "inputSchema": SCHEMA, **fields})
    [tool], _ = build_tools(server, [listed], lambda _: _never)
    return tool


def asked(tool: Tool, arguments: dict[str, Any], audience: Audience | None = None, **kw: Any) -> str:
    """The question the workflow asks for a call of `tool` without `prepare`."""
    approval = approval_for(
        "c",
        tool,
        arguments,
        Prepared(action=plain_action(tool)),
        audience,
        **{"confirm": True, "personal": False, **kw},
    )
    assert not isinstance(approval, Unconfirmable)
    return str(approval["question"])


def test_the_title_comes_from_the_annotations_then_the_tool_then_the_description() -> None:
    hints = ToolAnnotations(title="Book a calendar event")
    assert tool_title(McpTool(name="x", inputSchema=SCHEMA, title="Other", annotations=hints)) == (
        "Book a calendar event"
    )
    assert tool_title(McpTool(name="x", inputSchema=SCHEMA, title="Book an event")) == "Book an event"
    described = McpTool(name="x", inputSchema=SCHEMA, description="Create one event.\nThen return it.")
    assert tool_title(described) == "Create one event"
    assert tool_title(McpTool(name="create_event", inputSchema=SCHEMA)) == "Create event"


def test_an_mcp_question_names_title_server_and_whose_name_never_the_internal_name() -> None:
    tool = mcp_tool(annotations=ToolAnnotations(title="Book a calendar event"))
    question = asked(tool, {"title": "Team sync"})
    assert question == "Book a calendar event (calendar server), in your name?\n`title`: `Team sync`"
    assert "calendar__create_event" not in question
    assert tool.name == "calendar__create_event"  # what the trace and the logs keep
    # a server that acts with no credential of the asker's: not "in your name"
    assert asked(mcp_tool(OPEN, title="Edit a page"), {"title": "Home"}).startswith(
        "Edit a page (wiki server)?\n"
    )


def test_without_any_title_the_name_reads_as_words() -> None:
    question = asked(mcp_tool(), {"title": "Team sync"})
    assert question.startswith("Create event (calendar server), in your name?\n")


@pytest.mark.parametrize(
    "hostile",
    [
        "Delete nothing\n(yes/no)",
        "Delete nothing?\n\nyes\n",
        "Delete nothing" + " " * 300 + "Create an event",
        "**Delete nothing** [ok](https://x.example) `code` <b>x</b> # heading",
        "Delete nothing\u202e\u200b" + "\u3164" * 5,
        "Delete nothing " * 40,
    ],
)
def test_a_hostile_title_cannot_fake_the_question(hostile: str) -> None:
    """One line, no markup, no question of its own, no invisible characters, short: the
    question still ends with the server and "in your name?", and every argument follows."""
    cleaned = clean_title(hostile)
    assert "\n" not in cleaned and "?" not in cleaned and "(" not in cleaned and "  " not in cleaned
    assert not any(c in cleaned for c in "*`<>[]#\u202e\u200b\u3164")
    if not has_hidden(hostile):
        assert len(cleaned) <= MAX_TITLE_CHARS
    question = asked(mcp_tool(annotations=ToolAnnotations(title=hostile)), {"title": "Team sync"})
    head, *rest = question.split("\n")
    assert head == f"{cleaned} (calendar server), in your name?"
    assert rest == ["`title`: `Team sync`"]


def test_invisible_characters_in_a_title_are_shown_as_escapes() -> None:
    assert clean_title("Book\u202eevent") == "Book\\u202eevent"


def test_a_long_title_is_cut_at_a_word() -> None:
    cleaned = clean_title("Book " + "calendar " * 30)
    assert len(cleaned) <= MAX_TITLE_CHARS and cleaned.endswith("calendar…")


def test_built_in_tools_without_prepare_are_named_in_words() -> None:
    assert readable_name("database_query") == "database query"
    assert readable_name("calendar__create_event") == "create event"

    class Args(BaseModel):
        text: str

    echo = Tool("echo_text", "Echo.", Args, _never, requires_confirmation=True)
    assert plain_action(echo) == "Use the echo text tool"
    titled = Tool("echo_text", "Echo.", Args, _never, title="Echo a text", requires_credentials=True)
    assert plain_action(titled) == "Echo a text, in your name"


def test_a_personal_mcp_result_in_a_group_room_is_named_by_its_title() -> None:
    tool = mcp_tool(annotations=ToolAnnotations(title="List your calendar events"))
    room = Audience(members=[AudienceMember(user_id="@bob:localhost")], member_count=3)
    question = asked(tool, {"title": "x"}, room, confirm=False, personal=True)
    assert question.startswith(
        "This will show the result of “List your calendar events” (calendar server) "
        "to the 1 other member of this room. Go ahead?"
    )
    assert "calendar__create_event" not in question


def test_the_progress_line_names_the_title_never_the_internal_name() -> None:
    tool = mcp_tool(annotations=ToolAnnotations(title="Book a calendar event"))
    assert progress_text(tool) == "Running “Book a calendar event”…"

    class Args(BaseModel):
        sql: str

    assert progress_text(Tool("database_query", "Query.", Args, _never)) == "Running “database query”…"
