"""The one ASGI middleware of the graph service: pure ASGI, because a BaseHTTPMiddleware
costs ~1.4 ms per request (measured by bench-graph)."""

from __future__ import annotations

import hmac
import time
import uuid

import structlog
from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vagent_graph.observability import metrics
from vagent_shared.audit_trail import AuditTrail
from vagent_shared.http_errors import api_error
from vagent_shared.wire import ErrorResponse

#: The 413 answer, whether the size is announced or found while reading.
TOO_LARGE = ("request_too_large", "The request body is too large.")


def payload_too_large() -> HTTPException:
    """Raised while the body is read: FastAPI passes HTTPExceptions through to its handler."""
    return api_error(413, *TOO_LARGE)


#: Every path under this prefix needs the service token, including ones no route matches.
API_PREFIX = "/api/"
#: The admin API (documents for ingestion): its own token (admin.py) and body limit.
ADMIN_PREFIX = "/admin/"
#: A message may carry files (base64 in the JSON): its own, larger body limit.
FILES_PATH = "/api/v1/process_message"


def files_body_limit(max_request_bytes: int, attachment_max_bytes: int, per_turn: int) -> int:
    """The largest process_message body: the message, plus `per_turn` files of the largest
    size as base64 (4/3; 1.4 leaves room for line breaks some encoders add every 76)."""
    return max_request_bytes + per_turn * (attachment_max_bytes * 14 // 10 + 1024)

log = structlog.get_logger(__name__)


def token_matches(authorization: bytes | None, token: bytes) -> bool:
    """`Authorization: Bearer <token>` (scheme in any case), compared in constant time."""
    scheme, _, given = (authorization or b"").partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), token)


class RequestMiddleware:
    """Per request: a fresh log context; 401 for an `/api/` request without the service
    token (`token` empty: GRAPH_INSECURE_DEV, no check); 413 for bodies over the limit
    (`admin_max_bytes` under /admin/, where documents are uploaded, `files_max_bytes` for
    process_message, which may carry files; announced or streamed); both before anything
    parses the body. And the request metrics. Pure ASGI: cheap, and no route can be added
    without the token check."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        token: str = "",
        admin_max_bytes: int = 0,
        files_max_bytes: int = 0,
    ) -> None:
        self.app, self.max_bytes, self.token = app, max_bytes, token.encode()
        self.admin_max_bytes = admin_max_bytes or max_bytes
        self.files_max_bytes = files_max_bytes or max_bytes

    def _limit(self, path: str) -> int:
        if path.startswith(ADMIN_PREFIX):
            return self.admin_max_bytes
        return self.files_max_bytes if path == FILES_PATH else self.max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(request_id=uuid.uuid4().hex[:16])
        headers = dict(scope["headers"])
        if self.token and scope["path"].startswith(API_PREFIX):
            authorization = headers.get(b"authorization")
            if not token_matches(authorization, self.token):
                _refused(scope, authorization is not None)
                await _send_error(send, 401, "unauthorized", "Missing or invalid service token.")
                return
        max_bytes = self._limit(scope["path"])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > max_bytes:
            await _send_error(send, 413, *TOO_LARGE)
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
            if seen > max_bytes:
                raise payload_too_large()
            return msg

        try:
            await self.app(scope, limited, sending)
        finally:
            endpoint = getattr(scope.get("route"), "path", "other")
            metrics.REQUESTS.labels(endpoint, str(status)).inc()
            if not streaming:  # a stream's duration is observed when it ends
                metrics.REQUEST_SECONDS.labels(endpoint).observe(time.perf_counter() - start)


def _refused(scope: Scope, header_present: bool) -> None:
    """A security event: counted and logged, without the header's value."""
    metrics.SECURITY_EVENTS.labels("bad_service_token").inc()
    client = scope.get("client")
    log.warning(
        "security.bad_service_token",
        path=scope["path"],
        client=client[0] if client else None,
        auth_header_present=header_present,
    )
    resources = getattr(getattr(scope.get("app"), "state", None), "resources", None)
    trail = resources.services.find(AuditTrail) if resources is not None else None
    if trail is not None:  # nobody is known: the caller failed to prove it is the bot
        trail.record(
            "access_denied",
            user_id="unknown",
            resource=f"api:{scope['path'][:100]}",
            decision="denied",
            reason="invalid service token" if header_present else "no service token",
            metadata={"client": client[0] if client else None},
        )


async def _send_error(send: Send, status: int, code: str, message: str) -> None:
    """A refusal before any route is chosen (so counted under the endpoint "other")."""
    metrics.REQUESTS.labels("other", str(status)).inc()
    body = ErrorResponse(error_code=code, message=message).model_dump_json().encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
