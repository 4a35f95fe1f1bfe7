"""A hostile MCP server against the caps: 2,000 tiny images, elicitation floods, huge text,
300 tools and huge schemas. Whatever it sends, the model reads at most MCP_RESULT_MAX_CHARS
of one result (every note included), the room gets at most MCP_MAX_IMAGES images per
result and per turn, and a server brings at most MCP_MAX_TOOLS tools whose specs fit in
MCP_MAX_SCHEMA_CHARS. And what a failed call tells the model: a call that was sent "may or
may not have happened", never "did not work"."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp.shared.exceptions import McpError
from mcp.types import CONNECTION_CLOSED, CallToolResult, ErrorData, ImageContent, TextContent
from mcp.types import Tool as McpTool
from pydantic import BaseModel

from tests.support.mcp_server import PNG_1X1
from vagent_graph.agents.mcp_config import McpServerConfig
from vagent_graph.mcp.client import Elicited, Guard, McpUnavailable
from vagent_graph.mcp.limits import McpLimits, TurnImages
from vagent_graph.mcp.pool import SESSION_TERMINATED, call_failure
from vagent_graph.mcp.results import failure_text, read
from vagent_graph.mcp.tools import build_tools
from vagent_graph.tools import ToolContext
from vagent_graph.workflow.tool_images import shown_images

LIMITS = McpLimits()


def server(**kw: Any) -> McpServerConfig:
    return McpServerConfig.model_validate({"name": "hostile", "url": "http://127.0.0.1:9/mcp", **kw})


def never_run(name: str) -> Any:
    async def run(args: BaseModel, ctx: ToolContext, answer: str | None) -> str:
        raise AssertionError(f"{name} must not run in these tests")

    return run


def image(data: str = PNG_1X1) -> ImageContent:
    return ImageContent(type="image", data=data, mimeType="image/png")


def text(t: str) -> TextContent:
    return TextContent(type="text", text=t)


def what_the_model_reads(tool: str, got_text: str, images: Any) -> str:
    """The tool message as tool_calls.py builds it: the text, then a line per image."""
    note = shown_images(images, tool, 5 * 1024 * 1024).note
    return f"{got_text}\n{note}" if got_text and note else got_text or note


def test_two_thousand_tiny_images_give_the_room_four_and_the_model_at_most_the_cap() -> None:
    result = CallToolResult(content=[image() for _ in range(2000)] + [text("y" * 50_000)])
    turns = TurnImages(LIMITS.max_images)
    got = read("hostile__pics", result, Elicited(), LIMITS, lambda n: turns.take("turn-1", n))
    assert len(got.images) == LIMITS.max_images == 4 and got.left_out == 1996
    model = what_the_model_reads("hostile__pics", got.text, got.images)
    assert len(model) <= LIMITS.result_max_chars
    assert "returned 2000 images; 1996 of them are not shown" in model
    assert model.count("it is shown to the user in the room") == 4
    # the same turn's next result sends nothing more to the room; the next turn may again
    again = read("hostile__pics", result, Elicited(), LIMITS, lambda n: turns.take("turn-1", n))
    assert again.images == () and again.left_out == 2000 and "2000 of them are not shown" in again.text
    later = read("hostile__pics", result, Elicited(), LIMITS, lambda n: turns.take("turn-2", n))
    assert len(later.images) == 4


def test_an_elicitation_flood_is_counted_not_quoted() -> None:
    asked = tuple(f"question {n} " + "z" * 290 for n in range(3))
    got = read(
        "hostile__ask",
        CallToolResult(content=[text("ok")]),
        Elicited(asked, 5000),
        McpLimits(result_max_chars=2000),
    )
    assert len(got.text) <= 2000 and got.text.startswith("ok\n")
    assert "and 4997 more questions" in got.text and "question 2" in got.text


tool_names = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=54).map(lambda s: f"hostile__{s}")


@settings(max_examples=120, deadline=None)
@given(
    name=tool_names,
    body=st.integers(0, 60_000),
    images=st.integers(0, 300),
    broken_images=st.booleans(),
    asked=st.lists(st.text(max_size=400), max_size=6),
    extra_asked=st.integers(0, 10_000),
    max_chars=st.integers(100, 30_000),
    max_images=st.integers(0, 32),
    structured=st.booleans(),
)
def test_whatever_a_result_holds_the_model_reads_at_most_the_cap(
    name: str,
    body: int,
    images: int,
    broken_images: bool,
    asked: list[str],
    extra_asked: int,
    max_chars: int,
    max_images: int,
    structured: bool,
) -> None:
    limits = McpLimits(result_max_chars=max_chars, max_images=max_images)
    content: list[Any] = [text("x" * body)] + [image("%%%" if broken_images else PNG_1X1)] * images
    result = CallToolResult(content=content, structuredContent={"k": "v" * body} if structured else None)
    elicited = Elicited(tuple(a[:300] for a in asked[:3]), len(asked[:3]) + extra_asked)
    got = read(name, result, elicited, limits)
    model = what_the_model_reads(name, got.text, got.images)
    assert len(model) <= max_chars
    allowed = min(images, max_images, max_chars // 480)  # the image lines take at most half
    assert got.left_out == images - allowed
    assert len(got.images) == (0 if broken_images else allowed)


def test_a_server_with_300_tools_brings_the_first_128() -> None:
    listed = [McpTool(name=f"t{i:03}", description="d", inputSchema={"type": "object"}) for i in range(300)]
    tools, skipped = build_tools(server(), listed, never_run, max_tools=LIMITS.max_tools)
    assert [t.name for t in tools] == [f"hostile__t{i:03}" for i in range(128)]
    assert len(skipped) == 172 and {s.reason for s in skipped} == {"max_tools"}
    again, _ = build_tools(server(), listed, never_run, max_tools=LIMITS.max_tools)
    assert [t.name for t in again] == [t.name for t in tools]  # the same list, the same tools


def test_huge_schemas_fit_in_the_schema_budget_of_every_model_call() -> None:
    """300 tools of ~19 000 characters each (just under the per-tool cap) were 6 M characters
    of schemas in every model call; together they get MCP_MAX_SCHEMA_CHARS."""
    schema = {
        "type": "object",
        "properties": {f"p{i}": {"type": "string", "description": "d" * 150} for i in range(95)},
    }
    listed = [McpTool(name=f"t{i:03}", description="x" * 5000, inputSchema=schema) for i in range(300)]
    tools, skipped = build_tools(server(), listed, never_run, max_schema_chars=LIMITS.max_schema_chars)
    offered = sum(len(json.dumps(t.openai_schema(), ensure_ascii=False)) for t in tools)
    assert 0 < len(tools) < 128 and offered <= LIMITS.max_schema_chars
    assert [t.name for t in tools] == [f"hostile__t{i:03}" for i in range(len(tools))]
    reasons = {s.reason for s in skipped}
    assert "schema_budget" in reasons and reasons <= {"schema_budget", "max_tools"}


# ---- a failed call ---------------------------------------------------------------------------
def closed() -> McpError:
    return McpError(ErrorData(code=CONNECTION_CLOSED, message="Connection closed"))


@pytest.mark.parametrize(
    ("exc", "holder", "reason", "unknown"),
    [
        (TimeoutError(), None, "timeout", True),
        (closed(), None, "dropped", True),  # the connection broke mid-call
        (closed(), ExceptionGroup("x", [httpx.ReadError("reset")]), "dropped", True),
        (closed(), ExceptionGroup("x", [httpx.ConnectError("refused")]), "unreachable", False),
        (
            McpError(ErrorData(code=SESSION_TERMINATED, message="Session terminated")),
            None,
            "session_expired",
            False,
        ),
        (McpError(ErrorData(code=-32602, message="bad params")), None, "protocol_error", False),
        (httpx.ConnectError("refused"), None, "unreachable", False),
        (httpx.RemoteProtocolError("peer closed"), None, "unreachable", True),
        (RuntimeError("invalid structured content"), None, "failed", True),
    ],
)
def test_what_a_failure_after_sending_means(
    exc: BaseException, holder: BaseException | None, reason: str, unknown: bool
) -> None:
    failure = call_failure(exc, holder, Guard(1000))
    assert (failure.reason, failure.unknown) == (reason, unknown)


def test_a_response_cut_at_the_cap_is_an_unknown_outcome() -> None:
    guard = Guard(1000)
    guard.exceeded()
    failure = call_failure(closed(), None, guard)
    assert (failure.reason, failure.unknown) == ("too_large", True)


def test_a_call_that_may_have_acted_is_never_reported_as_failed() -> None:
    for reason in ("timeout", "dropped", "too_large"):
        told = failure_text("cal__create_event", McpUnavailable(reason, unknown=True), 30)
        assert "MAY OR MAY NOT HAVE HAPPENED" in told and "Do not call it again blindly" in told
        assert "did not work" not in told and "NOT run" not in told
    assert "did not answer within 30 s" in failure_text("x__y", McpUnavailable("timeout", unknown=True), 30)
    told = failure_text("cal__create_event", McpUnavailable("unreachable"), 30)
    assert "did not go through" in told and "did not work" in told and "MAY" not in told
