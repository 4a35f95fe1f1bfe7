"""HTTP + SSE client of the graph service, with the service token.

aiohttp (which matrix-nio already runs on) rather than httpx: per request it costs
~0.3 ms less before the first event arrives (bench-graph), on every message's path.
Proxy variables are honoured (vagent_bot.http).
The stream is decoded by `vagent_shared.events.SSEDecoder`. Failures become a few typed
exceptions the bot can turn into one short message.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
import structlog
from pydantic import BaseModel

from vagent_bot import metrics
from vagent_bot.http import LazySession, client_tracing, proxy_for
from vagent_shared.events import SSEDecoder, SSEEvent, parse_sse_event
from vagent_shared.wire import FeedbackRequest, ProcessMessageRequest, ResetRequest

log = structlog.get_logger(__name__)

_JSON = {"Content-Type": "application/json"}


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
    """One keep-alive connection pool to the graph. `read_timeout` bounds the silence
    between two reads of a stream (the graph pings every 15 s while it works).
    `max_connections` (GRAPH_MAX_CONNECTIONS; 0: no cap) bounds the requests in flight, so
    the answers one bot process streams at once; a request beyond it waits for a free
    connection, up to the 10 s connect timeout, then fails."""

    def __init__(
        self,
        base_url: str,
        token: str | None,
        *,
        read_timeout: float = 90.0,
        max_connections: int = 100,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._proxy = proxy_for(self.base_url)
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=10.0, sock_connect=5.0, sock_read=read_timeout
        )
        self._session = LazySession(
            session,
            lambda: aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=max_connections),
                timeout=self._timeout,
                headers=self._headers,
                trace_configs=client_tracing(),  # the request continues the event's trace
            ),
        )

    async def aclose(self) -> None:
        await self._session.aclose()

    async def process_message(self, req: ProcessMessageRequest) -> AsyncIterator[SSEEvent]:
        async for ev in self._stream("process_message", req):
            yield ev

    async def submit_feedback(self, req: FeedbackRequest) -> AsyncIterator[SSEEvent]:
        async for ev in self._stream("submit_feedback", req):
            yield ev

    async def reset(self, session_id: str) -> None:
        body = ResetRequest(session_id=session_id).model_dump_json()
        try:
            async with self._session.get().post(
                f"{self.base_url}/api/v1/reset_session", data=body, headers=_JSON, proxy=self._proxy
            ) as r:
                raw = await r.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise GraphUnavailable(type(exc).__name__) from exc
        self._raise_for(r.status, raw, "reset_session")

    async def healthy(self) -> bool:
        try:
            async with self._session.get().get(
                f"{self.base_url}/health", timeout=aiohttp.ClientTimeout(total=3), proxy=self._proxy
            ) as r:
                await r.read()
                return r.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def _stream(self, endpoint: str, req: BaseModel) -> AsyncIterator[SSEEvent]:
        done = False
        decoder = SSEDecoder()
        try:
            async with self._session.get().post(
                f"{self.base_url}/api/v1/{endpoint}",
                data=req.model_dump_json(),
                headers={**_JSON, "Accept": "text/event-stream"},
                proxy=self._proxy,
            ) as resp:
                if resp.status != 200:
                    self._raise_for(resp.status, await resp.read(), endpoint)
                async for chunk in resp.content.iter_any():
                    for raw in decoder.feed(chunk):
                        try:
                            ev = parse_sse_event(raw.event, raw.data)
                        except ValueError:
                            log.warning("graph_unknown_event", sse_event=raw.event[:50])
                            continue
                        if ev.EVENT == "done":
                            done = True
                        yield ev
        except GraphError:
            raise
        except (TimeoutError, aiohttp.ClientError) as exc:
            metrics.GRAPH_REQUESTS.labels(endpoint, "unreachable" if not done else "ok").inc()
            if done:
                return
            log.error("graph_stream_failed", endpoint=endpoint, error_type=type(exc).__name__)
            unreachable = isinstance(exc, aiohttp.ClientConnectorError)
            raise (GraphUnavailable if unreachable else GraphStreamBroken)(type(exc).__name__) from exc
        if not done:
            metrics.GRAPH_REQUESTS.labels(endpoint, "broken").inc()
            raise GraphStreamBroken("stream ended without done")
        metrics.GRAPH_REQUESTS.labels(endpoint, "ok").inc()

    @staticmethod
    def _raise_for(status: int, raw: bytes, endpoint: str) -> None:
        """A refusal as a typed exception."""
        if status < 300:
            return
        try:
            body = json.loads(raw)
        except ValueError:
            body = {}
        code = str(body.get("error_code", "")) if isinstance(body, dict) else ""
        metrics.GRAPH_REQUESTS.labels(endpoint, f"http_{status}").inc()
        log.warning("graph_refused", endpoint=endpoint, status=status, error_code=code)
        if status == 409 and code == "session_busy":
            raise GraphBusy(code)
        if status == 409:
            raise GraphNoPending(code)
        if status >= 500 or status in (401, 403):
            raise GraphUnavailable(f"{status} {code}")
        raise GraphRejected(f"{status} {code}")
