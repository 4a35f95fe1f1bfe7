"""The MCP servers of the agent, kept in the tool registry while the graph runs.

At startup each server's tool list is read; a server that is down does not stop the graph:
its tools are absent, `vagent_graph_mcp_servers_up{server}` is 0, a warning says so, and it
is asked again with backoff (1 s doubling, capped at MCP_REFRESH_SECONDS) until it answers;
then its tools appear without a restart. Every server is read again each MCP_REFRESH_SECONDS
(tools added, changed or removed follow), and at once when the server says its list changed
(`notifications/tools/list_changed`, on a session kept open for it where the transport
delivers notifications). A tool whose name is taken (a built-in tool, or
another server's) is refused with a warning; the first one stays.

Lists are read without a user's credential: a server whose tools need one to be listed
must allow `tools/list` anonymously (the demo calendar does), or use `credential: service`.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import httpx
import structlog
from pydantic import BaseModel

from vagent_graph import metrics
from vagent_graph.mcp import client
from vagent_graph.mcp.client import McpUnavailable
from vagent_graph.mcp.config import McpServerConfig
from vagent_graph.mcp.pool import SessionPool, credential_digest
from vagent_graph.mcp.results import result_images, result_text
from vagent_graph.mcp.tools import Skipped, build_tools
from vagent_graph.services.credentials import HeaderAuth, credential_auth
from vagent_graph.telemetry_spans import mcp_span
from vagent_graph.tools.base import RunFn, ToolContext, ToolResult
from vagent_graph.tools.registry import ToolRegistry
from vagent_shared.wire import McpServerStatus

log = structlog.get_logger(__name__)

FIRST_RETRY_SECONDS = 1.0
#: How long the graph's start waits for the servers' first answers.
STARTUP_WAIT_SECONDS = 5.0


def auth_for(server: McpServerConfig, ctx: ToolContext | None) -> httpx.Auth | None:
    """What signs a request to `server`: the asking user's own credential (fetched by the
    workflow for this call only), the service's, or nothing."""
    if server.credential == "user":
        if ctx is None or ctx.credential is None:
            raise McpUnavailable("no_credential")
        return credential_auth(ctx.credential, server.credential_header)
    if server.credential == "service":
        secret = server.service_secret()
        if server.credential_header.lower() == "authorization":
            return HeaderAuth("Authorization", f"Bearer {secret}")
        return HeaderAuth(server.credential_header, secret)
    return None


def credential_id(server: McpServerConfig, ctx: ToolContext) -> str:
    """Which credential a call carries, as the session pool tells them apart (a digest)."""
    if server.credential == "user" and ctx.credential is not None:
        cred = ctx.credential
        return credential_digest(f"{cred.credential_type}:{cred.credential.get_secret_value()}")
    if server.credential == "service":
        return credential_digest(server.service_secret())
    return ""


def failure_text(tool: str, reason: str) -> str:
    """What the model is told when the server could not answer (never the detail)."""
    if reason == "timeout":
        return f"{tool} did not answer in time; whether it acted is unknown. Tell the user; do not retry now."
    return f"{tool} is unavailable right now ({reason}); tell the user it did not work. Do not retry now."


def declined_text(asked: list[str]) -> str:
    """What the model is told when the server asked the user for more input mid-call."""
    quoted = "; ".join(f'"{a}"' for a in asked)
    return (
        f"(The tool asked the user for more input ({quoted}); vagent cannot ask mid-call yet, so it "
        "declined. Ask the user for that information and call the tool again with it.)"
    )


@dataclass
class ServerState:
    up: bool = False
    tools: list[str] = field(default_factory=list)
    reason: str = "not_checked"


class McpServers:
    """Reads each server's tools into `registry` and keeps them fresh."""

    def __init__(
        self,
        servers: list[McpServerConfig],
        registry: ToolRegistry,
        refresh_seconds: float,
        result_max_chars: int,
    ) -> None:
        self.servers, self.registry = servers, registry
        self.refresh_seconds, self.result_max_chars = refresh_seconds, result_max_chars
        self.state = {s.name: ServerState() for s in servers}
        self._tasks: list[asyncio.Task[None]] = []
        #: Sessions reused by the calls of one server and one credential (pool.py).
        self.pool = SessionPool()

    def status(self) -> dict[str, McpServerStatus]:
        """Each server's state, for /health (the graph stays healthy while one is down)."""
        return {
            name: McpServerStatus(up=st.up, tools=len(st.tools), reason=None if st.up else st.reason)
            for name, st in self.state.items()
        }

    async def start(self, wait_seconds: float = STARTUP_WAIT_SECONDS) -> None:
        """Read every server (concurrently) and keep them fresh in the background. Waits up
        to `wait_seconds` for the first answers, so a server that hangs delays the start by
        that much at most; its tools appear when it answers."""
        first = {s.name: asyncio.Event() for s in self.servers}
        self._tasks = [asyncio.create_task(self._keep_fresh(s, first[s.name])) for s in self.servers]
        if first:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*(e.wait() for e in first.values())), wait_seconds)

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.pool.aclose()

    async def _keep_fresh(self, server: McpServerConfig, first: asyncio.Event) -> None:
        changed = asyncio.Event()
        watcher = asyncio.create_task(self._watch(server, changed))
        try:
            answered = await self.refresh(server)
            first.set()
            delay = FIRST_RETRY_SECONDS
            while True:
                with contextlib.suppress(TimeoutError):  # a list_changed wakes it early
                    await asyncio.wait_for(changed.wait(), self.refresh_seconds if answered else delay)
                changed.clear()
                answered = await self.refresh(server)
                delay = FIRST_RETRY_SECONDS if answered else min(delay * 2, self.refresh_seconds)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def _watch(self, server: McpServerConfig, changed: asyncio.Event) -> None:
        """Listen for `notifications/tools/list_changed` on a session of its own, where the
        transport delivers it; a server that does not stream them is polled (the loop above)."""
        while True:
            with contextlib.suppress(McpUnavailable):
                await client.watch_tool_list(server, self._list_auth(server), changed.set)
            await asyncio.sleep(self.refresh_seconds)

    @staticmethod
    def _list_auth(server: McpServerConfig) -> httpx.Auth | None:
        """No user asks for a list: a `user` server is asked anonymously (module docstring)."""
        return None if server.credential == "user" else auth_for(server, None)

    async def refresh(self, server: McpServerConfig) -> bool:
        """Read the server's list into the registry; False while it does not answer."""
        st = self.state[server.name]
        try:
            listed = await client.list_tools(server, self._list_auth(server))
        except McpUnavailable as exc:
            if st.up or st.reason == "not_checked":
                log.warning("mcp_server_down", server=server.name, reason=exc.reason)
            st.up, st.reason = False, exc.reason
            metrics.MCP_SERVERS_UP.labels(server.name).set(0)
            metrics.MCP_FAILURES.labels(server.name, f"list_{exc.reason}").inc()
            return False
        tools, skipped = build_tools(server, listed, lambda name: self._run_fn(server, name))
        for s in skipped:
            log.warning("mcp_tool_skipped", server=server.name, tool=s.tool, reason=s.reason)
        for old in st.tools:
            self.registry.remove(old)
        kept: list[str] = []
        for tool in tools:
            if tool.name in self.registry:
                skipped.append(Skipped(tool.name, "name_taken"))
                log.warning("mcp_tool_skipped", server=server.name, tool=tool.name, reason="name_taken")
                continue
            self.registry.register(tool)
            kept.append(tool.name)
        if not st.up:
            log.info("mcp_server_up", server=server.name, tools=kept)
        st.up, st.tools, st.reason = True, kept, ""
        metrics.MCP_SERVERS_UP.labels(server.name).set(1)
        metrics.MCP_TOOLS.labels(server.name).set(len(kept))
        return True

    def _run_fn(self, server: McpServerConfig, name: str) -> RunFn:
        exposed = f"{server.name}__{name}"

        async def run(args: BaseModel, ctx: ToolContext, answer: str | None) -> str | ToolResult:
            try:
                with mcp_span(server.name, name):
                    result, asked = await self.pool.call(
                        server,
                        name,
                        args.model_dump(mode="json"),
                        auth_for(server, ctx),
                        credential_id(server, ctx),
                    )
            except McpUnavailable as exc:
                log.warning("mcp_call_failed", server=server.name, tool=exposed, reason=exc.reason)
                metrics.MCP_FAILURES.labels(server.name, f"call_{exc.reason}").inc()
                return failure_text(exposed, exc.reason)
            text, failed = result_text(exposed, result, self.result_max_chars)
            if failed:
                metrics.MCP_FAILURES.labels(server.name, "call_tool_error").inc()
            if asked:
                log.info("mcp_elicitation_declined", server=server.name, tool=exposed)
                text += "\n" + declined_text(asked)
            images = result_images(result)
            return ToolResult(text=text, images=images) if images else text

        return run
