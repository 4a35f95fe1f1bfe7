"""A hostile MCP server against every cap, over the real transport (real server processes,
tests/support/mcp_server.py), with the graph's default limits:

- 2,000 tiny images and 200 elicitations in one result: the room gets MCP_MAX_IMAGES, the
  model at most MCP_RESULT_MAX_CHARS, notes included (before: 2,000 images were queued and
  the notes came on top of the cap);
- a response larger than MCP_RESPONSE_MAX_BYTES (on the legacy SSE transport: an event) is
  cut off while it streams in, and the call ends at once as "may or may not have happened"
  (before: held whole, then cut);
- 300 tools with large schemas: at most MCP_MAX_TOOLS tools, their specs together at most
  MCP_MAX_SCHEMA_CHARS, built off the event loop;
- a storm of `tools/list_changed`: the list is read at most every LIST_CHANGED_MIN_SECONDS.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.factories import ac
from tests.support.mcp_server import McpTestServer, tool
from vagent_graph.agents.mcp_config import McpServerConfig
from vagent_graph.mcp.limits import McpLimits
from vagent_graph.mcp.servers import LIST_CHANGED_MIN_SECONDS, McpServers
from vagent_graph.tools import ToolContext, ToolRegistry, ToolResult
from vagent_graph.tools.base import RunFn
from vagent_graph.workflow.tool_images import shown_images

LIMITS = McpLimits()  # the defaults of the settings
#: Over the default MCP_RESPONSE_MAX_BYTES (16 MiB).
HUGE = 20 * 1024 * 1024
TOOLS = [
    tool("pics", "image", params={"text": "string"}, count=2000),
    tool("ask", "elicit", params={"text": "string"}, message="Which room? " + "r" * 200, count=200),
    tool("huge", "big", params={"text": "string"}, size=HUGE),
    tool("echo", params={"text": "string"}),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[McpTestServer]:
    with McpTestServer({"name": "hostile", "tools": TOOLS}, tmp_path_factory.mktemp("hostile")) as s:
        yield s


def config(url: str, **kw: Any) -> McpServerConfig:
    return McpServerConfig.model_validate({"name": "x", "url": url, "timeout_seconds": 60, **kw})


async def call(registry: ToolRegistry, name: str) -> str | ToolResult:
    t = registry.get(name)
    assert t is not None, name
    ctx = ToolContext(ac=ac("@alice:localhost", ["mcp_server:x"]), session_id="s")
    out = await t.run(t.args_model.model_validate({"text": "hi"}), ctx, None)
    assert isinstance(out, str | ToolResult), out
    return out


def model_reads(tool_name: str, out: str | ToolResult) -> str:
    """The tool message as tool_calls.py builds it: the text, then a line per image shown."""
    if isinstance(out, str):
        return out
    note = shown_images(out.images, tool_name, 5 * 1024 * 1024).note
    return f"{out.text}\n{note}" if out.text else note


async def test_floods_in_one_result_stay_within_the_caps(server: McpTestServer) -> None:
    registry = ToolRegistry()
    servers = McpServers([config(server.url)], registry, refresh_seconds=3600)
    await servers.start()
    try:
        pics = await call(registry, "x__pics")
        assert isinstance(pics, ToolResult) and len(pics.images) == LIMITS.max_images
        text = model_reads("x__pics", pics)
        assert len(text) <= LIMITS.result_max_chars
        assert f"returned 2000 images; {2000 - LIMITS.max_images} of them are not shown" in text
        asked = model_reads("x__ask", await call(registry, "x__ask"))
        assert len(asked) <= LIMITS.result_max_chars and "and 197 more questions" in asked
        assert asked.startswith("elicitation: decline")
    finally:
        await servers.aclose()


async def test_a_response_over_the_cap_is_cut_off_while_it_streams_in(server: McpTestServer) -> None:
    registry = ToolRegistry()
    servers = McpServers([config(server.url)], registry, refresh_seconds=3600)
    await servers.start()
    try:
        told = await call(registry, "x__huge")
        assert isinstance(told, str)
        # not the timeout (60 s): the call ended when the cap was hit, and says it may have acted
        assert told.startswith("x__huge answered with more than vagent reads, so its answer is not shown:")
        assert "MAY OR MAY NOT HAVE HAPPENED" in told
        assert "hi" in str(await call(registry, "x__echo"))  # the server is still usable
    finally:
        await servers.aclose()


async def test_an_event_over_the_cap_is_cut_off_on_the_legacy_sse_transport(tmp_path: Path) -> None:
    """Over SSE the answer comes as one event of a long-lived stream: that event is cut at the
    cap while it streams in, and the call ends at once (its timeout would say so)."""
    with McpTestServer({"name": "hostile", "tools": TOOLS}, tmp_path, transport="sse") as sse:
        registry = ToolRegistry()
        servers = McpServers([config(sse.url, transport="sse")], registry, refresh_seconds=3600)
        await servers.start()
        try:
            told = await call(registry, "x__huge")
            assert isinstance(told, str) and "MAY OR MAY NOT HAVE HAPPENED" in told
            assert told.startswith("x__huge answered with more than vagent reads"), told
            assert "hi" in str(await call(registry, "x__echo"))
        finally:
            await servers.aclose()


def schema(n: int) -> dict[str, Any]:
    """An input schema of about 2 500 characters (valid, under the per-tool cap)."""
    props = {
        f"p{i}": {"type": "string", "description": f"field {i} of tool {n} " + "d" * 100} for i in range(18)
    }
    return {"type": "object", "properties": props}


async def test_300_tools_with_large_schemas_bring_what_fits_built_off_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    many = [tool(f"t{n:03}", input_schema=schema(n), description=f"tool {n}") for n in range(300)]
    with McpTestServer({"name": "many", "tools": many}, tmp_path) as server:
        registry = ToolRegistry()
        servers = McpServers([config(server.url)], registry, refresh_seconds=3600)
        threads: list[bool] = []
        make = servers._run_fn

        def recording(s: McpServerConfig, name: str) -> RunFn:
            threads.append(threading.current_thread() is threading.main_thread())
            return make(s, name)

        monkeypatch.setattr(servers, "_run_fn", recording)
        await servers.start(wait_seconds=60)
        try:
            offered = [t for t in registry if t.server == "x"]
            specs = sum(len(json.dumps(t.openai_schema(), ensure_ascii=False)) for t in offered)
            assert 0 < len(offered) <= LIMITS.max_tools and specs <= LIMITS.max_schema_chars
            # the first ones as the server lists them
            assert [t.name for t in offered] == [f"x__t{n:03}" for n in range(len(offered))]
            assert servers.status()["x"].tools == len(offered)
            assert threads and not any(threads), "the tools were built on the event loop's thread"
        finally:
            await servers.aclose()


async def test_a_storm_of_list_changed_is_read_at_most_every_interval(tmp_path: Path) -> None:
    tools = [
        tool("echo", params={"text": "string"}),
        tool("storm", "storm", params={"text": "string"}, count=1000),
    ]
    with McpTestServer({"name": "stormy", "tools": tools}, tmp_path) as server:
        registry = ToolRegistry()
        servers = McpServers([config(server.url)], registry, refresh_seconds=3600)
        await servers.start()
        try:
            for _ in range(100):  # the listening session has listed the tools (so it is told)
                if len(server.listings()) >= 2:
                    break
                await asyncio.sleep(0.1)
            before, started = len(server.listings()), time.monotonic()
            assert await call(registry, "x__storm") == "sent 1000 notifications"
            await asyncio.sleep(2 * LIST_CHANGED_MIN_SECONDS)
            reads = len(server.listings()) - before
            elapsed = time.monotonic() - started
            assert 1 <= reads <= elapsed / LIST_CHANGED_MIN_SECONDS + 1, (reads, elapsed)
        finally:
            await servers.aclose()
