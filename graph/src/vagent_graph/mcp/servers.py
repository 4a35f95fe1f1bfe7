"""The MCP servers of the agent, kept in the tool registry while the graph runs.

At startup each server's tool list is read; a server that is down does not stop the graph:
its tools are absent, `vagent_graph_mcp_servers_up{server}` is 0, a warning says so, and it
is asked again with backoff (1 s doubling, capped at MCP_REFRESH_SECONDS) until it answers;
then its tools appear without a restart. Every server is read again each MCP_REFRESH_SECONDS
(tools added, changed or removed follow), and at once when the server says its list changed
(`notifications/tools/list_changed`, on a session kept open for it where the transport
delivers notifications), but not more often than every LIST_CHANGED_MIN_SECONDS: a server
sending a storm of them gets one read per interval, not one per notification. The list is
turned into Tools in a worker thread (for hundreds of tools that took seconds of CPU, which
stalled every conversation on the event loop). A tool whose name is taken (a built-in tool,
or another server's) is refused with a warning; the first one stays. What a server brings
beyond MCP_MAX_TOOLS or MCP_MAX_SCHEMA_CHARS is left out with one warning, and counted in
`vagent_graph_mcp_tools_skipped{server,reason}`.

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

from vagent_graph.agents.mcp_config import McpServerConfig
from vagent_graph.mcp import client
from vagent_graph.mcp.client import McpUnavailable
from vagent_graph.mcp.limits import McpLimits, TurnImages
from vagent_graph.mcp.pool import SessionPool, credential_digest
from vagent_graph.mcp.results import failure_text, read
from vagent_graph.mcp.tools import Skipped, build_tools
from vagent_graph.observability import metrics
from vagent_graph.observability.recorder import current_turn
from vagent_graph.observability.spans import mcp_span
from vagent_graph.services.credentials import HeaderAuth, credential_auth
from vagent_graph.tools.base import RunFn, ToolContext, ToolResult
from vagent_graph.tools.registry import ToolRegistry
from vagent_shared.wire import McpServerStatus

log = structlog.get_logger(__name__)

FIRST_RETRY_SECONDS = 1.0
#: How long the graph's start waits for the servers' first answers.
STARTUP_WAIT_SECONDS = 5.0
#: The shortest time between two reads of a server's list that its `list_changed` asked for.
LIST_CHANGED_MIN_SECONDS = 2.0
#: Why a listed tool is not offered (the metric's `reason`s).
SKIP_REASONS = ("invalid_name", "invalid_schema", "name_taken", "max_tools", "schema_budget")


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
        limits: McpLimits | None = None,
    ) -> None:
        self.servers, self.registry = servers, registry
        self.refresh_seconds, self.limits = refresh_seconds, limits or McpLimits()
        self.state = {s.name: ServerState() for s in servers}
        self._tasks: list[asyncio.Task[None]] = []
        #: Sessions reused by the calls of one server and one credential (pool.py).
        self.pool = SessionPool(limits=self.limits)
        #: Images each turn has sent to the room (MCP_MAX_IMAGES per turn, all servers).
        self.images = TurnImages(self.limits.max_images)

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
        client.quiet_sdk_logs()  # after LOG_LEVEL configured logging (the graph's start)
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
            loop = asyncio.get_running_loop()
            last = loop.time()
            answered = await self.refresh(server)
            first.set()
            delay = FIRST_RETRY_SECONDS
            while True:
                with contextlib.suppress(TimeoutError):  # a list_changed wakes it early
                    await asyncio.wait_for(changed.wait(), self.refresh_seconds if answered else delay)
                if changed.is_set():  # but never more often than every LIST_CHANGED_MIN_SECONDS
                    await asyncio.sleep(last + LIST_CHANGED_MIN_SECONDS - loop.time())
                changed.clear()
                last = loop.time()
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
            listed = await client.list_tools(server, self._list_auth(server), self.limits)
        except McpUnavailable as exc:
            if st.up or st.reason == "not_checked":
                log.warning("mcp_server_down", server=server.name, reason=exc.reason)
            st.up, st.reason = False, exc.reason
            metrics.MCP_SERVERS_UP.labels(server.name).set(0)
            metrics.MCP_FAILURES.labels(server.name, f"list_{exc.reason}").inc()
            return False
        tools, skipped = await asyncio.to_thread(
            build_tools,
            server,
            listed,
            lambda name: self._run_fn(server, name),
            max_tools=self.limits.max_tools,
            max_schema_chars=self.limits.max_schema_chars,
        )
        for s in skipped:
            if s.reason in ("invalid_name", "invalid_schema"):
                log.warning("mcp_tool_skipped", server=server.name, tool=s.tool, reason=s.reason)
        capped = [s.tool for s in skipped if s.reason in ("max_tools", "schema_budget")]
        if capped:
            log.warning(
                "mcp_tools_over_cap",
                server=server.name,
                offered=len(tools),
                left_out=len(capped),
                first_left_out=capped[:5],
                max_tools=self.limits.max_tools,
                max_schema_chars=self.limits.max_schema_chars,
            )
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
        for reason in SKIP_REASONS:
            metrics.MCP_TOOLS_SKIPPED.labels(server.name, reason).set(
                sum(s.reason == reason for s in skipped)
            )
        return True

    def _run_fn(self, server: McpServerConfig, name: str) -> RunFn:
        exposed = f"{server.name}__{name}"

        async def run(args: BaseModel, ctx: ToolContext, answer: str | None) -> str | ToolResult:
            try:
                with mcp_span(server.name, name):
                    result, elicited = await self.pool.call(
                        server,
                        name,
                        args.model_dump(mode="json"),
                        auth_for(server, ctx),
                        credential_id(server, ctx),
                    )
            except McpUnavailable as exc:
                log.warning(
                    "mcp_call_failed",
                    server=server.name,
                    tool=exposed,
                    reason=exc.reason,
                    unknown=exc.unknown,
                )
                metrics.MCP_FAILURES.labels(server.name, f"call_{exc.reason}").inc()
                return failure_text(exposed, exc, server.timeout_seconds)
            if elicited.count:
                log.info("mcp_elicitation_declined", server=server.name, tool=exposed, count=elicited.count)
            turn = current_turn()
            turn_id = turn.trace.turn_id if turn else None
            got = read(exposed, result, elicited, self.limits, lambda n: self.images.take(turn_id, n))
            if got.failed:
                metrics.MCP_FAILURES.labels(server.name, "call_tool_error").inc()
            if got.left_out:
                metrics.TOOL_IMAGES.labels("over_cap").inc(got.left_out)
            return ToolResult(text=got.text, images=got.images) if got.images else got.text

        return run
