"""Run the workflow and turn LangGraph's stream into the SSE contract.

The run happens in its own asyncio Task feeding an Outbox (outbox.py). When the consumer goes
away (client disconnect), the task is cancelled and awaited, which also cancels
the LLM request (LangGraph alone keeps running: langgraph#6775, #8302).

The answer's text reaches the stream through LangGraph's custom stream, coalesced in the
model node (workflow/answer_stream.py: `AnswerStream`, `Coalescer`): one `text` item per
STREAM_COALESCE_MS window, not one LangGraph `messages` item per model chunk (the model call
is tagged `nostream`, and the run does not ask for `messages`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import structlog
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, Durability, Interrupt, StreamMode

from vagent_graph.models.reasoning import REASONING_MARK, THINKING_STATUS, ThinkFilter
from vagent_graph.models.text import text_of
from vagent_graph.observability import metrics
from vagent_graph.observability.recorder import TurnRecorder, turn_of
from vagent_graph.observability.spans import traced_run
from vagent_graph.turn.outbox import Outbox, Pacing
from vagent_shared.events import (
    ErrorEvent,
    HitlAction,
    HitlRequest,
    ImageOut,
    Progress,
    SSEEvent,
    TextChunk,
    TextFinal,
    TurnStarted,
)

log = structlog.get_logger(__name__)
#: The answer's text comes as `custom` items (AnswerStream), never as `messages`.
STREAM_MODES: list[StreamMode] = ["custom", "updates"]


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


_END = object()
#: Runs before the graph, in the run's task (closing a stale question): a failure ends the
#: run with an `error` event, not the request.
Prelude = Callable[[], Awaitable[None]]
#: Reads the turn's files after the prelude, in the run's task (intake.py): the message to
#: start the graph with, or the Reply that ends the turn without the model.
Intake = Callable[[Callable[[SSEEvent], None]], Awaitable["HumanMessage | Reply"]]


@dataclass(frozen=True)
class Reply:
    """A turn's answer without the model (intake.py); `keep`: messages saved into the session."""

    text: str
    keep: list[BaseMessage] = field(default_factory=list)


#: The nodes whose AIMessage without tool calls is the turn's answer (workflow/graph.py).
ANSWERING_NODES = frozenset({"agent", "forget_all"})


@dataclass
class EventMapper:
    """LangGraph stream items -> SSE events. Pure; remembers what the final event needs.

    A reasoning model's thinking is cut out of the streamed text (`ThinkFilter`, one per
    model call); while it thinks before any answer text, "thinking…" is shown once. Images
    a tool returned follow the answer (`closing`)."""

    chunk_index: int = 0
    final_text: str = ""
    final_sent: bool = False
    interrupt: HitlRequest | None = None
    failed: bool = False
    images: list[ImageOut] = field(default_factory=list)
    _interrupt_kind: str = field(default="confirm")
    _think: ThinkFilter = field(default_factory=ThinkFilter)
    _message_id: str | None = None
    _thinking_shown: bool = False
    #: The turn being recorded (observability/recorder.py): told when each model call's first chunk and the
    #: turn's first answer text arrive.
    turn: TurnRecorder | None = None

    def map(self, mode: str, payload: Any) -> list[SSEEvent]:
        if mode == "messages":
            chunk, meta = payload
            if meta.get("langgraph_node") != "agent" or not isinstance(chunk, AIMessageChunk):
                return []
            return self._text(chunk)
        if mode == "custom":
            kind = payload.get("type") if isinstance(payload, dict) else None
            if kind == "text":  # the answer's text, coalesced (AnswerStream)
                return self._visible(str(payload.get("content", "")))
            if kind == "thinking":
                return self._thinking()
            if kind == "progress":
                return [Progress(content=str(payload.get("content", "")))]
            if isinstance(payload, dict) and payload.get("type") == "image":
                self.images.append(ImageOut.model_validate(payload.get("image", {})))
            return []
        out: list[SSEEvent] = []
        if mode == "updates" and isinstance(payload, dict):
            for node, update in payload.items():
                if node == "__interrupt__":
                    self._take_interrupt(update)
                elif node in ANSWERING_NODES and isinstance(update, dict):
                    for m in update.get("messages", []):
                        if isinstance(m, AIMessage) and not m.tool_calls:
                            # The answer is complete: send it now, not after the final
                            # checkpoint write (a failure there still follows as `error`).
                            self.final_text, self.final_sent = str(m.content), True
                            out.append(TextFinal(content=self.final_text, is_final=True))
        return out

    def _text(self, chunk: AIMessageChunk) -> list[SSEEvent]:
        """A `messages` item (a graph streamed without AnswerStream): one chunk's text."""
        if chunk.id != self._message_id:  # the next model call: its own <think> block
            self._message_id, self._think = chunk.id, ThinkFilter()
            if self.turn is not None:
                self.turn.chunk_seen(chunk.id)
        text = self._think.feed(text_of(chunk))
        reasoning = self._think.inside or bool(chunk.additional_kwargs.get(REASONING_MARK))
        if reasoning and not text:
            return self._thinking()
        return self._visible(text)

    def _thinking(self) -> list[SSEEvent]:
        """The "thinking…" progress, once, and only before any answer text."""
        if self.chunk_index == 0 and not self._thinking_shown:
            self._thinking_shown = True
            return [Progress(content=THINKING_STATUS)]
        return []

    def _visible(self, text: str) -> list[SSEEvent]:
        """Answer text (already without its thinking) as the next `text_chunk`."""
        if not text:
            return []
        if self.chunk_index == 0 and self.turn is not None:
            self.turn.first_text()
        event = TextChunk(content=text, chunk_index=self.chunk_index)
        self.chunk_index += 1
        return [event]

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
                    actions=actions_of(v.get("actions")),
                )

    def closing(self) -> list[SSEEvent]:
        """What follows the streamed items: the question, or the final text if no answer
        was sent yet (a run stopped by a cancelled question ends with an empty one)."""
        if self.failed:
            return []
        images: list[SSEEvent] = list(self.images)
        if self.final_sent:
            return images
        if self.interrupt is not None:
            metrics.HITL_REQUESTS.labels(self._interrupt_kind).inc()
            return [*images, self.interrupt]
        return [TextFinal(content=self.final_text, is_final=True), *images]


def actions_of(value: Any) -> list[HitlAction]:
    """The interrupt value's `actions` (hitl.ask_human: already masked as the question is);
    anything not shaped {name, args} is left out (an older or foreign interrupt value)."""
    if not isinstance(value, list):
        return []
    return [
        HitlAction(name=str(a["name"]), args=dict(a.get("args") or {}))
        for a in value
        if isinstance(a, dict) and isinstance(a.get("name"), str) and isinstance(a.get("args", {}), dict)
    ]


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
        in {"openai", "langchain_openai", "httpx", "httpx2", "httpcore", "httpcore2", "aiohttp"}
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

    The caller holds the session's lock before it starts a run. `prelude` runs first, in
    the run's task. `close()` (idempotent) cancels a run nobody reads, and with it the LLM
    request. `pacing` lets text chunks after the first wait for the next write, and makes
    `batches()` yield an empty batch after a silence (outbox.py).
    """

    def __init__(
        self,
        graph: CompiledStateGraph[Any],
        graph_input: Any,
        config: RunnableConfig,
        run_timeout: float,
        *,
        prelude: Prelude | None = None,
        pacing: Pacing = Pacing(),
        intake: Intake | None = None,
    ) -> None:
        #: The turn this run records, from its config (`run_config(..., turn)`): its `turn`
        #: event goes first, before anything else.
        self.turn = turn = turn_of(config)
        self._outbox = Outbox(pacing.flush_interval, pacing.keepalive)
        self._mapper = EventMapper(turn=turn)
        self._closed = False
        self._intake = intake
        if turn is not None:
            self._outbox.put(TurnStarted(turn_id=turn.trace.turn_id))
        metrics.ACTIVE_RUNS.inc()
        produce = traced_run(  # the run's span (observability/spans.py)
            self._produce(graph, graph_input, config, run_timeout, prelude),
            config,
            isinstance(graph_input, Command),
            self._outcome,
        )
        self._task = asyncio.create_task(produce, name="graph-run")

    def _outcome(self) -> str:
        """How the run ended, for its span."""
        mapper = self._mapper
        return "failed" if mapper.failed else "asked" if mapper.interrupt is not None else "answered"

    async def _produce(
        self,
        graph: CompiledStateGraph[Any],
        graph_input: Any,
        config: RunnableConfig,
        run_timeout: float,
        prelude: Prelude | None,
    ) -> None:
        outbox, mapper = self._outbox, self._mapper
        try:
            async with asyncio.timeout(run_timeout):
                if prelude is not None:
                    await prelude()
                if self._intake is not None:
                    human = await self._intake(outbox.put)
                    if isinstance(human, Reply):
                        if human.keep:
                            await graph.aupdate_state(config, {"messages": human.keep}, as_node="agent")
                        mapper.final_text = human.text
                        return
                    graph_input = {**graph_input, "messages": [human]}
                async for mode, payload in graph.astream(
                    graph_input, config, stream_mode=STREAM_MODES, durability=durability_for(graph_input)
                ):
                    events = mapper.map(mode, payload)
                    for ev in events:
                        outbox.put(ev)
                    if events:
                        # Let the reader write it before the next chunk is read (and, with
                        # many runs in flight, the other runs have their turn).
                        await asyncio.sleep(0)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("run_failed", error_type=type(exc).__name__)
            mapper.failed = True
            outbox.put(error_event_for(exc))
        finally:
            outbox.put(_END)

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

    async def close(self) -> None:
        """Stop the run if it is still going (the client went away); safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if not self._task.done():
            log.info("run_cancelled", reason="client went away")
            self._task.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.gather(self._task, return_exceptions=True)
        self._outbox.close()
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
