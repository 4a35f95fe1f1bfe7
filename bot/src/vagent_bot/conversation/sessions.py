"""One run per session at a time, in arrival order; `!stop` cancels the running one.

Each session gets a FIFO queue and a worker task that handles its items one by one; the
worker ends when the queue stays empty. Work is enqueued synchronously in sync order,
so no await between receiving and queueing can reorder a user's messages.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import structlog

log = structlog.get_logger(__name__)
Job = Callable[[], Coroutine[Any, Any, Any]]


@dataclass
class _Session:
    queue: asyncio.Queue[Job] = field(default_factory=asyncio.Queue)
    worker: asyncio.Task[None] | None = None
    current: asyncio.Task[Any] | None = None


class SessionWorkers:
    def __init__(self, idle_seconds: float = 30.0) -> None:
        self._sessions: dict[str, _Session] = {}
        self._idle = idle_seconds
        self._closing = False

    def submit(self, session_id: str, job: Job) -> None:
        if self._closing:
            return
        session = self._sessions.setdefault(session_id, _Session())
        session.queue.put_nowait(job)
        if session.worker is None or session.worker.done():
            session.worker = asyncio.create_task(
                self._work(session_id, session), name=f"session:{session_id}"
            )

    async def _work(self, session_id: str, session: _Session) -> None:
        while True:
            try:
                job = await asyncio.wait_for(session.queue.get(), self._idle)
            except TimeoutError:
                if self._sessions.get(session_id) is session and session.queue.empty():
                    del self._sessions[session_id]
                return
            session.current = asyncio.create_task(job())
            try:
                await session.current
            except asyncio.CancelledError:
                if not session.current.cancelled():  # the worker itself is being cancelled
                    raise
                if asyncio.current_task() and asyncio.current_task().cancelling():  # type: ignore[union-attr]
                    raise
            except Exception:
                log.exception("session_job_failed", session_id=session_id)
            finally:
                session.current = None

    def busy(self, session_id: str) -> bool:
        session = self._sessions.get(session_id)
        return bool(session and session.current and not session.current.done())

    def stop(self, session_id: str) -> bool:
        """Cancel the running job of the session (queued ones still run)."""
        session = self._sessions.get(session_id)
        if session and session.current and not session.current.done():
            session.current.cancel()
            return True
        return False

    def active(self) -> int:
        return sum(1 for session in self._sessions.values() if session.current and not session.current.done())

    async def shutdown(self, grace_seconds: float) -> None:
        """SIGTERM: finish what runs within the grace period, then cancel the rest."""
        self._closing = True
        running = [
            session.current
            for session in self._sessions.values()
            if session.current and not session.current.done()
        ]
        if running:
            await asyncio.wait(running, timeout=grace_seconds)
        for session in self._sessions.values():
            for task in (session.current, session.worker):
                if task and not task.done():
                    task.cancel()
        for session in self._sessions.values():
            for task in (session.current, session.worker):
                if task:
                    with contextlib.suppress(BaseException):
                        await task
