"""A turn's whole life, in one place: lock the session, read what came with the message,
run the workflow, stream what it says, record the trace, and end (unlock, prune, trace
stored) exactly once, however the stream stops.

The HTTP layer (http/api.py) parses and authenticates, calls `Turn.start` (a new message),
`Turn.resume` (the human's answer to a question) or `reset`, and writes what `Turn.stream`
yields. Nothing here knows HTTP: a refusal is a `TurnRefused` with a code, which the HTTP
layer maps to a status. The walk of one message: http -> turn -> workflow (through `Run`,
events.py) and back out.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import anyio
import structlog
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.redis.ashallow import AsyncShallowRedisSaver
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command
from redis.asyncio import Redis

from vagent_graph.memory.commands import answer as answer_memory_command
from vagent_graph.memory.memories import Memories, Prefetch
from vagent_graph.observability import metrics
from vagent_graph.observability.recorder import TurnRecorder, add_otel_trace, new_trace, turn_outcome
from vagent_graph.observability.trace_store import TraceStore
from vagent_graph.services import Services
from vagent_graph.state.end_of_run import end_of_run
from vagent_graph.state.session_lock import SessionBusy, SessionLock
from vagent_graph.turn.events import Intake, Reply, Run, durability_for
from vagent_graph.turn.intake import FileReading, read_turn
from vagent_graph.turn.outbox import Pacing
from vagent_graph.workflow.graph import new_turn_input, run_config
from vagent_graph.workflow.hitl import CANCEL_RESUME
from vagent_shared.access import AcContext
from vagent_shared.events import Done, ErrorEvent, HitlRequest, SSEEvent, TextFinal
from vagent_shared.knowledge import Audience
from vagent_shared.memory import Forget, MemoryCommand, parse_memory_command
from vagent_shared.readers import Readership
from vagent_shared.settings import GraphSettings
from vagent_shared.traces import TurnTrace
from vagent_shared.wire import FeedbackRequest, ProcessMessageRequest

log = structlog.get_logger(__name__)

Endpoint = Literal["process_message", "submit_feedback"]


class TurnResources(Protocol):
    """What a turn uses of the process (resources.Resources has it all)."""

    settings: GraphSettings
    redis: Redis
    checkpointer: AsyncShallowRedisSaver
    graph: CompiledStateGraph[Any]
    services: Services

    @property
    def pacing(self) -> Pacing: ...

    @property
    def file_reading(self) -> FileReading: ...


class TurnRefused(Exception):
    """The turn cannot start: `code` says why (session_busy, redis_unavailable,
    no_pending_question, stale_question), `message` says it to a person."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


@dataclass
class Turn:
    """One request's part of a turn: it holds the session's lock from `start`/`resume`
    until `close`, which `stream` calls at its end (or the caller, when the stream never
    starts: a client that went away before the first byte)."""

    resources: TurnResources
    endpoint: Endpoint
    session_id: str
    lock: SessionLock
    run: Run
    started: float = field(default_factory=time.perf_counter)
    #: The question or the final text that ended the stream (None: neither went out).
    outcome: SSEEvent | None = None
    failure: ErrorEvent | None = None
    events: int = 0
    writes: int = 0
    _closed: bool = False

    # ---- the beginning ----------------------------------------------------------------------
    @classmethod
    async def start(cls, resources: TurnResources, body: ProcessMessageRequest) -> Turn:
        """A new message: lock the session, then run it (the files are read, a memory
        command is answered, a stale question is closed: all inside the run's task)."""
        sid = body.session_id
        command = parse_memory_command(body.message) if not body.attachments else None
        memories = resources.services.find(Memories)
        prefetched = None
        if memories is not None and command is None and not body.attachments:
            prefetched = memories.prefetch(body.ac_context, body.message)  # recall's count and embedding
        lock = await _acquire(resources, sid)
        if memories is not None and prefetched is not None:  # the lock is held: recall now
            readership = Readership(body.ac_context, body.audience)
            prefetched = memories.start_recall(
                prefetched, readership, body.message, unchecked=body.audience_unchecked
            )
        # A memory command's trace names the command, never the text of a memory.
        asked = body.message if command is None else "!" + body.message.strip()[1:].split(maxsplit=1)[0]
        files = [a.name for a in body.attachments]
        recorder = TurnRecorder(new_trace(sid, body.ac_context, body.audience, asked, files))
        intake: Intake | None = None
        if body.attachments:
            intake = _files_reader(body, resources.file_reading, recorder)
        elif command is not None and command != Forget(None):  # `!forget all` asks first: the workflow
            intake = _memory_command(body, memories, command)

        async def close_stale() -> None:
            await _close_stale_question(resources, sid)

        run = Run(
            resources.graph,
            new_turn_input(body.message, body.ac_context, recorder.trace.turn_id),
            _config(resources, sid, body.audience, recorder, body.audience_unchecked, prefetched),
            resources.settings.RUN_TIMEOUT_SECONDS,
            prelude=close_stale if lock.question_may_be_pending else None,
            pacing=resources.pacing,
            intake=intake,
        )
        return cls(resources, "process_message", sid, lock, run)

    @classmethod
    async def resume(cls, resources: TurnResources, body: FeedbackRequest) -> Turn:
        """The human's answer to the pending question: the turn that asked goes on."""
        sid = body.session_id
        lock = await _acquire(resources, sid)
        try:
            state = await resources.graph.aget_state(run_config(sid))
            pending = {i.id for i in state.interrupts}
            if not pending:
                raise TurnRefused("no_pending_question", "Nothing is waiting for an answer in this session.")
            if body.interrupt_id and body.interrupt_id not in pending:
                raise TurnRefused("stale_question", "That question is no longer pending.")
        except BaseException:
            await _release(lock)
            raise
        metrics.HITL_RESUMES.labels("answered").inc()
        log.info("submit_feedback", chars=len(body.response))
        update: dict[str, Any] = {}
        if body.ac_context:
            update["ac_context"] = body.ac_context.to_wire()
        command: Command[Any] = Command(resume=body.response, update=update or None)
        recorder = await _resumed_recorder(resources, state.values, sid, body.ac_context, body.audience)
        cfg = _config(resources, sid, body.audience, recorder, body.audience_unchecked)
        run = Run(
            resources.graph, command, cfg, resources.settings.RUN_TIMEOUT_SECONDS, pacing=resources.pacing
        )
        return cls(resources, "submit_feedback", sid, lock, run)

    # ---- the middle -------------------------------------------------------------------------
    async def stream(self) -> AsyncGenerator[list[SSEEvent], None]:
        """The run's events in batches of one write each, then `done`; an empty batch: nothing
        to say for a while (the writer sends a keep-alive). Ends the turn when it stops."""
        batches = self.run.batches()
        try:
            with structlog.contextvars.bound_contextvars(session_id=self.session_id):
                async for batch in batches:
                    for ev in batch:
                        if isinstance(ev, HitlRequest | TextFinal):
                            self.outcome = ev
                        elif isinstance(ev, ErrorEvent):
                            self.failure = ev
                    first_at = time.perf_counter() if batch and not self.writes else 0.0
                    if batch:
                        self.events, self.writes = self.events + len(batch), self.writes + 1
                    yield batch
                    if first_at:  # observed once the first write is out, not before it
                        metrics.FIRST_EVENT_SECONDS.labels(self.endpoint).observe(first_at - self.started)
                recorder = self.run.turn
                over = recorder is not None and recorder.over_budget
                self.events, self.writes = self.events + 1, self.writes + 1
                yield [Done(outcome="over_budget" if over else None)]
        finally:
            with anyio.CancelScope(shield=True):
                await batches.aclose()
            await self.close()

    async def collect(self) -> list[SSEEvent]:
        """Every event of the turn at once (a client that takes JSON, not a stream)."""
        collected: list[SSEEvent] = []
        async for batch in self.stream():
            collected += batch
        return collected

    # ---- the end ----------------------------------------------------------------------------
    async def close(self) -> None:
        """Stop the run, remember whether a question waits, unlock, store the trace: exactly
        once, shielded (a disconnect cancels the stream; the session must be unlocked even so)."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            await self.run.close()  # also when the stream never started
            await _end_run(self.resources, self.lock, self.outcome)
            await _close_trace(self.resources, self.run.turn, self.outcome, self.failure)
        seconds = time.perf_counter() - self.started
        metrics.REQUEST_SECONDS.labels(self.endpoint).observe(seconds)
        log.info(
            "stream_closed",
            endpoint=self.endpoint,
            session_id=self.session_id,
            seconds=round(seconds, 4),
            events=self.events,
            writes=self.writes,
        )


async def reset(resources: TurnResources, session_id: str) -> None:
    """Forget the session's conversation and any pending question (`!reset`), under its lock."""
    lock = await _acquire(resources, session_id)
    try:
        await resources.checkpointer.adelete_thread(session_id)
    finally:
        await _release(lock)
    log.info("session_reset")


# ---- the steps ------------------------------------------------------------------------------
def _config(
    resources: TurnResources,
    session_id: str,
    audience: Audience | None,
    recorder: TurnRecorder,
    audience_unchecked: bool,
    prefetched: Prefetch | None = None,
) -> RunnableConfig:
    return run_config(
        session_id,
        audience,
        recorder,
        audience_unchecked=audience_unchecked,
        coalesce_ms=resources.settings.STREAM_COALESCE_MS,
        prefetched=prefetched,
    )


async def _acquire(resources: TurnResources, session_id: str) -> SessionLock:
    """The session lock (one run per session across replicas)."""
    try:
        return await SessionLock.acquire(
            resources.redis, session_id, resources.settings.RUN_TIMEOUT_SECONDS + 60
        )
    except SessionBusy:
        raise TurnRefused("session_busy", "This session is already answering another message.") from None
    except Exception as exc:
        log.error("redis_unavailable", error=str(exc))
        raise TurnRefused("redis_unavailable", "The session store is not reachable.") from exc


async def _release(lock: SessionLock) -> None:
    try:
        await lock.release()
    except Exception as exc:  # Redis gone: the lock's TTL cleans up
        log.debug("lock_release_failed", error_type=type(exc).__name__)


async def _end_run(resources: TurnResources, lock: SessionLock, outcome: SSEEvent | None) -> None:
    """Bound the session's Redis bytes, remember whether a question waits, unlock
    (state/end_of_run.py, one round trip). Never fails the request."""
    waits = None if outcome is None else isinstance(outcome, HitlRequest)
    try:
        await end_of_run(
            resources.redis,
            resources.checkpointer,
            lock,
            waits,
            resources.settings.CHECKPOINT_TTL_MINUTES * 60,
        )
    except Exception as exc:  # Redis gone: the lock's TTL cleans up
        log.warning("end_of_run_failed", error_type=type(exc).__name__)


def _traces(resources: TurnResources) -> TraceStore:
    return TraceStore(resources.redis, resources.settings.TRACE_TTL_SECONDS)


async def _close_trace(
    resources: TurnResources, recorder: TurnRecorder | None, last: SSEEvent | None, error: ErrorEvent | None
) -> None:
    """The request's outcome (recorder.turn_outcome), then the trace is stored. Never fails
    the request (a trace that cannot be stored is logged)."""
    if recorder is None:
        return
    try:
        outcome, reason = turn_outcome(last, error, recorder.trace)
        await _traces(resources).save(recorder.finish(outcome, reason))
    except Exception as exc:
        log.warning("trace_close_failed", error_type=type(exc).__name__)


async def _stored_trace(resources: TurnResources, turn_id: object) -> TurnTrace | None:
    """The stored trace of the turn a session's state names (None: none, expired, or Redis
    failed: a resume then starts a fresh trace under the same id)."""
    if not isinstance(turn_id, str) or not turn_id:
        return None
    try:
        return await _traces(resources).load(turn_id)
    except Exception as exc:
        log.warning("trace_load_failed", error_type=type(exc).__name__)
        return None


async def _resumed_recorder(
    resources: TurnResources,
    values: dict[str, Any],
    session_id: str,
    ac: AcContext | None,
    audience: Audience | None,
) -> TurnRecorder:
    """The recorder of a resume: the turn that asked goes on (its stored trace), or, when that
    trace is gone, a fresh one under the same turn id."""
    turn_id = values.get("turn_id")
    stored = await _stored_trace(resources, turn_id)
    if stored is not None:
        add_otel_trace(stored)
        return TurnRecorder.resumed(stored)
    who = ac or AcContext.model_validate(values.get("ac_context") or {})
    trace = new_trace(session_id, who, audience)
    if isinstance(turn_id, str) and turn_id:
        trace.turn_id = turn_id
    return TurnRecorder(trace)


async def _close_stale_question(resources: TurnResources, session_id: str) -> None:
    """A new message while a question is pending: the question expired on the bot side."""
    state = await resources.graph.aget_state(run_config(session_id))
    if not state.interrupts:
        return
    log.info("hitl_expired", interrupt_ids=[i.id for i in state.interrupts])
    metrics.HITL_RESUMES.labels("expired").inc()
    # The turn that asked ends as cancelled (its trace, if still kept, says which call).
    stale = await _stored_trace(resources, state.values.get("turn_id"))
    recorder = TurnRecorder.resumed(stale) if stale is not None else None
    cfg = run_config(session_id, turn=recorder)
    cancel: Command[Any] = Command(resume=CANCEL_RESUME)
    async for _ in resources.graph.astream(
        cancel, cfg, stream_mode="updates", durability=durability_for(cancel)
    ):
        pass
    if recorder is not None:
        recorder.force("cancelled", "question_expired")
        await _close_trace(resources, recorder, None, None)


def _memory_command(body: ProcessMessageRequest, memories: Memories | None, command: MemoryCommand) -> Intake:
    """`!remember`, `!memory`, `!forget N`: answered without the model, nothing saved."""

    async def read(emit: Callable[[SSEEvent], None]) -> HumanMessage | Reply:
        text = await answer_memory_command(
            command,
            memories,
            body.ac_context,
            body.session_id,
            body.audience,
            unchecked=body.audience_unchecked,
        )
        return Reply(text)

    return read


def _files_reader(body: ProcessMessageRequest, how: FileReading, recorder: TurnRecorder) -> Intake:
    async def read(emit: Callable[[SSEEvent], None]) -> HumanMessage | Reply:
        return await read_turn(body.message, body.attachments, how, emit, recorder)

    return read
