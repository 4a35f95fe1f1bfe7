"""Open MCP sessions, reused by the calls of ONE server and ONE credential.

Why: opening a session per call (a new HTTP client, TLS context, `initialize`, the SDK's own
`tools/list`) cost ~30 ms of CPU and ~40 ms per call (bench/README.md, "MCP tool turns");
a reused session costs ~2 ms. Why it stays safe: the key is the server AND a digest of the
credential (computed here, kept nowhere else), so a session only ever carries the one
credential it was opened with; two users never share one, whatever the concurrency.

Each session lives in a task of its own (the SDK's session is a context that must be entered
and left in one task); calls use it from their own tasks, one call at a time per session (so
what the server asks mid-call is attributed to that call). A session idle for a while is
pinged before it is used (a restarted server forgets its sessions; a failed ping costs
nothing, the call goes on a new session). A call that fails or times out closes its session:
what state it is in is unknown. Sessions idle for IDLE_SECONDS are closed; at most
MAX_SESSIONS stay open (the least recently used go first).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
from mcp import ClientSession
from mcp.types import CallToolResult

from vagent_graph.mcp.client import Declined, McpUnavailable, reason_of, session
from vagent_graph.mcp.config import McpServerConfig

MAX_SESSIONS = 512
IDLE_SECONDS = 120.0
PING_AFTER_SECONDS = 5.0

Key = tuple[str, str]


def credential_digest(secret: str) -> str:
    """What tells two credentials apart in the pool's key (never the secret itself)."""
    return hashlib.sha256(secret.encode()).hexdigest() if secret else ""


@dataclass
class _Open:
    session: ClientSession
    declined: Declined
    closing: asyncio.Event
    task: asyncio.Task[None]
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)
    alive: bool = True


class SessionPool:
    def __init__(self, max_sessions: int = MAX_SESSIONS, idle_seconds: float = IDLE_SECONDS) -> None:
        self.max_sessions, self.idle_seconds = max_sessions, idle_seconds
        self._open: dict[Key, _Open] = {}
        self._opening: dict[Key, asyncio.Lock] = {}

    def __len__(self) -> int:
        return len(self._open)

    async def call(
        self,
        server: McpServerConfig,
        name: str,
        arguments: dict[str, Any],
        auth: httpx.Auth | None,
        credential: str,
    ) -> tuple[CallToolResult, list[str]]:
        """One call on the session of (`server`, `credential`), opened if need be; and what
        the server asked mid-call (declined)."""
        key = (server.name, credential)
        entry = await self._usable(server, key, auth)
        async with entry.lock:
            entry.declined.asked = []
            try:
                with anyio.fail_after(server.timeout_seconds):
                    result = await entry.session.call_tool(name, arguments)
            except Exception as exc:
                await self._close(key, entry)
                raise McpUnavailable(reason_of(exc)) from None
            entry.last_used = time.monotonic()
            return result, list(entry.declined.asked)

    async def _usable(self, server: McpServerConfig, key: Key, auth: httpx.Auth | None) -> _Open:
        await self._expire()
        lock = self._opening.setdefault(key, asyncio.Lock())
        async with lock:
            entry = self._open.get(key)
            if entry is not None and entry.alive:
                if time.monotonic() - entry.last_used < PING_AFTER_SECONDS or await self._answers(entry):
                    entry.last_used = time.monotonic()  # in use now: not for _expire to close
                    return entry
            if entry is not None:
                await self._close(key, entry)
            entry = await self._start(server, auth)
            self._open[key] = entry
            return entry

    @staticmethod
    async def _answers(entry: _Open) -> bool:
        try:
            with anyio.fail_after(5):
                async with entry.lock:
                    await entry.session.send_ping()
        except Exception:
            return False
        return True

    async def _start(self, server: McpServerConfig, auth: httpx.Auth | None) -> _Open:
        ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
        closing, declined = asyncio.Event(), Declined()
        holder: list[_Open] = []

        async def hold() -> None:
            try:
                async with session(server, auth, declined) as s:
                    ready.set_result(s)
                    await closing.wait()
            except Exception as exc:
                if not ready.done():
                    ready.set_exception(McpUnavailable(reason_of(exc)))
            finally:
                for entry in holder:
                    entry.alive = False

        task = asyncio.create_task(hold())
        try:
            s = await asyncio.wait_for(asyncio.shield(ready), server.timeout_seconds)
        except (TimeoutError, McpUnavailable) as exc:
            closing.set()
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            raise exc if isinstance(exc, McpUnavailable) else McpUnavailable("timeout") from None
        entry = _Open(s, declined, closing, task)
        holder.append(entry)
        return entry

    async def _expire(self) -> None:
        now = time.monotonic()
        idle = [k for k, e in self._open.items() if now - e.last_used > self.idle_seconds or not e.alive]
        over = len(self._open) - len(idle) - self.max_sessions + 1
        if over > 0:
            busy = sorted((e.last_used, k) for k, e in self._open.items() if k not in idle)
            idle += [k for _, k in busy[:over]]
        for key in idle:
            entry = self._open.get(key)
            if entry is not None and not entry.lock.locked():
                await self._close(key, entry)

    async def _close(self, key: Key, entry: _Open) -> None:
        if self._open.get(key) is entry:
            del self._open[key]
            opening = self._opening.get(key)
            if opening is not None and not opening.locked():  # credentials rotate: no leak
                del self._opening[key]
        entry.alive = False
        entry.closing.set()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(entry.task, 5)

    async def aclose(self) -> None:
        for key, entry in list(self._open.items()):
            await self._close(key, entry)
