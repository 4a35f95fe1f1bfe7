"""The bot's API (`/api/v1/`): answer a message, resume a paused run with the human's
answer, forget a session. Every route needs the service token; RequestMiddleware checks it
for the whole `/api/` prefix before any route is chosen, so no route here can miss it."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

import anyio
import structlog
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from langchain_core.messages import HumanMessage
from langgraph.types import Command
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask

from vagent_graph import metrics
from vagent_graph.end_of_run import end_of_run
from vagent_graph.event_stream import Intake, Reply, Run, durability_for
from vagent_graph.hitl import CANCEL_RESUME
from vagent_graph.intake import read_turn
from vagent_graph.memory.commands import answer as answer_memory_command
from vagent_graph.memory.memories import Memories
from vagent_graph.middleware import API_PREFIX
from vagent_graph.resources import Resources
from vagent_graph.session_lock import SessionBusy, SessionLock
from vagent_graph.trace_store import TraceStore
from vagent_graph.turns import TurnRecorder, add_otel_trace, new_trace, turn_outcome
from vagent_graph.workflow import new_turn_input, run_config
from vagent_shared.access import AcContext
from vagent_shared.events import Done, ErrorEvent, HitlRequest, SSEEvent, TextFinal
from vagent_shared.http_errors import api_error
from vagent_shared.knowledge import Audience
from vagent_shared.memory import Forget, MemoryCommand, parse_memory_command
from vagent_shared.secrets import looks_like_secret
from vagent_shared.traces import TurnTrace
from vagent_shared.wire import (
    ErrorResponse,
    FeedbackAck,
    FeedbackRequest,
    ProcessMessageRequest,
    ResetRequest,
)

log = structlog.get_logger(__name__)


def lifespan_resources(request: Request) -> Resources:
    """What the lifespan opened (app.state.resources)."""
    return request.app.state.resources  # type: ignore[no-any-return]


ResourcesDep = Annotated[Resources, Depends(lifespan_resources)]

#: What the streaming routes answer instead of a stream (all with an ErrorResponse body).
_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse} for status in (401, 409, 413, 422, 503)
}

router = APIRouter(prefix=f"{API_PREFIX}v1", tags=["api"])


async def acquire(resources: Resources, session_id: str) -> SessionLock:
    """The session lock (one run per session across replicas), or a clear 409/503."""
    try:
        return await SessionLock.acquire(
            resources.redis, session_id, resources.settings.RUN_TIMEOUT_SECONDS + 60
        )
    except SessionBusy:
        raise api_error(409, "session_busy", "This session is already answering another message.") from None
    except Exception as exc:
        log.error("redis_unavailable", error=str(exc))
        raise api_error(503, "redis_unavailable", "The session store is not reachable.") from exc


async def end_run(resources: Resources, lock: SessionLock, outcome: SSEEvent | None) -> None:
    """After a run: bound the session's Redis bytes, remember whether a question waits,
    unlock (end_of_run.py, one round trip). Never fails the request."""
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


def traces(resources: Resources) -> TraceStore:
    return TraceStore(resources.redis, resources.settings.TRACE_TTL_SECONDS)


async def close_turn(
    resources: Resources, turn: TurnRecorder | None, last: SSEEvent | None, error: ErrorEvent | None
) -> None:
    """The end of a request's part of its turn: its outcome (turns.turn_outcome), then the
    trace is stored. Never fails the request (a trace that cannot be stored is logged)."""
    if turn is None:
        return
    try:
        outcome, reason = turn_outcome(last, error, turn.trace)
        await traces(resources).save(turn.finish(outcome, reason))
    except Exception as exc:
        log.warning("trace_close_failed", error_type=type(exc).__name__)


async def stored_turn(resources: Resources, turn_id: object) -> TurnTrace | None:
    """The stored trace of the turn a session's state names (None: none, expired, or Redis
    failed: a resume then starts a fresh trace under the same id)."""
    if not isinstance(turn_id, str) or not turn_id:
        return None
    try:
        return await traces(resources).load(turn_id)
    except Exception as exc:
        log.warning("trace_load_failed", error_type=type(exc).__name__)
        return None


async def resumed_turn(
    resources: Resources,
    values: dict[str, Any],
    session_id: str,
    ac: AcContext | None,
    audience: Audience | None,
) -> TurnRecorder:
    """The recorder of a resume: the turn that asked goes on (its stored trace), or, when that
    trace is gone, a fresh one under the same turn id."""
    turn_id = values.get("turn_id")
    stored = await stored_turn(resources, turn_id)
    if stored is not None:
        add_otel_trace(stored)
        return TurnRecorder.resumed(stored)
    who = ac or AcContext.model_validate(values.get("ac_context") or {})
    trace = new_trace(session_id, who, audience)
    if isinstance(turn_id, str) and turn_id:
        trace.turn_id = turn_id
    return TurnRecorder(trace)


async def release(lock: SessionLock) -> None:
    try:
        await lock.release()
    except Exception as exc:  # Redis gone: the lock's TTL cleans up
        log.debug("lock_release_failed", error_type=type(exc).__name__)


def sse(
    resources: Resources, endpoint: str, session_id: str, lock: SessionLock, run: Run
) -> EventSourceResponse:
    start = time.perf_counter()
    batches = run.batches()
    outcome: SSEEvent | None = None
    failure: ErrorEvent | None = None
    finished = False
    events = writes = 0

    async def finish() -> None:
        """Stop the run, remember how it ended, unlock: exactly once. From the stream's
        end, or (as the response's background task) when the stream never started."""
        nonlocal finished
        if finished:
            return
        finished = True
        # A disconnect cancels the stream: the run must be stopped and the session
        # unlocked even so, hence the shield (anyio re-cancels every await).
        with anyio.CancelScope(shield=True):
            await batches.aclose()
            await run.close()  # also when the stream never started
            await end_run(resources, lock, outcome)
            await close_turn(resources, run.turn, outcome, failure)
        metrics.REQUEST_SECONDS.labels(endpoint).observe(time.perf_counter() - start)
        log.info(
            "stream_closed",
            endpoint=endpoint,
            session_id=session_id,
            seconds=round(time.perf_counter() - start, 4),
            events=events,
            writes=writes,
        )

    async def gen() -> AsyncIterator[ServerSentEvent | bytes]:
        nonlocal outcome, failure, events, writes
        with structlog.contextvars.bound_contextvars(session_id=session_id):
            try:
                async for batch in batches:
                    if not batch:  # nothing to say for a while: keep proxies from timing out
                        yield b": keep-alive\r\n\r\n"
                        continue
                    for ev in batch:
                        if isinstance(ev, HitlRequest | TextFinal):
                            outcome = ev
                        elif isinstance(ev, ErrorEvent):
                            failure = ev
                    first_at = 0.0 if writes else time.perf_counter()
                    events, writes = events + len(batch), writes + 1
                    # One write per batch; every event keeps its own SSE frame.
                    yield b"".join(
                        ServerSentEvent(event=ev.EVENT, data=ev.sse_data()).encode() for ev in batch
                    )
                    if first_at:  # observed once the first write is out, not before it
                        metrics.FIRST_EVENT_SECONDS.labels(endpoint).observe(first_at - start)
                events, writes = events + 1, writes + 1
                over = run.turn is not None and run.turn.over_budget
                done = Done(outcome="over_budget" if over else None)
                yield ServerSentEvent(event=Done.EVENT, data=done.sse_data())
            finally:
                await finish()

    return EventSourceResponse(
        gen(),
        ping=0,  # keep-alive comes from the stream itself (Outbox): one task less per stream
        headers={"X-Accel-Buffering": "no", "Cache-Control": "no-cache"},
        background=BackgroundTask(finish),
    )


async def close_stale_question(resources: Resources, session_id: str) -> None:
    """A new message while a question is pending: the question expired on the bot side."""
    state = await resources.graph.aget_state(run_config(session_id))
    if not state.interrupts:
        return
    log.info("hitl_expired", interrupt_ids=[i.id for i in state.interrupts])
    metrics.HITL_RESUMES.labels("expired").inc()
    # The turn that asked ends as cancelled (its trace, if still kept, says which call).
    stale = await stored_turn(resources, state.values.get("turn_id"))
    turn = TurnRecorder.resumed(stale) if stale is not None else None
    cfg = run_config(session_id, turn=turn)
    cancel: Command[Any] = Command(resume=CANCEL_RESUME)
    async for _ in resources.graph.astream(
        cancel, cfg, stream_mode="updates", durability=durability_for(cancel)
    ):
        pass
    if turn is not None:
        turn.force("cancelled", "question_expired")
        await close_turn(resources, turn, None, None)


@router.post(
    "/process_message",
    response_class=EventSourceResponse,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "SSE: text_chunk/progress/hitl_request/text_final/error, always ending with done",
        },
        **_ERRORS,
    },
)
async def process_message(body: ProcessMessageRequest, resources: ResourcesDep) -> EventSourceResponse:
    """Answer one user message as a stream of Server-Sent Events."""
    structlog.contextvars.bind_contextvars(session_id=body.session_id)
    if not body.message.strip() and not body.attachments:
        raise api_error(422, "empty_message", "message: must not be empty.")
    most = resources.settings.ATTACHMENT_MAX_PER_TURN
    if len(body.attachments) > most:
        raise api_error(
            422,
            "too_many_attachments",
            f"attachments: at most {most} files per message, got {len(body.attachments)}.",
        )
    if len(body.message) > resources.settings.MAX_MESSAGE_CHARS:
        raise api_error(
            422,
            "message_too_long",
            f"message: longer than {resources.settings.MAX_MESSAGE_CHARS} characters.",
        )
    log.debug("process_message", user_id=body.user_id, chars=len(body.message))
    sid = body.session_id
    command = parse_memory_command(body.message) if not body.attachments else None
    memories = resources.services.find(Memories)
    if memories is not None and command is None and not body.attachments:
        memories.prefetch(body.ac_context, body.message)  # recall's embedding, started now

    lock = await acquire(resources, sid)

    async def close_stale() -> None:
        await close_stale_question(resources, sid)

    files = [a.name for a in body.attachments]
    # A memory command's trace names the command, never the text of a memory.
    asked = body.message if command is None else "!" + body.message.strip()[1:].split(maxsplit=1)[0]
    turn = TurnRecorder(new_trace(sid, body.ac_context, body.audience, asked, files))
    intake: Intake | None = None
    if body.attachments:
        intake = _files_reader(body, resources, turn)
    elif command is not None and command != Forget(None):  # `!forget all` asks first: the workflow
        intake = _memory_command(body, resources, command)
    run = Run(
        resources.graph,
        new_turn_input(body.message, body.ac_context, turn.trace.turn_id),
        run_config(
            sid,
            body.audience,
            turn,
            audience_unchecked=body.audience_unchecked,
            coalesce_ms=resources.settings.STREAM_COALESCE_MS,
        ),
        resources.settings.RUN_TIMEOUT_SECONDS,
        prelude=close_stale if lock.question_may_be_pending else None,
        pacing=resources.pacing,
        intake=intake,
    )
    return sse(resources, "process_message", sid, lock, run)


def _memory_command(body: ProcessMessageRequest, resources: Resources, command: MemoryCommand) -> Intake:
    """`!remember`, `!memory`, `!forget N`: answered without the model, nothing saved."""

    async def read(emit: Callable[[SSEEvent], None]) -> HumanMessage | Reply:
        memories = resources.services.find(Memories)
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


def _files_reader(body: ProcessMessageRequest, resources: Resources, turn: TurnRecorder) -> Intake:
    async def read(emit: Callable[[SSEEvent], None]) -> HumanMessage | Reply:
        return await read_turn(body.message, body.attachments, resources.file_reading, emit, turn)

    return read


@router.post(
    "/submit_feedback",
    response_model=None,
    responses={
        200: {
            "content": {
                "text/event-stream": {},
                "application/json": {"schema": FeedbackAck.model_json_schema()},
            },
            "description": "SSE like process_message, or a JSON ack when "
            "the client accepts only application/json",
        },
        **_ERRORS,
    },
)
async def submit_feedback(body: FeedbackRequest, request: Request, resources: ResourcesDep) -> Response:
    """Resume the session's paused workflow with the human's answer."""
    structlog.contextvars.bind_contextvars(session_id=body.session_id)
    if looks_like_secret(body.response):  # the bot refuses these first; any other client too
        metrics.HITL_RESUMES.labels("secret_refused").inc()
        raise api_error(
            422,
            "answer_looks_like_secret",
            "response: looks like a password, key or token, so it was not accepted (the question "
            "is still open). Answer without it.",
        )
    lock = await acquire(resources, body.session_id)
    try:
        state = await resources.graph.aget_state(run_config(body.session_id))
    except Exception:
        await release(lock)
        raise
    pending = {i.id for i in state.interrupts}
    if not pending:
        await release(lock)
        raise api_error(409, "no_pending_question", "Nothing is waiting for an answer in this session.")
    if body.interrupt_id and body.interrupt_id not in pending:
        await release(lock)
        raise api_error(409, "stale_question", "That question is no longer pending.")
    metrics.HITL_RESUMES.labels("answered").inc()
    log.info("submit_feedback", chars=len(body.response))
    update: dict[str, Any] = {}
    if body.ac_context:
        update["ac_context"] = body.ac_context.to_wire()
    command: Command[Any] = Command(resume=body.response, update=update or None)
    turn = await resumed_turn(resources, state.values, body.session_id, body.ac_context, body.audience)
    cfg = run_config(
        body.session_id,
        body.audience,
        turn,
        audience_unchecked=body.audience_unchecked,
        coalesce_ms=resources.settings.STREAM_COALESCE_MS,
    )

    timeout = resources.settings.RUN_TIMEOUT_SECONDS
    run = Run(resources.graph, command, cfg, timeout, pacing=resources.pacing)
    accept = request.headers.get("accept", "")
    if "application/json" in accept and "text/event-stream" not in accept:
        batches = run.batches()
        collected: list[SSEEvent] = []
        try:
            async for batch in batches:
                collected += batch
        finally:
            await batches.aclose()
            await run.close()
            last = next((e for e in reversed(collected) if isinstance(e, HitlRequest | TextFinal)), None)
            await end_run(resources, lock, last)
            error = next((e for e in collected if isinstance(e, ErrorEvent)), None)
            await close_turn(resources, turn, last, error)
        return JSONResponse(_ack(collected).model_dump())
    return sse(resources, "submit_feedback", body.session_id, lock, run)


@router.post(
    "/reset_session",
    response_model=FeedbackAck,
    responses={401: {"model": ErrorResponse}, 409: {"model": ErrorResponse}},
)
async def reset_session(body: ResetRequest, resources: ResourcesDep) -> FeedbackAck:
    """Forget the session's conversation and any pending question (`!reset`)."""
    structlog.contextvars.bind_contextvars(session_id=body.session_id)
    lock = await acquire(resources, body.session_id)
    try:
        await resources.checkpointer.adelete_thread(body.session_id)
    finally:
        await release(lock)
    log.info("session_reset")
    return FeedbackAck(success=True, message="The conversation was forgotten.")


def _ack(events: list[SSEEvent]) -> FeedbackAck:
    for ev in events:
        if isinstance(ev, ErrorEvent):
            return FeedbackAck(success=False, message=ev.message)
        if isinstance(ev, HitlRequest):
            return FeedbackAck(success=True, message=ev.question)
        if isinstance(ev, TextFinal):
            return FeedbackAck(success=True, message=ev.content)
    return FeedbackAck(success=True, message="")
