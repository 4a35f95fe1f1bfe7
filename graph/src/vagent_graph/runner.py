"""Run the workflow and turn LangGraph's stream into the SSE contract.

The run happens in its own asyncio Task feeding an Outbox (outbox.py). When the consumer goes
away (client disconnect), the task is cancelled and awaited, which also cancels
the upstream LLM request (LangGraph alone keeps running: langgraph#6775, #8302).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import structlog
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, Durability, Interrupt, StreamMode

from vagent_graph import locked_read, metrics, upstream
from vagent_graph.locked_read import Prefetched
from vagent_graph.outbox import Outbox, Pacing
from vagent_graph.session_lock import SessionLock
from vagent_shared.events import (
    ErrorEvent,
    HitlRequest,
    Progress,
    SSEEvent,
    TextChunk,
    TextFinal,
)

log = structlog.get_logger(__name__)
STREAM_MODES: list[StreamMode] = ["messages", "custom", "updates"]


def durability_for(graph_input: Any) -> Durability:
    """How often a run writes its checkpoint.

    A resume (a Command) may ask again after a wrong answer, and that needs every step
    saved: with "exit" the consumed interrupt is lost and the next resume finds two
    pending. A new turn pauses at most once, at its end, so one write when it stops is
    enough: that saves serialising and storing the whole history twice per turn (~2 ms
    with a full history, bench-bot). A crash mid-turn then keeps nothing of that turn;
    the user was told the run failed.
    """
    return "async" if isinstance(graph_input, Command) else "exit"


def text_of(message: BaseMessage) -> str:
    """The text a message carries: its str content, or the text of its content parts."""
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict))


_END = object()
#: At most this long (seconds) after it starts, a run counts as under way even if it has
#: not sent its LLM request yet (a slow connect): its response, and so its keep-alives,
#: must not wait longer for that.
UNDER_WAY_AFTER = 1.0
Gate = Callable[[], Awaitable[SessionLock]]
Prelude = Callable[[SessionLock], Awaitable[None]]


@dataclass
class EventMapper:
    """LangGraph stream items -> SSE events. Pure; remembers what the final event needs."""

    chunk_index: int = 0
    final_text: str = ""
    final_sent: bool = False
    interrupt: HitlRequest | None = None
    failed: bool = False
    _interrupt_kind: str = field(default="confirm")

    def map(self, mode: str, payload: Any) -> list[SSEEvent]:
        if mode == "messages":
            chunk, meta = payload
            if meta.get("langgraph_node") != "agent" or not isinstance(chunk, AIMessageChunk):
                return []
            text = text_of(chunk)
            if not text:
                return []
            ev = TextChunk(content=text, chunk_index=self.chunk_index)
            self.chunk_index += 1
            return [ev]
        if mode == "custom":
            if isinstance(payload, dict) and payload.get("type") == "progress":
                return [Progress(content=str(payload.get("content", "")))]
            return []
        out: list[SSEEvent] = []
        if mode == "updates" and isinstance(payload, dict):
            for node, update in payload.items():
                if node == "__interrupt__":
                    self._take_interrupt(update)
                elif node == "agent" and isinstance(update, dict):
                    for m in update.get("messages", []):
                        if isinstance(m, AIMessage) and not m.tool_calls:
                            # The answer is complete: send it now, not after the final
                            # checkpoint write (a failure there still follows as `error`).
                            self.final_text, self.final_sent = str(m.content), True
                            out.append(TextFinal(content=self.final_text, is_final=True))
        return out

    def _take_interrupt(self, interrupts: Any) -> None:
        for it in interrupts or ():
            if isinstance(it, Interrupt) and isinstance(it.value, dict):
                v = it.value
                self._interrupt_kind = str(v.get("kind", "confirm"))
                self.interrupt = HitlRequest(
                    question=str(v.get("question", "")),
                    options=[str(o) for o in v.get("options", [])],
                    timeout_seconds=int(v.get("timeout_seconds", 3600)),
                    interrupt_id=it.id,
                )

    def closing(self) -> list[SSEEvent]:
        """What follows the streamed items: the question, or the final text if no answer
        was sent yet (a run stopped by a cancelled question ends with an empty one)."""
        if self.failed or self.final_sent:
            return []
        if self.interrupt is not None:
            metrics.HITL_REQUESTS.labels(self._interrupt_kind).inc()
            return [self.interrupt]
        return [TextFinal(content=self.final_text, is_final=True)]


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in out and len(out) < 10:
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def error_event_for(exc: BaseException) -> ErrorEvent:
    """A short message a user can read; details go to the log, never to the client."""
    chain = _chain(exc)
    if any(isinstance(e, TimeoutError) for e in chain):
        return ErrorEvent(error_code="timeout", message="The answer took too long and was stopped.")
    if any(type(e).__name__ == "RateLimitError" for e in chain):
        return ErrorEvent(
            error_code="llm_rate_limited",
            message="The language model is busy right now. Please try again shortly.",
        )
    if any(
        type(e).__module__.split(".")[0]
        in {"openai", "langchain_openai", "httpx", "httpx2", "httpcore", "httpcore2"}
        for e in chain
    ):
        return ErrorEvent(
            error_code="llm_unavailable",
            message="The language model is not available right now. Please try again later.",
        )
    return ErrorEvent(
        error_code="internal_error", message="Something went wrong while answering. Please try again."
    )


class Run:
    """One graph run in its own task, feeding an Outbox that `batches()` reads.

    `gate` (taking the session lock) runs in a task of its own, and the caller awaits its
    result (`await run.gate`) to decide between a stream and a refusal. The graph does not
    wait for it to start: it prepares its run meanwhile, and only its checkpointer waits
    (locked_read.hold_reads) until the gate is open and `prelude` (closing a stale
    question) is done, then reads what the lock fetched with it. A failed prelude ends the
    run with an `error` event like any other failure. `close()` (idempotent) cancels a run
    nobody reads. `pacing` lets text chunks after the first wait for the next write, and
    makes `batches()` yield an empty batch after a silence (outbox.py).

    `under_way` resolves when the run's first LLM request has left (upstream.py), when it
    has a first event, when it ends, or UNDER_WAY_AFTER seconds after it was started:
    the moment to set up the HTTP response, whose CPU then overlaps the model's latency.
    """

    def __init__(
        self,
        graph: CompiledStateGraph[Any],
        graph_input: Any,
        config: RunnableConfig,
        run_timeout: float,
        *,
        gate: Gate | None = None,
        prelude: Prelude | None = None,
        pacing: Pacing = Pacing(),
    ) -> None:
        self._outbox = Outbox(pacing.flush_interval, pacing.keepalive)
        self._mapper = EventMapper()
        self._closed = False
        self._counted = False  # in ACTIVE_RUNS
        self._lock: SessionLock | None = None
        self.gate: asyncio.Future[SessionLock] = asyncio.get_running_loop().create_future()
        # The gate's task first, so the lock request leaves before the graph's set-up runs;
        # the graph's task reads the session only once the gate is open.
        self._opening = (
            None if gate is None else asyncio.create_task(self._open(gate, prelude), name="graph-gate")
        )
        loop = asyncio.get_running_loop()
        self.under_way: asyncio.Future[None] = loop.create_future()
        self._under_way_timer = loop.call_later(UNDER_WAY_AFTER, self._mark_under_way)
        context = contextvars.copy_context()
        context.run(upstream.notify_sent, self._mark_under_way)
        if self._opening is not None:
            context.run(locked_read.hold_reads, self._opening)
        produce = self._produce(graph, graph_input, config, run_timeout)
        self._task = asyncio.create_task(produce, name="graph-run", context=context)

    async def _open(self, gate: Gate, prelude: Prelude | None) -> Prefetched | None:
        """Take the lock, tell the caller, close a stale question: what the run's
        checkpointer waits for. Returns the read that came with the lock."""
        try:
            lock = await gate()
        except asyncio.CancelledError:
            self.gate.cancel()
            raise
        except Exception as exc:
            self.gate.set_exception(exc)
            raise
        self._lock = lock
        self._open_gate()
        self._count()  # a refused or cancelled gate is not a run
        if prelude is not None:
            await prelude(lock)  # reads (and so uses up) the prefetched checkpoint if it needs it
        return lock.checkpoint

    async def _produce(
        self,
        graph: CompiledStateGraph[Any],
        graph_input: Any,
        config: RunnableConfig,
        run_timeout: float,
    ) -> None:
        outbox, mapper, opening = self._outbox, self._mapper, self._opening
        if opening is None:
            self._count()
        cancelled = False
        try:
            async with asyncio.timeout(run_timeout):
                async for mode, payload in graph.astream(
                    graph_input, config, stream_mode=STREAM_MODES, durability=durability_for(graph_input)
                ):
                    events = mapper.map(mode, payload)
                    for ev in events:
                        outbox.put(ev)
                    if events:
                        self._mark_under_way()
                    if events:
                        # Let the loop go round after each event: the first text reaches
                        # the client before the next chunk is read, and, with many runs in
                        # flight, a run does not work through all its buffered chunks while
                        # the others wait for theirs (bench-graph c=20, alternating runs:
                        # first-event p50 ratio 1.21x -> 1.17x on average, totals unchanged).
                        await asyncio.sleep(0)
        except asyncio.CancelledError:
            cancelled = True
            raise
        except Exception as exc:
            if self._counted:  # else the gate refused: the caller answers that; no stream
                log.exception("run_failed", error_type=type(exc).__name__)
                mapper.failed = True
                outbox.put(error_event_for(exc))
        finally:
            if opening is not None and not opening.done():
                if cancelled:
                    opening.cancel()
                with anyio.CancelScope(shield=True):
                    await asyncio.gather(opening, return_exceptions=True)
            outbox.put(_END)
            self._mark_under_way()

    async def batches(self) -> AsyncGenerator[list[SSEEvent], None]:
        """Every event of the run, then the question or the final text (not `done`), in
        batches of one write each: what the Outbox released, so a client that falls
        behind also gets one write per batch instead of one per event. An empty batch:
        nothing for `keepalive` seconds."""
        try:
            done = False
            while not done:
                items = await self._outbox.take()
                done = bool(items) and items[-1] is _END
                batch: list[SSEEvent] = [i for i in items if i is not _END]
                if done:
                    batch += self._mapper.closing()
                if batch or not items:
                    yield batch
        finally:
            await self.close()

    def _mark_under_way(self) -> None:
        """Once: later calls (one per batch of events) return at once."""
        if not self.under_way.done():
            self._under_way_timer.cancel()
            self.under_way.set_result(None)

    def _open_gate(self) -> None:
        if not self.gate.done() and self._lock is not None:  # else closed meanwhile
            self.gate.set_result(self._lock)

    def _count(self) -> None:
        self._counted = True
        metrics.ACTIVE_RUNS.inc()

    @property
    def gate_opened(self) -> bool:
        """The gate let the run through (its result is what the caller must clean up)."""
        return self.gate.done() and not self.gate.cancelled() and self.gate.exception() is None

    async def close(self) -> None:
        """Stop the run if it is still going (the client went away); safe to call twice."""
        if self._closed:
            return
        self._closed = True
        pending = [t for t in (self._task, self._opening) if t is not None and not t.done()]
        if pending:
            log.info("run_cancelled", reason="client went away")
            for t in pending:
                t.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.gather(*pending, return_exceptions=True)
        self._open_gate()  # a lock taken just now is the caller's to release
        if not self.gate.done():  # refused, or cancelled before the lock was taken
            self.gate.cancel()
        self._outbox.close()
        self._mark_under_way()
        if self._counted:  # after the task: its gate may have opened meanwhile
            metrics.ACTIVE_RUNS.dec()


async def stream_run(
    graph: CompiledStateGraph[Any], graph_input: Any, config: RunnableConfig, run_timeout: float
) -> AsyncGenerator[SSEEvent, None]:
    """Start a run and read all its events one by one (see Run); closing the generator
    stops the run."""
    async with contextlib.aclosing(Run(graph, graph_input, config, run_timeout).batches()) as batches:
        async for batch in batches:
            for ev in batch:
                yield ev
