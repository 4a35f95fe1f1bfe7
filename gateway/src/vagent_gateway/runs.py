"""Runs: one graph request each, run as a task of its own so a client can stream it, wait for
it, or cancel it from another request.

Why a task and a queue: the run must keep the thread's values right whoever listens (a
stream, `runs.wait`, nobody after a disconnect with `on_disconnect: continue`), and a cancel
arrives on another request. The task alone writes the thread while it runs; listeners read
neutral items from the queue and translate them to the stream modes they asked for.

Limits: at most `max_per_user` runs of one person at once (429), one run per thread (409,
LangGraph's `multitask_strategy: reject`); the graph's own session lock (409 session_busy)
covers a run of the same thread on another gateway replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import structlog

from vagent_gateway import translate
from vagent_gateway.graph_client import GraphError
from vagent_gateway.threads import ThreadRecord, ThreadStore, now_iso
from vagent_shared.events import ErrorEvent, HitlRequest, SSEEvent, TextChunk, TextFinal

log = structlog.get_logger(__name__)

RunStatus = Literal["pending", "running", "error", "success", "timeout", "interrupted"]

#: What the run task hands its listeners: ("chunk", {"text", "id"}), ("values", values),
#: ("updates", update), ("error", error data). None ends the queue.
Item = tuple[str, dict[str, Any]]

CANCELLED_MESSAGE: Final = "The run was cancelled."


class TooManyRuns(Exception):
    """The person already runs GATEWAY_MAX_STREAMS_PER_USER runs."""


class ThreadBusy(Exception):
    """A run of the thread is in progress."""


@dataclass
class Run:
    """One run; `started` resolves once the graph accepted it (or fails with its refusal)."""

    run_id: str
    thread_id: str
    owner: str
    assistant_id: str
    metadata: dict[str, Any]
    created_at: str = field(default_factory=now_iso)
    status: RunStatus = "pending"
    queue: asyncio.Queue[Item | None] = field(default_factory=asyncio.Queue)
    started: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    task: asyncio.Task[None] | None = None
    final_values: dict[str, Any] = field(default_factory=dict)
    error: dict[str, Any] | None = None

    def public(self) -> dict[str, Any]:
        """The run as LangGraph's `Run` schema."""
        return {
            "run_id": self.run_id,
            "thread_id": self.thread_id,
            "assistant_id": self.assistant_id,
            "created_at": self.created_at,
            "updated_at": now_iso(),
            "status": self.status,
            "metadata": self.metadata,
            "multitask_strategy": "reject",
        }


class Runs:
    """The runs of this process."""

    def __init__(self, store: ThreadStore, max_per_user: int) -> None:
        self.store, self.max_per_user = store, max_per_user
        self._runs: dict[str, Run] = {}
        self._by_thread: dict[str, str] = {}
        self._per_user: Counter[str] = Counter()

    def active(self) -> int:
        return len(self._runs)

    def running_on(self, thread_id: str) -> Run | None:
        run_id = self._by_thread.get(thread_id)
        return self._runs.get(run_id) if run_id else None

    def get(self, run_id: str, owner: str) -> Run | None:
        run = self._runs.get(run_id)
        return run if run is not None and run.owner == owner else None

    def reserve(self, record: ThreadRecord, assistant_id: str, metadata: dict[str, Any]) -> Run:
        """A new run of `record`'s thread, counted; raises ThreadBusy or TooManyRuns."""
        if record.thread_id in self._by_thread:
            raise ThreadBusy(record.thread_id)
        if self._per_user[record.owner] >= self.max_per_user:
            raise TooManyRuns(record.owner)
        run = Run(str(uuid.uuid4()), record.thread_id, record.owner, assistant_id, metadata)
        self._runs[run.run_id] = run
        self._by_thread[record.thread_id] = run.run_id
        self._per_user[record.owner] += 1
        return run

    def _release(self, run: Run) -> None:
        if self._runs.pop(run.run_id, None) is None:
            return
        self._by_thread.pop(run.thread_id, None)
        self._per_user[run.owner] -= 1
        if self._per_user[run.owner] <= 0:
            del self._per_user[run.owner]

    def start(
        self,
        run: Run,
        record: ThreadRecord,
        events: Callable[[], AsyncGenerator[SSEEvent, None]],
        human: dict[str, Any] | None,
    ) -> None:
        """Run `events` (the graph's stream) in a task; `human` is the user's message to add
        to the thread once the graph accepted the turn."""
        run.task = asyncio.get_running_loop().create_task(
            self._drive(run, record, events, human), name=f"gateway-run-{run.run_id}"
        )

    async def cancel(self, run: Run) -> None:
        """Stop the run like `!stop`: the graph request is closed, which cancels the graph's run."""
        if run.task is not None and not run.task.done():
            run.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run.task

    async def _drive(
        self,
        run: Run,
        record: ThreadRecord,
        events: Callable[[], AsyncGenerator[SSEEvent, None]],
        human: dict[str, Any] | None,
    ) -> None:
        answer_id = f"run-{run.run_id}"
        chunks: list[str] = []
        stream = events()
        try:
            try:
                first = await anext(stream)
            except GraphError as exc:
                run.status = "error"
                run.started.set_exception(exc)
                return
            except StopAsyncIteration:
                run.status = "error"
                run.started.set_exception(GraphError(502, "stream_broken", "The answer was interrupted."))
                return
            run.status = "running"
            run.started.set_result(None)
            if human is not None:
                record.messages.append(human)
            record.status, record.pending = "busy", None
            await self.store.save(record)
            await run.queue.put(("values", translate.values(record.messages)))
            await self._consume(run, record, first, stream, answer_id, chunks)
        except asyncio.CancelledError:
            run.status = "interrupted"
            record.status = "idle"
            run.error = translate.error_data("cancelled", CANCELLED_MESSAGE)
            with contextlib.suppress(Exception):
                await asyncio.shield(self.store.save(record))
            await run.queue.put(("error", run.error))
        except GraphError as exc:
            await self._fail(run, record, exc.code, exc.message)
        except Exception as exc:  # a bug or Redis down: the client gets a short error, the log the type
            log.error("run_failed", run_id=run.run_id, error_type=type(exc).__name__)
            await self._fail(run, record, "internal_error", "The run failed.")
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()
            run.final_values = translate.values(record.messages, record.pending)
            if not run.started.done():
                run.started.set_exception(GraphError(503, "graph_unavailable", "The run could not start."))
            self._release(run)
            await run.queue.put(None)

    async def _consume(
        self,
        run: Run,
        record: ThreadRecord,
        first: SSEEvent,
        stream: AsyncGenerator[SSEEvent, None],
        answer_id: str,
        chunks: list[str],
    ) -> None:
        """Turn the graph's events into thread changes and listener items."""
        ev: SSEEvent | None = first
        while ev is not None:
            if isinstance(ev, TextChunk):
                chunks.append(ev.content)
                await run.queue.put(("chunk", {"text": ev.content, "id": answer_id}))
            elif isinstance(ev, TextFinal):
                message = translate.ai_message(ev.content, answer_id)
                record.messages.append(message)
                record.status, run.status = "idle", "success"
                await self.store.save(record)
                await run.queue.put(("values", translate.values(record.messages)))
                await run.queue.put(("updates", translate.answer_update(message)))
            elif isinstance(ev, HitlRequest):
                record.pending, record.status, run.status = ev, "interrupted", "interrupted"
                await self.store.save(record)
                await run.queue.put(("values", translate.values(record.messages, ev)))
                await run.queue.put(("updates", translate.interrupt_update(ev)))
            elif isinstance(ev, ErrorEvent):
                await self._fail(run, record, ev.error_code, ev.message)
            ev = await anext(stream, None)
        if run.status == "running":  # done without an answer: nothing to add
            record.status, run.status = "idle", "success"
            await self.store.save(record)

    async def _fail(self, run: Run, record: ThreadRecord, code: str, message: str) -> None:
        run.status = "error"
        run.error = translate.error_data(code, message)
        record.status = "error"
        with contextlib.suppress(Exception):
            await self.store.save(record)
        await run.queue.put(("error", run.error))

    async def shutdown(self) -> None:
        for run in list(self._runs.values()):
            await self.cancel(run)
