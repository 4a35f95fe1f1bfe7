"""Smoke test of the scriptable MCP test server (tests/support/mcp_server.py) with the SDK's
own client: every behaviour over streamable HTTP, the basics over SSE and stdio, hostile tool
definitions arriving as given, and a record of calls that holds credential fingerprints only.

Why: the graph's MCP fault and RBAC tests trust this server to do exactly what its config
says; if it silently did something else, those tests would prove nothing.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import McpError
from mcp.types import ImageContent, TextContent
from pydantic import ValidationError

from tests.support.mcp_server import MODULE_FILE, PNG_1X1, McpTestServer, fingerprint, tool

KEY, TOKEN = "test-api-key-value-0001", "Bearer test-token-value-0002"
HEADERS = {"X-API-Key": KEY, "Authorization": TOKEN}
LONG = "Do this. " * 20_000
HOSTILE_SCHEMA = {"type": "nonsense", "properties": 5, "required": "all of them"}
CONFIG: dict[str, Any] = {
    "name": "smoke",
    "tools": [
        tool("echo", params={"text": "string", "count": "integer?"}, annotations={"readOnlyHint": True}),
        tool("fail", "error", message="the backend said no"),
        tool("wait", "hang", seconds=60),
        tool("huge", "big", size=200_000),
        tool(
            "shaped",
            "structured",
            result={"rows": [1, 2, 3]},
            output_schema={"type": "object", "properties": {"rows": {"type": "array"}}},
        ),
        tool("picture", "image"),
        tool("hostile", description=LONG, input_schema=HOSTILE_SCHEMA, annotations={"readOnlyHint": "yes"}),
    ],
}


async def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
    """One plain HTTP request, without blocking the event loop."""
    async with httpx.AsyncClient(timeout=10) as http:
        return await http.request(method, url, **kwargs)


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


def text(result: Any) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, TextContent))


@asynccontextmanager
async def http_session(server: McpTestServer, headers: dict[str, str]) -> AsyncIterator[ClientSession]:
    async with (
        httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(10, read=30)) as http,
        streamable_http_client(server.url, http_client=http) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[McpTestServer]:
    with McpTestServer(CONFIG, tmp_path_factory.mktemp("mcp")) as running:
        yield running


async def test_tools_arrive_as_configured(server: McpTestServer) -> None:
    server.clear()
    async with http_session(server, HEADERS) as session:
        tools = {t.name: t for t in (await session.list_tools()).tools}
    assert list(tools) == ["echo", "fail", "wait", "huge", "shaped", "picture", "hostile"]
    assert tools["echo"].inputSchema == {
        "type": "object",
        "properties": {"text": {"type": "string"}, "count": {"type": "integer"}},
        "required": ["text"],
    }
    assert tools["echo"].annotations is not None and tools["echo"].annotations.readOnlyHint is True
    hostile = tools["hostile"]
    assert hostile.description == LONG and hostile.inputSchema == HOSTILE_SCHEMA
    assert (
        hostile.annotations is not None and hostile.annotations.readOnlyHint is True
    )  # the client's coercion
    (listing,) = server.listings()
    assert listing["fingerprints"] == {"authorization": fingerprint(TOKEN), "x-api-key": fingerprint(KEY)}


async def test_hostile_definitions_are_sent_as_given(tmp_path: Path) -> None:
    """What the server puts on the wire, whatever the SDK's models would make of it."""
    config = {
        "stateless": True,
        "json_response": True,
        "tools": [
            tool("odd", input_schema="not a schema", annotations={"readOnlyHint": "yes", "x-extra": [1]}),
            tool("ok", params={}),
        ],
    }
    with McpTestServer(config, tmp_path) as server:
        accept = {"Accept": "application/json, text/event-stream"}
        listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        r = await request("POST", server.url, json=listing, headers=accept)
        assert r.status_code == 200, r.text
        assert r.json()["result"]["tools"] == [
            {
                "name": "odd",
                "inputSchema": "not a schema",
                "annotations": {"readOnlyHint": "yes", "x-extra": [1]},
            },
            {"name": "ok", "inputSchema": {"type": "object", "properties": {}, "required": []}},
        ]
        with pytest.raises(BaseExceptionGroup) as failed:
            async with http_session(server, {}) as session:
                await session.list_tools()
        (error,) = leaves(failed.value)
        assert isinstance(error, ValidationError) and "tools.0.inputSchema" in str(error)
        assert len(server.listings()) == 2


async def test_echo_answers_and_records_fingerprints_never_values(server: McpTestServer) -> None:
    server.clear()
    async with http_session(server, HEADERS) as session:
        result = await session.call_tool("echo", {"text": "hi", "count": 2})
    assert not result.isError
    prints = {"authorization": fingerprint(TOKEN), "x-api-key": fingerprint(KEY)}
    assert json.loads(text(result)) == {
        "tool": "echo",
        "arguments": {"text": "hi", "count": 2},
        "fingerprints": prints,
    }
    (call,) = server.calls()
    assert (call["tool"], call["arguments"], call["fingerprints"]) == (
        "echo",
        {"text": "hi", "count": 2},
        prints,
    )
    assert {"x-api-key", "authorization"} <= set(call["headers"]) and call["time"] > 0
    over_http = (await request("GET", server.base_url + "/calls")).json()
    assert over_http["calls"] == [call]
    for secret in (KEY, TOKEN, TOKEN.split()[1]):
        assert secret not in server.record_path.read_text() and secret not in server.logs()
        assert secret not in json.dumps(over_http)


async def test_without_credentials_the_fingerprints_are_none(server: McpTestServer) -> None:
    server.clear()
    async with http_session(server, {}) as session:
        result = await session.call_tool("echo", {"text": "x"})
    assert json.loads(text(result))["fingerprints"] == {"authorization": None, "x-api-key": None}


async def test_error_big_structured_and_image(server: McpTestServer) -> None:
    server.clear()
    async with http_session(server, HEADERS) as session:
        failed = await session.call_tool("fail", {})
        huge = await session.call_tool("huge", {})
        shaped = await session.call_tool("shaped", {"q": 1})
        picture = await session.call_tool("picture", {})
        anything = await session.call_tool("hostile", {"whatever": [1, {"x": None}]})
    assert failed.isError and text(failed) == "the backend said no"
    assert len(text(huge)) == 200_000 and text(huge).startswith("0123456789")
    assert shaped.structuredContent == {"rows": [1, 2, 3]} and json.loads(text(shaped)) == {"rows": [1, 2, 3]}
    (image,) = picture.content
    assert isinstance(image, ImageContent) and (image.data, image.mimeType) == (PNG_1X1, "image/png")
    assert not anything.isError
    assert [c["tool"] for c in server.calls()] == ["fail", "huge", "shaped", "picture", "hostile"]


async def test_hang_outlasts_the_clients_timeout(server: McpTestServer) -> None:
    server.clear()
    async with http_session(server, HEADERS) as session:
        with pytest.raises(McpError, match="Timed out"):
            await session.call_tool("wait", {}, read_timeout_seconds=timedelta(seconds=1))
        assert not (await session.call_tool("echo", {"text": "still here"})).isError
    assert [c["tool"] for c in server.calls()] == ["wait", "echo"]


async def test_drop_kills_the_process_mid_call(tmp_path: Path) -> None:
    config = {"tools": [tool("crash", "drop", exit_code=3)], "json_response": True}
    with McpTestServer(config, tmp_path) as server:
        with pytest.raises(BaseExceptionGroup) as failed:
            async with http_session(server, HEADERS) as session:
                await session.call_tool("crash", {"n": 1}, read_timeout_seconds=timedelta(seconds=10))
        assert [type(e) for e in leaves(failed.value)] == [httpx.RemoteProtocolError]
        assert server.proc is not None and server.proc.wait(10) == 3
        assert not server.running and server.returncode == 3
        (call,) = server.calls()  # recorded before the process died
        assert call["tool"] == "crash" and call["fingerprints"]["x-api-key"] == fingerprint(KEY)


async def test_sse_transport(tmp_path: Path) -> None:
    with McpTestServer(CONFIG, tmp_path, transport="sse") as server:
        assert server.url.endswith("/sse")
        async with (
            sse_client(server.url, headers=HEADERS) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            assert len((await session.list_tools()).tools) == 7
            result = await session.call_tool("echo", {"text": "over sse"})
            failed = await session.call_tool("fail", {})
        assert json.loads(text(result))["fingerprints"]["authorization"] == fingerprint(TOKEN)
        assert failed.isError
        assert [c["tool"] for c in server.calls()] == ["echo", "fail"]


async def test_stdio_transport(tmp_path: Path) -> None:
    config = {**CONFIG, "tools": [*CONFIG["tools"], tool("crash", "drop")]}
    server = McpTestServer(config, tmp_path, transport="stdio").start()
    command, args = server.stdio_command
    assert (command, args[:2]) == (sys.executable, ["-P", str(MODULE_FILE)])
    async with (
        stdio_client(server.stdio_parameters()) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert tools["hostile"].inputSchema == HOSTILE_SCHEMA and tools["hostile"].description == LONG
        echoed = await session.call_tool("echo", {"text": "over stdio"})
        huge = await session.call_tool("huge", {})
        shaped = await session.call_tool("shaped", {})
        with pytest.raises(McpError):
            await session.call_tool("crash", {}, read_timeout_seconds=timedelta(seconds=10))
    assert json.loads(text(echoed)) == {
        "tool": "echo",
        "arguments": {"text": "over stdio"},
        "fingerprints": {"authorization": None, "x-api-key": None},
    }
    assert len(text(huge)) == 200_000 and shaped.structuredContent == {"rows": [1, 2, 3]}
    assert [c["tool"] for c in server.calls()] == ["echo", "huge", "shaped", "crash"]
    assert server.calls()[0]["headers"] == [] and len(server.listings()) == 1


def test_a_bad_tool_entry_fails_in_the_test() -> None:
    with pytest.raises(ValueError, match="behaviour"):
        tool("x", "explode")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown type"):
        tool("x", params={"a": "str"})
    with pytest.raises(ValueError, match="params or input_schema"):
        tool("x", params={"a": "string"}, input_schema={})
