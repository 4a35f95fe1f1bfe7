"""One stall watchdog per streamed model call: a model that stops sending chunks (while its
connection stays open, e.g. with SSE keep-alive comments only) ends the call after `limit`
seconds of silence instead of holding the turn until RUN_TIMEOUT_SECONDS.

Why not langchain-openai's `stream_chunk_timeout`: it wraps every chunk's `__anext__` in
`asyncio.wait_for` (a task-side timeout, a timer handle and its cancellation per chunk),
~25% of the model call's CPU (78 vs 58 µs per chunk, issue 34). The httpx read timeout does
not cover it: keep-alive comments are bytes, so it never fires.

How: the call's chunk handler writes the time of each chunk into `Beats.last_chunk` (one
float assignment per chunk, nothing else). ONE timer per call, armed `limit` after the call
starts, reads that time when it fires: `limit` of silence ends the call (asyncio.timeout's own
machinery cancels the task and raises; here `ModelStalled`, a TimeoutError, so the turn ends
with the usual "timeout" error event), otherwise it re-arms for `limit` after the last chunk.
Chunks that keep coming thus cost no timer work; the timer re-arms at most once per `limit`.

Each HTTP attempt of the call (the SDK's retries: `on_attempt`, an httpx event hook of
llm.metered_http_client) starts the wait for the first chunk again, so a retry after an
attempt timed out still gets its full `limit`, as the SDK's own timeout gives it.
"""

from __future__ import annotations

import asyncio
import time
from contextvars import ContextVar, Token
from types import TracebackType
from typing import Any, Protocol, Self


class Beats(Protocol):
    """Where the call's chunk handler records when the last chunk arrived (time.monotonic)."""

    last_chunk: float


class ModelStalled(TimeoutError):
    """No chunk from the model for the stall limit (LLM_TIMEOUT_SECONDS)."""


#: The guard of the call running in this task (the HTTP hooks read it).
_CURRENT: ContextVar[StallGuard | None] = ContextVar("vagent_stall_guard", default=None)


class StallGuard:
    """`async with StallGuard(limit, beats):` around one streamed model call: ModelStalled
    when no chunk (`beats.last_chunk`) came for `limit` seconds; the first chunk's wait too.
    A cancellation from outside (a stop, a client gone) stays a cancellation."""

    def __init__(self, limit: float, beats: Beats) -> None:
        if limit <= 0:
            raise ValueError("the stall limit must be > 0")
        self.limit = limit
        self.beats = beats
        #: The guard ended the call.
        self.stalled = False
        #: When the call, or its latest HTTP attempt, started (time.monotonic).
        self._since = 0.0
        self._timeout = asyncio.timeout(None)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._token: Token[StallGuard | None] | None = None

    async def __aenter__(self) -> Self:
        self._loop = asyncio.get_running_loop()
        await self._timeout.__aenter__()
        self._since = time.monotonic()
        self._handle = self._loop.call_later(self.limit, self._check)
        self._token = _CURRENT.set(self)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._token is not None:
            _CURRENT.reset(self._token)
            self._token = None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        try:
            await self._timeout.__aexit__(exc_type, exc, tb)
        except TimeoutError as timed_out:  # only when the guard fired (its deadline is ours)
            raise ModelStalled(f"no chunk from the model for {self.limit:g} s") from timed_out

    def touch(self) -> None:
        """An HTTP attempt of the call was sent or answered: its first chunk gets `limit`."""
        self._since = time.monotonic()

    def _check(self) -> None:
        """The timer: end the call after `limit` of silence, else wait for the rest of it."""
        self._handle = None
        loop = self._loop
        assert loop is not None  # armed in __aenter__
        left = max(self._since, self.beats.last_chunk) + self.limit - time.monotonic()
        if left > 0:
            self._handle = loop.call_later(left, self._check)
            return
        self.stalled = True
        self._timeout.reschedule(loop.time())  # due now: the task is cancelled -> TimeoutError


async def on_attempt(_: Any) -> None:
    """httpx event hook (request and response): an attempt of the guarded call in this task
    was sent or answered (`StallGuard.touch`); outside a guarded call it does nothing."""
    guard = _CURRENT.get()
    if guard is not None:
        guard.touch()
