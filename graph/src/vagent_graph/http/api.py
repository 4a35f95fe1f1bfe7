"""The bot's API (`/api/v1/`): answer a message, resume a paused run with the human's
answer, forget a session. Every route needs the service token; RequestMiddleware checks it
for the whole `/api/` prefix before any route is chosen, so no route here can miss it.

Thin by design: a route checks what the client sent, hands it to the turn (turn/turn.py:
lock, intake, run, stream, trace, end) and writes what the turn yields as SSE (or JSON)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Annotated, Any

import structlog
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask

from vagent_graph.http.middleware import API_PREFIX
from vagent_graph.observability import metrics
from vagent_graph.resources import Resources
from vagent_graph.turn.turn import Turn, TurnRefused, reset
from vagent_shared.events import ErrorEvent, HitlRequest, SSEEvent, TextFinal
from vagent_shared.http_errors import api_error
from vagent_shared.secrets import looks_like_secret
from vagent_shared.wire import (
    ErrorResponse,
    FeedbackAck,
    FeedbackRequest,
    ProcessMessageRequest,
    ResetRequest,
)

log = structlog.get_logger(__name__)


async def lifespan_resources(request: Request) -> Resources:
    """What the lifespan opened (app.state.resources). A coroutine: FastAPI runs a plain
    function dependency in its thread pool, a thread hop on every request."""
    return request.app.state.resources  # type: ignore[no-any-return]


ResourcesDep = Annotated[Resources, Depends(lifespan_resources)]

#: What the streaming routes answer instead of a stream (all with an ErrorResponse body).
_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse} for status in (401, 409, 413, 422, 503)
}

router = APIRouter(prefix=f"{API_PREFIX}v1", tags=["api"])


#: How a refused turn is answered (TurnRefused.code -> HTTP status).
_REFUSED_STATUS = {
    "session_busy": 409,
    "no_pending_question": 409,
    "stale_question": 409,
    "redis_unavailable": 503,
}


def _refused(exc: TurnRefused) -> Exception:
    return api_error(_REFUSED_STATUS.get(exc.code, 409), exc.code, exc.message)


def _frame(ev: SSEEvent) -> bytes:
    return ServerSentEvent(event=ev.EVENT, data=ev.sse_data()).encode()


def sse(turn: Turn) -> EventSourceResponse:
    """The turn's batches as SSE: one write per batch, every event its own frame; a silence
    becomes a keep-alive comment."""

    async def frames() -> AsyncIterator[bytes]:
        # closing the stream ends the turn (Turn.stream), also when the client went away
        async with contextlib.aclosing(turn.stream()) as batches:
            async for batch in batches:
                if not batch:  # nothing to say for a while: keep proxies from timing out
                    yield b": keep-alive\r\n\r\n"
                    continue
                yield b"".join(_frame(ev) for ev in batch)

    return EventSourceResponse(
        frames(),
        ping=0,  # keep-alive comes from the stream itself (Outbox): one task less per stream
        headers={"X-Accel-Buffering": "no", "Cache-Control": "no-cache"},
        background=BackgroundTask(turn.close),  # the stream never started: end the turn even so
    )


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
    try:
        return sse(await Turn.start(resources, body))
    except TurnRefused as exc:
        raise _refused(exc) from None


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
    try:
        turn = await Turn.resume(resources, body)
    except TurnRefused as exc:
        raise _refused(exc) from None
    accept = request.headers.get("accept", "")
    if "application/json" in accept and "text/event-stream" not in accept:
        return JSONResponse(_ack(await turn.collect()).model_dump())
    return sse(turn)


@router.post(
    "/reset_session",
    response_model=FeedbackAck,
    responses={401: {"model": ErrorResponse}, 409: {"model": ErrorResponse}},
)
async def reset_session(body: ResetRequest, resources: ResourcesDep) -> FeedbackAck:
    """Forget the session's conversation and any pending question (`!reset`)."""
    structlog.contextvars.bind_contextvars(session_id=body.session_id)
    try:
        await reset(resources, body.session_id)
    except TurnRefused as exc:
        raise _refused(exc) from None
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
