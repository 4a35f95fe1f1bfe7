"""Runs: one graph request each, run as a task of its own so a client can stream it, wait for
it, or cancel it from another request.

Why a task and a queue: the run must keep the thread's values right whoever listens (a
stream, `runs.wait`, nobody after a disconnect with `on_disconnect: continue`), and a cancel
arrives on another request. The task alone writes the thread while it runs; listeners read
neutral items from the queue and translate them to the stream modes they asked for.

Limits: at most `max_per_user` runs of one person at once on all replicas together (429;
counted in Redis, replicas.py), one run per thread (409, LangGraph's `multitask_strategy:
reject`); the graph's own session lock (409 session_busy) covers a run of the same thread on
another gateway replica. A cancel received by another replica reaches the run through Redis
(replicas.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import structlog

from vagent_gateway import translate
from vagent_gateway.graph_client import GraphError
from vagent_gateway.replicas import RunLeases, RunRef
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

    @property
    def ref(self) -> RunRef:
        return RunRef(self.run_id, self.owner, self.thread_id)

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
    """The runs of this process, counted and findable on every replica through `leases`."""

    def __init__(self, store: ThreadStore, leases: RunLeases) -> None:
        self.store, self.leases = store, leases
        self._runs: dict[str, Run] = {}
        self._by_thread: dict[str, str] = {}
        self._background: set[asyncio.Task[None]] = set()

    def active(self) -> int:
        return len(self._runs)

    def running_on(self, thread_id: str) -> Run | None:
        run_id = self._by_thread.get(thread_id)
        return self._runs.get(run_id) if run_id else None

    def get(self, run_id: str, owner: str) -> Run | None:
        run = self._runs.get(run_id)
        return run if run is not None and run.owner == owner else None

    async def reserve(self, record: ThreadRecord, assistant_id: str, metadata: dict[str, Any]) -> Run:
        """A new run of `record`'s thread, counted on all replicas; raises ThreadBusy or
        TooManyRuns (and RedisError when the count cannot be kept)."""
        if record.thread_id in self._by_thread:
            raise ThreadBusy(record.thread_id)
        run = Run(str(uuid.uuid4()), record.thread_id, record.owner, assistant_id, metadata)
        self._by_thread[record.thread_id] = run.run_id  # taken before the await: no twin here
        try:
            admitted = await self.leases.acquire(run.ref)
        except BaseException:
            self._by_thread.pop(record.thread_id, None)
            raise
        if not admitted:
            self._by_thread.pop(record.thread_id, None)
            raise TooManyRuns(record.owner)
        self._runs[run.run_id] = run
        return run

    async def abandon(self, run: Run) -> None:
        """A reserved run that will never start (the request failed before): uncount it."""
        if run.task is None:
            self._release(run)
            with contextlib.suppress(Exception):
                await self.leases.release(run.ref)

    def _release(self, run: Run) -> None:
        if self._runs.pop(run.run_id, None) is None:
            return
        if self._by_thread.get(run.thread_id) == run.run_id:
            del self._by_thread[run.thread_id]

    # ---- across replicas ----------------------------------------------------------------------
    def start_background(self) -> None:
        """The lease renewal and the cancel listener (replicas.py), for the process's life."""
        loop = asyncio.get_running_loop()
        for coro, name in (
            (self._renew_forever(), "gateway-run-leases"),
            (self.leases.listen(self._cancel_here), "gateway-cancel-listener"),
        ):
            self._background.add(loop.create_task(coro, name=name))

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.leases.lease_seconds / 3)
            try:
                stop = await self.leases.renew(r.ref for r in list(self._runs.values()))
            except Exception as exc:  # Redis down: try again; leases outlive a few misses
                log.warning("run_lease_renewal_failed", error_type=type(exc).__name__)
                continue
            for run_id in stop:
                await self._cancel_here(run_id)

    async def _cancel_here(self, run_id: str) -> None:
        """A cancel from any replica: stop the run if it is one of ours (in a task of its own,
        so the listener never waits for a run to wind down)."""
        run = self._runs.get(run_id)
        if run is None:
            return
        task = asyncio.get_running_loop().create_task(self.cancel(run), name=f"gateway-cancel-{run_id}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def cancel_anywhere(self, ref: RunRef) -> None:
        """Stop a run wherever it runs: here directly; elsewhere through Redis, waiting
        (bounded) until its replica has stopped it."""
        run = self._runs.get(ref.run_id)
        if run is not None:
            await self.cancel(run)
            return
        if await self.leases.request_cancel(ref.run_id):
            if not await self.leases.wait_ended(ref.run_id):
                log.warning("run_cancel_unconfirmed", run_id=ref.run_id)

    async def find(self, run_id: str, owner: str) -> RunRef | None:
        """The owner's live run `run_id` on any replica (another person's: None)."""
        run = self.get(run_id, owner)
        if run is not None:
            return run.ref
        canonical = parse_uuid(run_id)
        if canonical is None:
            return None
        ref = await self.leases.find(canonical)
        return ref if ref is not None and ref.owner == owner else None

    async def running_anywhere(self, thread_id: str, owner: str) -> RunRef | None:
        """The owner's run of the thread on any replica."""
        run = self.running_on(thread_id)
        if run is not None:
            return run.ref
        return await self.leases.running_on(thread_id, owner)

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
            run.queue.put_nowait(None)
            try:  # last: a second cancel arriving now must not keep the listeners waiting
                await asyncio.shield(self.leases.release(run.ref))
            except Exception as exc:  # the lease runs out on its own
                log.warning("run_release_failed", run_id=run.run_id, error_type=type(exc).__name__)

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
        for task in list(self._background):
            task.cancel()
        for task in list(self._background):
            with contextlib.suppress(BaseException):
                await task
        self._background.clear()
        for run in list(self._runs.values()):
            await self.cancel(run)


def parse_uuid(value: str) -> str | None:
    """A run id's canonical form (runs ids are UUIDs; anything else is never a run)."""
    try:
        return str(uuid.UUID(value))
    except ValueError:
        return None
