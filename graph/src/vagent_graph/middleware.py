"""The one ASGI middleware of the graph service: pure ASGI, because a BaseHTTPMiddleware
costs ~1.4 ms per request (measured by bench-graph)."""

from __future__ import annotations

import time
import uuid

import structlog
from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vagent_graph import metrics
from vagent_shared.http_errors import api_error
from vagent_shared.wire import ErrorResponse


def payload_too_large() -> HTTPException:
    """Raised while the body is read: FastAPI passes HTTPExceptions through to its handler."""
    return api_error(413, "request_too_large", "The request body is too large.")


class RequestMiddleware:
    """Per request: a fresh log context, 413 for bodies over the limit (announced or
    streamed) before anything parses them, and the request metrics. Pure ASGI: cheap."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(request_id=uuid.uuid4().hex[:16])
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await _too_large(send)
            return
        seen, start, status, streaming = 0, time.perf_counter(), 500, False

        async def sending(message: Message) -> None:
            nonlocal status, streaming
            if message["type"] == "http.response.start":
                status = message["status"]
                streaming = any(
                    k == b"content-type" and v.startswith(b"text/event-stream")
                    for k, v in message.get("headers", [])
                )
            await send(message)

        async def limited() -> Message:
            nonlocal seen
            msg = await receive()
            seen += len(msg.get("body", b""))
            if seen > self.max_bytes:
                raise payload_too_large()
            return msg

        try:
            await self.app(scope, limited, sending)
        finally:
            endpoint = getattr(scope.get("route"), "path", "other")
            metrics.REQUESTS.labels(endpoint, str(status)).inc()
            if not streaming:  # a stream's duration is observed when it ends
                metrics.REQUEST_SECONDS.labels(endpoint).observe(time.perf_counter() - start)


async def _too_large(send: Send) -> None:
    body = (
        ErrorResponse(error_code="request_too_large", message="The request body is too large.")
        .model_dump_json()
        .encode()
    )
    await send(
        {"type": "http.response.start", "status": 413, "headers": [(b"content-type", b"application/json")]}
    )
    await send({"type": "http.response.body", "body": body})
