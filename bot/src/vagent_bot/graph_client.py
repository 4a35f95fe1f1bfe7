"""HTTP + SSE client of the graph service (httpx + httpx-sse), with the service token.

Failures become a few typed exceptions the bot can turn into one short message.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import structlog
from httpx_sse import aconnect_sse

from vagent_bot import metrics
from vagent_shared.events import SSEEvent, parse_sse_event
from vagent_shared.wire import FeedbackRequest, ProcessMessageRequest, ResetRequest

log = structlog.get_logger(__name__)


class GraphError(Exception):
    """The graph could not answer; `user_message` is safe to show."""

    user_message = "I can't reach my reasoning service right now. Please try again in a moment."


class GraphUnavailable(GraphError):
    pass


class GraphStreamBroken(GraphError):
    user_message = "My answer was interrupted. Please try again."


class GraphBusy(GraphError):
    """409 session_busy: another run of the session (maybe another bot process) is going on."""


class GraphNoPending(GraphError):
    """409 no_pending_question / stale_question: the question is gone."""

    user_message = "That question has expired. Please ask again."


class GraphRejected(GraphError):
    user_message = "I couldn't process that message."


class GraphClient:
    def __init__(
        self,
        base_url: str,
        token: str | None,
        *,
        read_timeout: float = 90.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = client or httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(connect=5.0, read=read_timeout, write=10.0, pool=10.0),
            limits=httpx.Limits(max_connections=100, max_keepalive_connections=20),
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def process_message(self, req: ProcessMessageRequest) -> AsyncIterator[SSEEvent]:
        async for ev in self._stream("process_message", req.model_dump(mode="json")):
            yield ev

    async def submit_feedback(self, req: FeedbackRequest) -> AsyncIterator[SSEEvent]:
        async for ev in self._stream("submit_feedback", req.model_dump(mode="json")):
            yield ev

    async def reset(self, session_id: str) -> None:
        try:
            r = await self._client.post(
                "/api/v1/reset_session", json=ResetRequest(session_id=session_id).model_dump()
            )
        except httpx.HTTPError as exc:
            raise GraphUnavailable(str(exc)) from exc
        self._raise_for(r, "reset_session")

    async def healthy(self) -> bool:
        try:
            r = await self._client.get("/health", timeout=3)
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    async def _stream(self, endpoint: str, body: dict[str, Any]) -> AsyncIterator[SSEEvent]:
        done = False
        try:
            async with aconnect_sse(self._client, "POST", f"/api/v1/{endpoint}", json=body) as src:
                if src.response.status_code != 200:
                    await src.response.aread()
                    self._raise_for(src.response, endpoint)
                async for sse in src.aiter_sse():
                    try:
                        ev = parse_sse_event(sse.event, sse.data)
                    except ValueError:
                        log.warning("graph_unknown_event", sse_event=sse.event[:50])
                        continue
                    if ev.EVENT == "done":
                        done = True
                    yield ev
        except GraphError:
            raise
        except httpx.HTTPError as exc:
            metrics.GRAPH_REQUESTS.labels(endpoint, "unreachable" if not done else "ok").inc()
            if done:
                return
            log.error("graph_stream_failed", endpoint=endpoint, error_type=type(exc).__name__)
            raise (GraphUnavailable if isinstance(exc, httpx.ConnectError) else GraphStreamBroken)(
                type(exc).__name__
            ) from exc
        if not done:
            metrics.GRAPH_REQUESTS.labels(endpoint, "broken").inc()
            raise GraphStreamBroken("stream ended without done")
        metrics.GRAPH_REQUESTS.labels(endpoint, "ok").inc()

    @staticmethod
    def _raise_for(r: httpx.Response, endpoint: str) -> None:
        """A refusal as a typed exception; the body must have been read."""
        if r.status_code < 300:
            return
        try:
            body = r.json()
        except ValueError:
            body = {}
        code = str(body.get("error_code", "")) if isinstance(body, dict) else ""
        metrics.GRAPH_REQUESTS.labels(endpoint, f"http_{r.status_code}").inc()
        log.warning("graph_refused", endpoint=endpoint, status=r.status_code, error_code=code)
        if r.status_code == 409 and code == "session_busy":
            raise GraphBusy(code)
        if r.status_code == 409:
            raise GraphNoPending(code)
        if r.status_code >= 500 or r.status_code in (401, 403):
            raise GraphUnavailable(f"{r.status_code} {code}")
        raise GraphRejected(f"{r.status_code} {code}")
