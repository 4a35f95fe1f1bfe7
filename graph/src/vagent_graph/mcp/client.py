"""Talking to one MCP server with the official SDK: list its tools, call one.

A session carries the credential of ONE user on its own HTTP client: nothing (connection,
session, header) is shared between two users' calls, so one user's credential can never
travel on another's call, also under concurrency. Calls reuse open sessions keyed by server
AND credential (pool.py).

Failures come back as McpUnavailable with a short reason for the log and the metrics; their
detail (which may quote a URL, a header or the server's internals) never reaches the model.
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
from mcp import ClientSession, StdioServerParameters
from mcp.client.session import MessageHandlerFnT
from mcp.client.sse import sse_client
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.context import RequestContext
from mcp.shared.exceptions import McpError
from mcp.types import (
    ElicitRequestParams,
    ElicitResult,
    ServerNotification,
    ToolListChangedNotification,
)
from mcp.types import Tool as McpTool

from vagent_graph.mcp.config import McpServerConfig


class McpUnavailable(RuntimeError):
    """The server could not answer (down, timeout, dropped, protocol error); `reason` is a
    short word for logs and metrics."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Declined:
    """Declines every elicitation (a server asking the user for input mid-call) and keeps
    what was asked, so the model can tell the user. Why not ask in the thread: a question
    must survive a restart, and an MCP call cannot (its session is gone); the server gets a
    clean "decline" instead of a protocol error."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def __call__(
        self, context: RequestContext[ClientSession, Any], params: ElicitRequestParams
    ) -> ElicitResult:
        self.asked.append(" ".join(str(getattr(params, "message", "")).split())[:300])
        return ElicitResult(action="decline")


@asynccontextmanager
async def session(
    server: McpServerConfig,
    auth: httpx.Auth | None,
    elicitation: Declined | None = None,
    on_message: MessageHandlerFnT | None = None,
) -> AsyncIterator[ClientSession]:
    """An initialised session with `server`, its HTTP requests signed by `auth`;
    `on_message` sees what the server sends by itself (notifications)."""
    decline = elicitation or Declined()
    extra: dict[str, Any] = {"elicitation_callback": decline}
    if on_message is not None:
        extra["message_handler"] = on_message
    if server.transport == "stdio":
        params = StdioServerParameters(command=server.command or "", args=list(server.args))
        async with (
            stdio_client(params) as (read, write),
            ClientSession(read, write, **extra) as s,
        ):
            await s.initialize()
            yield s
        return
    url = server.url or ""
    if server.transport == "sse":
        async with sse_client(url, auth=auth, timeout=server.timeout_seconds) as (read, write):
            async with ClientSession(read, write, **extra) as s:
                await s.initialize()
                yield s
        return
    timeout = httpx.Timeout(server.timeout_seconds)
    async with (
        httpx.AsyncClient(auth=auth, timeout=timeout, follow_redirects=False, verify=tls()) as http,
        streamable_http_client(url, http_client=http) as (read, write, _),
        ClientSession(read, write, **extra) as s,
    ):
        await s.initialize()
        yield s


@functools.cache
def tls() -> ssl.SSLContext:
    """One TLS context for every MCP client: building one (the CA bundle) costs ~20 ms of
    blocking CPU, which a client per session paid each time (bench/README.md)."""
    return ssl.create_default_context()


def reason_of(exc: BaseException) -> str:
    """A short word for what went wrong, for logs and metrics (never the detail)."""
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, McpError):
        return "protocol_error"
    if isinstance(exc, httpx.HTTPStatusError):
        return f"http_{exc.response.status_code}"
    if isinstance(exc, httpx.HTTPError | OSError):
        return "unreachable"
    if isinstance(exc, BaseExceptionGroup):
        inner = exc.exceptions[0] if exc.exceptions else None
        return reason_of(inner) if inner is not None else "failed"
    return "failed"


async def list_tools(server: McpServerConfig, auth: httpx.Auth | None) -> list[McpTool]:
    """Every tool the server lists (all pages)."""
    try:
        with anyio.fail_after(server.timeout_seconds):
            async with session(server, auth) as s:
                tools: list[McpTool] = []
                cursor: str | None = None
                while True:
                    page = await s.list_tools(cursor=cursor) if cursor else await s.list_tools()
                    tools.extend(page.tools)
                    cursor = page.nextCursor
                    if not cursor:
                        return tools
    except Exception as exc:
        raise McpUnavailable(reason_of(exc)) from None


async def watch_tool_list(
    server: McpServerConfig, auth: httpx.Auth | None, changed: Callable[[], None]
) -> None:
    """Hold a session open and call `changed` on each `notifications/tools/list_changed`;
    returns when the session ends (the server went away, or never streams notifications)."""

    async def on_message(message: Any) -> None:
        if isinstance(message, ServerNotification) and isinstance(message.root, ToolListChangedNotification):
            changed()

    try:
        async with session(server, auth, on_message=on_message) as s:
            await s.list_tools()  # some servers tell only the sessions that listed the tools
            await anyio.sleep_forever()
    except Exception as exc:
        raise McpUnavailable(reason_of(exc)) from None
