"""Talking to one MCP server with the official SDK: list its tools, call one.

A session carries the credential of ONE user on its own HTTP client: nothing (connection,
session, header) is shared between two users' calls, so one user's credential can never
travel on another's call, also under concurrency. Calls reuse open sessions keyed by server
AND credential (pool.py).

That HTTP client is the SDK's way in for two things the SDK does not do itself (`Guard`):
- a response (on the legacy SSE transport: each event) is read only up to
  MCP_RESPONSE_MAX_BYTES: a hostile server's gigabyte is cut off while it streams in, and the
  call using the session is stopped at once. A stdio server's output is read by the SDK
  whole and cut afterwards: its command is one the operator installed;
- the requests of a call are traced as children of the calling turn's span: a session lives
  in a task of its own (opened by whichever turn came first), so without this every later
  call's HTTP spans would land in that first turn's trace.

Failures come back as McpUnavailable with a short reason for the log and the metrics; their
detail (which may quote a URL, a header or the server's internals) never reaches the model.
"""

from __future__ import annotations

import functools
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

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
from opentelemetry import context as otel_context
from opentelemetry.context import _SUPPRESS_HTTP_INSTRUMENTATION_KEY

from vagent_graph.agents.mcp_config import McpServerConfig
from vagent_graph.mcp.limits import McpLimits

#: Requests made for no turn (a session's notification stream, its closing, a tool list):
#: not traced, rather than traced into whichever turn opened the session.
_UNTRACED = otel_context.set_value(_SUPPRESS_HTTP_INSTRUMENTATION_KEY, True, otel_context.Context())
T = TypeVar("T")
#: Elicitations kept of one call (each cut to 300 characters); more are only counted.
MAX_ASKED = 3


#: The MCP SDK's loggers: at INFO, "Received session ID" and "Negotiated protocol version"
#: for every session the graph opens (mcp.client.*), and a server run in the same process
#: (a test's) says "Terminating session" and "Processing request of type" (mcp.server.*).
SDK_LOGGER = "mcp"


def quiet_sdk_logs() -> None:
    """The SDK's INFO lines are chatter on the console (`make run`): they show only when the
    root logger (LOG_LEVEL) is at DEBUG; its warnings and errors always do."""
    debug = logging.getLogger().getEffectiveLevel() <= logging.DEBUG
    logging.getLogger(SDK_LOGGER).setLevel(logging.NOTSET if debug else logging.WARNING)


class McpUnavailable(RuntimeError):
    """The server could not answer (down, timeout, dropped, protocol error); `reason` is a
    short word for logs and metrics. `unknown`: the call had been sent, so whether the tool
    acted is not known (a timeout, a connection dropped mid-call, a response cut off)."""

    def __init__(self, reason: str, unknown: bool = False) -> None:
        super().__init__(reason)
        self.reason, self.unknown = reason, unknown


class ResponseTooLarge(httpx.TransportError):
    """A server's response went over MCP_RESPONSE_MAX_BYTES (raised while it streams in)."""


class Guard:
    """What a session's HTTP client learns from the call using the session (one at a time):
    the calling turn's trace context, and where to stop the call when a response is too
    large. Also the size cap itself."""

    def __init__(self, max_bytes: int, context: otel_context.Context | None = None) -> None:
        self.max_bytes = max_bytes
        #: The calling turn's OpenTelemetry context (None: no call: untraced).
        self.context = context
        #: The cancel scope of the call in progress, cancelled when its response is too large.
        self.scope: anyio.CancelScope | None = None
        self.too_large = False

    def exceeded(self) -> None:
        self.too_large = True
        if self.scope is not None:
            self.scope.cancel()

    async def run(self, work: Callable[[], Awaitable[T]], context: otel_context.Context | None) -> T:
        """`await work()` for a call traced under `context`; McpUnavailable("too_large") as
        soon as a response goes over the cap (not when the timeout ends the wait)."""
        self.context, self.too_large = context, False
        try:
            with anyio.CancelScope() as scope:
                self.scope = scope
                return await work()
            raise McpUnavailable("too_large", unknown=True)  # cancelled: the cap was hit
        finally:
            self.scope, self.context = None, None


class _Limited(httpx.AsyncByteStream):
    """A response body that stops at the guard's cap, while it is read."""

    def __init__(self, inner: httpx.AsyncByteStream, guard: Guard) -> None:
        self.inner, self.guard = inner, guard

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self.inner:
            seen += len(chunk)
            if seen > self.guard.max_bytes:
                self.guard.exceeded()
                raise ResponseTooLarge(f"more than {self.guard.max_bytes} bytes")
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class _EventLimited(httpx.AsyncByteStream):
    """A long-lived event stream (the legacy SSE transport's GET, where the answers come):
    each event stops at the guard's cap while it is read, the stream as a whole may go on."""

    def __init__(self, inner: httpx.AsyncByteStream, guard: Guard) -> None:
        self.inner, self.guard = inner, guard

    async def __aiter__(self) -> AsyncIterator[bytes]:
        since = 0  # bytes since the last blank line (the end of an event)
        tail = b""
        async for chunk in self.inner:
            joined = tail + chunk
            end = max(joined.rfind(b"\n\n"), joined.rfind(b"\r\n\r\n"))
            since = len(joined) - end if end >= 0 else since + len(chunk)
            if since > self.guard.max_bytes:
                self.guard.exceeded()
                raise ResponseTooLarge(f"an event of more than {self.guard.max_bytes} bytes")
            tail = joined[-3:]
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class GuardedClient(httpx.AsyncClient):
    """The HTTP client of one session: a call's POSTs in the calling turn's trace, everything
    else untraced; POST responses, and each event of an event stream, read up to the cap.
    (`send` is the one method every request of the SDK goes through, whatever transport or
    proxy serves it.)"""

    def __init__(self, guard: Guard, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.guard = guard

    async def send(self, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        context = self.guard.context if request.method == "POST" else None
        token = otel_context.attach(context if context is not None else _UNTRACED)
        try:
            response = await super().send(request, **kwargs)
        finally:
            otel_context.detach(token)
        if isinstance(response.stream, httpx.AsyncByteStream):
            if request.method == "POST":
                response.stream = _Limited(response.stream, self.guard)
            elif "text/event-stream" in response.headers.get("content-type", ""):
                response.stream = _EventLimited(response.stream, self.guard)
        return response


@dataclass(frozen=True)
class Elicited:
    """What a server asked the user during one call (all declined): the first questions, and
    how many there were."""

    asked: tuple[str, ...] = ()
    count: int = 0


class Declined:
    """Declines every elicitation (a server asking the user for input mid-call) and keeps
    what was asked, so the model can tell the user. Why not ask in the thread: a question
    must survive a restart, and an MCP call cannot (its session is gone); the server gets a
    clean "decline" instead of a protocol error. At most MAX_ASKED are kept (a hostile
    server may ask thousands of times); the others are counted."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.count = 0

    def reset(self) -> None:
        self.asked, self.count = [], 0

    def elicited(self) -> Elicited:
        return Elicited(tuple(self.asked), self.count)

    async def __call__(
        self, context: RequestContext[ClientSession, Any], params: ElicitRequestParams
    ) -> ElicitResult:
        self.count += 1
        if len(self.asked) < MAX_ASKED:
            self.asked.append(" ".join(str(getattr(params, "message", ""))[:1000].split())[:300])
        return ElicitResult(action="decline")


@asynccontextmanager
async def session(
    server: McpServerConfig,
    auth: httpx.Auth | None,
    elicitation: Declined | None = None,
    on_message: MessageHandlerFnT | None = None,
    guard: Guard | None = None,
) -> AsyncIterator[ClientSession]:
    """An initialised session with `server`, its HTTP requests signed by `auth` and watched by
    `guard`; `on_message` sees what the server sends by itself (notifications)."""
    decline = elicitation or Declined()
    guard = guard or Guard(McpLimits().response_max_bytes)
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

        def client(
            headers: dict[str, str] | None = None,
            timeout: httpx.Timeout | None = None,
            auth: httpx.Auth | None = None,
        ) -> httpx.AsyncClient:
            return GuardedClient(guard, headers=headers, timeout=timeout, auth=auth, verify=tls())

        opened = sse_client(url, auth=auth, timeout=server.timeout_seconds, httpx_client_factory=client)
        async with opened as (read, write):
            async with ClientSession(read, write, **extra) as s:
                await s.initialize()
                yield s
        return
    timeout = httpx.Timeout(server.timeout_seconds)
    async with (
        GuardedClient(guard, auth=auth, timeout=timeout, follow_redirects=False, verify=tls()) as http,
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


def reason_of(exc: BaseException, guard: Guard | None = None) -> str:
    """A short word for what went wrong, for logs and metrics (never the detail)."""
    if (guard is not None and guard.too_large) or isinstance(exc, ResponseTooLarge):
        return "too_large"
    if isinstance(exc, McpUnavailable):
        return exc.reason
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


def never_sent(exc: BaseException | None) -> bool:
    """Did the connection fail before any request could reach the server (so a call on it
    certainly did not run)? Only a failed connect says so; a connection that broke later
    may have carried the call."""
    if isinstance(exc, BaseExceptionGroup):
        return bool(exc.exceptions) and all(never_sent(e) for e in exc.exceptions)
    return isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | ConnectionRefusedError)


async def list_tools(
    server: McpServerConfig, auth: httpx.Auth | None, limits: McpLimits | None = None
) -> list[McpTool]:
    """The tools the server lists, page after page, up to `limits.listed_max` (a server that
    lists without end, or pages forever, is read no further: the caps of tools.py keep far
    fewer anyway)."""
    limits = limits or McpLimits()
    guard = Guard(limits.response_max_bytes)

    async def read(s: ClientSession) -> list[McpTool]:
        tools: list[McpTool] = []
        cursor: str | None = None
        while len(tools) < limits.listed_max:
            page = await s.list_tools(cursor=cursor) if cursor else await s.list_tools()
            tools.extend(page.tools)
            cursor = page.nextCursor
            if not cursor:
                break
        return tools[: limits.listed_max]

    try:
        with anyio.fail_after(server.timeout_seconds):
            async with session(server, auth, guard=guard) as s:
                return await guard.run(lambda: read(s), None)
    except Exception as exc:
        raise McpUnavailable(reason_of(exc, guard)) from None


async def watch_tool_list(
    server: McpServerConfig, auth: httpx.Auth | None, changed: Callable[[], None]
) -> None:
    """Hold a session open and call `changed` on each `notifications/tools/list_changed`;
    returns when the session ends (the server went away, or never streams notifications)."""

    async def on_message(message: Any) -> None:
        if isinstance(message, ServerNotification) and isinstance(message.root, ToolListChangedNotification):
            changed()

    guard = Guard(McpLimits().response_max_bytes)
    try:
        async with session(server, auth, on_message=on_message, guard=guard) as s:
            with anyio.fail_after(server.timeout_seconds):  # some servers tell only the
                await guard.run(s.list_tools, None)  # sessions that listed the tools
            await anyio.sleep_forever()
    except Exception as exc:
        raise McpUnavailable(reason_of(exc, guard)) from None
