"""Open MCP sessions, reused by the calls of ONE server and ONE credential, one call at a time.

Why reuse: opening a session per call (a new HTTP client, TLS context, `initialize`, the SDK's
own `tools/list`) cost ~30 ms of CPU and ~40 ms per call (bench/README.md, "MCP tool turns");
a reused session costs ~2 ms. Why it stays safe: the key is the server AND a digest of the
credential (computed here, kept nowhere else), so a session only ever carries the one
credential it was opened with; two users never share one, whatever the concurrency.

Why one call per session, and a session per call in flight: with `credential: none|service`
every user's calls share a key. A session shared by calls in flight would make one call's
trouble the others' (the old pool pinged a session under its lock while a slow call held it,
gave up after 5 s and closed the session under that call, so a booking that may well have
happened was reported as failed, and a retry could book twice). Here a call takes an idle
session of its key or opens one; nobody waits for another's call, and only a session that is
idle is ever pinged or closed. At most MAX_PER_KEY calls of one key run at once; one more
waits for a free slot within its own timeout, never longer.

The whole call (a free slot, a session, the ping of one idle for PING_AFTER_SECONDS, the call)
has the server's `timeout_seconds`. A call that fails before it was sent did not run, and
says so; one that was sent and then timed out, lost its connection or got a response too
large to read may or may not have acted (`McpUnavailable.unknown`), and its session is closed:
what state it is in is unknown. Each session lives in a task of its own (the SDK's session is
a context entered and left in one task). Sessions idle for IDLE_SECONDS are closed; at most
MAX_SESSIONS stay idle (the least recently used go first).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
from mcp import ClientSession
from mcp.shared.exceptions import McpError
from mcp.types import CONNECTION_CLOSED, CallToolResult
from opentelemetry import context as otel_context

from vagent_graph.agents.mcp_config import McpServerConfig
from vagent_graph.mcp.client import Declined, Elicited, Guard, McpUnavailable, never_sent, reason_of, session
from vagent_graph.mcp.limits import McpLimits

MAX_SESSIONS = 512
#: Calls of one server and one credential in flight at once (a session each).
MAX_PER_KEY = 16
IDLE_SECONDS = 120.0
PING_AFTER_SECONDS = 5.0
PING_TIMEOUT_SECONDS = 5.0
#: The SDK's answer when the server no longer knows the session (HTTP 404: a restarted
#: server); the call never reached a tool, so it is sent once more on a new session.
SESSION_TERMINATED = 32600

Key = tuple[str, str]


def credential_digest(secret: str) -> str:
    """What tells two credentials apart in the pool's key (never the secret itself)."""
    return hashlib.sha256(secret.encode()).hexdigest() if secret else ""


def call_failure(exc: BaseException, holder: BaseException | None, guard: Guard) -> McpUnavailable:
    """What a failure of a call that was SENT means (`holder`: how its session's task ended,
    if it did). Pure. Only a server's own JSON-RPC error answer, or a connection that never
    got up, says the tool did not run; anything else leaves it unknown."""
    if guard.too_large:
        return McpUnavailable("too_large", unknown=True)
    if isinstance(exc, McpUnavailable):
        return exc
    if isinstance(exc, McpError):
        if exc.error.code == SESSION_TERMINATED:
            return McpUnavailable("session_expired")
        if exc.error.code == CONNECTION_CLOSED:
            if never_sent(holder):
                return McpUnavailable("unreachable")
            return McpUnavailable("dropped", unknown=True)
        return McpUnavailable("protocol_error")
    if never_sent(exc):
        return McpUnavailable("unreachable")
    return McpUnavailable(reason_of(exc), unknown=True)


@dataclass(eq=False)
class _Open:
    session: ClientSession
    declined: Declined
    guard: Guard
    closing: asyncio.Event
    task: asyncio.Task[None]
    last_used: float = field(default_factory=time.monotonic)
    alive: bool = True
    #: How the session's task ended, if it ended with a failure.
    failure: BaseException | None = None


@dataclass(eq=False)
class _Key:
    """One server and credential: its free slots and its idle sessions (newest last)."""

    slots: asyncio.Semaphore
    idle: list[_Open] = field(default_factory=list)
    #: Calls holding or waiting for a slot (the entry goes when nobody uses it).
    users: int = 0


class SessionPool:
    def __init__(
        self,
        max_sessions: int = MAX_SESSIONS,
        idle_seconds: float = IDLE_SECONDS,
        limits: McpLimits | None = None,
        max_per_key: int = MAX_PER_KEY,
    ) -> None:
        self.max_sessions, self.idle_seconds, self.max_per_key = max_sessions, idle_seconds, max_per_key
        self.limits = limits or McpLimits()
        self._keys: dict[Key, _Key] = {}
        self._busy: set[_Open] = set()

    def __len__(self) -> int:
        """Sessions open now (idle or in a call)."""
        return len(self._busy) + sum(len(k.idle) for k in self._keys.values())

    async def call(
        self,
        server: McpServerConfig,
        name: str,
        arguments: dict[str, Any],
        auth: httpx.Auth | None,
        credential: str,
    ) -> tuple[CallToolResult, Elicited]:
        """One call on a session of (`server`, `credential`), opened if none is idle; and what
        the server asked mid-call (each declined). McpUnavailable when it failed: `unknown` once
        the call had been sent."""
        key = (server.name, credential)
        state = self._keys.get(key)
        if state is None:
            state = self._keys[key] = _Key(asyncio.Semaphore(self.max_per_key))
        state.users += 1
        deadline = time.monotonic() + server.timeout_seconds
        try:
            try:
                with anyio.fail_after(server.timeout_seconds):
                    await state.slots.acquire()
            except TimeoutError:
                raise McpUnavailable("busy") from None
            try:
                return await self._call(server, state, name, arguments, auth, deadline)
            finally:
                state.slots.release()
        finally:
            state.users -= 1
            if not state.users and not state.idle and self._keys.get(key) is state:
                del self._keys[key]  # credentials rotate: no key stays behind

    async def _call(
        self,
        server: McpServerConfig,
        state: _Key,
        name: str,
        arguments: dict[str, Any],
        auth: httpx.Auth | None,
        deadline: float,
    ) -> tuple[CallToolResult, Elicited]:
        context = otel_context.get_current()
        for attempt in (1, 2):
            entry = await self._take(server, state, auth, deadline, context)
            call = functools.partial(entry.session.call_tool, name, arguments)
            entry.declined.reset()
            self._busy.add(entry)
            try:
                with anyio.fail_after(max(deadline - time.monotonic(), 0.01)):
                    result = await entry.guard.run(call, context)
            except BaseException as exc:
                self._busy.discard(entry)
                if not isinstance(exc, Exception):  # cancelled: the session is in an unknown state
                    self._discard(entry)
                    raise
                entry.closing.set()
                if isinstance(exc, McpError) and exc.error.code == CONNECTION_CLOSED:
                    await asyncio.wait({entry.task}, timeout=1.0)  # why it closed: did it ever connect?
                failure = call_failure(exc, entry.failure, entry.guard)
                self._discard(entry)
                if failure.reason == "session_expired" and attempt == 1 and time.monotonic() < deadline:
                    self._drop_idle(state)  # the server restarted: its other sessions are gone too
                    continue
                raise failure from None
            self._busy.discard(entry)
            elicited = entry.declined.elicited()  # before the session serves anybody else
            entry.last_used = time.monotonic()
            if entry.alive:
                state.idle.append(entry)
                self._expire()
            return result, elicited
        raise AssertionError("unreachable")  # pragma: no cover

    async def _take(
        self,
        server: McpServerConfig,
        state: _Key,
        auth: httpx.Auth | None,
        deadline: float,
        context: otel_context.Context,
    ) -> _Open:
        """An idle session of the key that still answers, or a new one; McpUnavailable (the
        call was not sent) when none can be had in time."""
        while state.idle:
            entry = state.idle.pop()
            if not entry.alive:
                self._discard(entry)
                continue
            if time.monotonic() - entry.last_used < PING_AFTER_SECONDS:
                return entry
            if await self._answers(entry, deadline, context):  # idle a while: is it still known?
                return entry
            self._discard(entry)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise McpUnavailable("timeout")
        return await self._start(server, auth, deadline, context)

    @staticmethod
    async def _answers(entry: _Open, deadline: float, context: otel_context.Context) -> bool:
        """A ping of a session that is idle (nobody else's call is on it)."""
        try:
            with anyio.fail_after(max(min(PING_TIMEOUT_SECONDS, deadline - time.monotonic()), 0.01)):
                await entry.guard.run(entry.session.send_ping, context)
        except Exception:
            return False
        return True

    async def _start(
        self, server: McpServerConfig, auth: httpx.Auth | None, deadline: float, context: otel_context.Context
    ) -> _Open:
        ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
        closing, declined = asyncio.Event(), Declined()
        guard = Guard(self.limits.response_max_bytes, context)  # `initialize` in the caller's trace
        holder: list[_Open] = []

        async def hold() -> None:
            try:
                async with session(server, auth, declined, guard=guard) as s:
                    ready.set_result(s)
                    await closing.wait()
            except Exception as exc:
                if not ready.done():
                    ready.set_exception(McpUnavailable(reason_of(exc, guard)))
                for entry in holder:
                    entry.failure = exc
            finally:
                for entry in holder:
                    entry.alive = False

        task = asyncio.create_task(hold())
        try:
            s = await asyncio.wait_for(asyncio.shield(ready), max(deadline - time.monotonic(), 0.01))
        except (TimeoutError, McpUnavailable) as exc:
            closing.set()
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            raise exc if isinstance(exc, McpUnavailable) else McpUnavailable("timeout") from None
        finally:
            guard.context = None
        entry = _Open(s, declined, guard, closing, task)
        holder.append(entry)
        return entry

    def _discard(self, entry: _Open) -> None:
        """Close a session in its own time (its task leaves the SDK's context)."""
        entry.alive = False
        entry.closing.set()

    def _drop_idle(self, state: _Key) -> None:
        for entry in state.idle:
            self._discard(entry)
        state.idle.clear()

    def _expire(self) -> None:
        """Idle sessions past IDLE_SECONDS go, and the least recently used beyond MAX_SESSIONS."""
        now = time.monotonic()
        idle = [(e.last_used, id(e), key, e) for key, k in self._keys.items() for e in k.idle]
        over = len(idle) + len(self._busy) - self.max_sessions
        for n, (last_used, _, key, entry) in enumerate(sorted(idle)):
            if n < over or now - last_used > self.idle_seconds or not entry.alive:
                self._keys[key].idle.remove(entry)
                self._discard(entry)
        for key in [k for k, state in self._keys.items() if not state.idle and not state.users]:
            del self._keys[key]

    async def aclose(self) -> None:
        entries = [e for k in self._keys.values() for e in k.idle] + list(self._busy)
        for state in self._keys.values():
            state.idle.clear()
        self._busy.clear()
        for entry in entries:
            self._discard(entry)
        tasks = {e.task for e in entries}
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=5)
            for task in stuck:
                task.cancel()
