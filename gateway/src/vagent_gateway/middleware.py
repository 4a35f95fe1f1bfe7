"""Pure ASGI middleware: the body size limit and the request metrics.

Bodies over MAX_REQUEST_BYTES answer 413 before anything parses them, announced
(`Content-Length`) or counted while read, as the graph does: a client cannot make the
gateway buffer more than the limit. Pure ASGI so streams are never buffered.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vagent_gateway import metrics
from vagent_shared.http_errors import api_error
from vagent_shared.wire import ErrorResponse

TOO_LARGE = ErrorResponse(error_code="request_too_large", message="The request body is too large.")


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            body = TOO_LARGE.model_dump_json().encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 413,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            msg = await receive()
            seen += len(msg.get("body", b""))
            if seen > self.max_bytes:
                raise api_error(413, TOO_LARGE.error_code, TOO_LARGE.message)
            return msg

        await self.app(scope, limited, send)


class CountRequests:
    """`vagent_gateway_requests_total{route,status}` (pure ASGI: a stream is not buffered)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = getattr(scope.get("route"), "path", "other")
            metrics.REQUESTS.labels(route, str(status)).inc()
