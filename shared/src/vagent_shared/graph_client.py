"""HTTP + SSE client of the graph service's API (docs/api.md), with the service token.

Why shared: the bot and the gateway both call the graph, and the contract of that call (the
streaming POST, its SSE decoding, which refusal means what) must exist once. What differs per
service is injected: how it counts a request's outcome (`on_outcome`), its aiohttp
`trace_configs` and the HTTP proxy to reach the graph through (the environment is not read
here). A service may subclass to rename the logger (`log`) or to turn the typed errors into
its own replies.

aiohttp (which matrix-nio already runs on) rather than httpx: per request it costs ~0.3 ms
less before the first event arrives (bench-graph), on every message's path. Failures become a
few typed exceptions whose `user_message` is safe to show.

Needs the `provider` extra (aiohttp): `vagent-shared[provider]`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any, ClassVar, Final

import aiohttp
import structlog
from pydantic import BaseModel

from vagent_shared.events import SSEDecoder, SSEEvent, parse_sse_event
from vagent_shared.http_session import LazySession
from vagent_shared.wire import FeedbackRequest, ProcessMessageRequest, ResetRequest

_JSON: Final = {"Content-Type": "application/json"}

#: `(endpoint, outcome)` once per streamed request (outcome `ok`, `broken`, `unreachable` or
#: `http_<status>`) and once per refused reset (`http_<status>`).
OutcomeHook = Callable[[str, str], None]


def _ignore(endpoint: str, outcome: str) -> None:
    """The default outcome hook: count nothing."""


class GraphError(Exception):
    """The graph could not answer; `user_message` is safe to show. `status` is the graph's
    HTTP status (None: no answer came), `code` and `message` its error body's fields."""

    user_message: ClassVar[str] = (
        "I can't reach my reasoning service right now. Please try again in a moment."
    )

    def __init__(self, detail: str, *, status: int | None = None, code: str = "", message: str = "") -> None:
        super().__init__(detail)
        self.status, self.code, self.message = status, code, message


class GraphUnavailable(GraphError):
    """Not reachable, or answered 5xx / 401 / 403 (a misconfigured service token)."""


class GraphStreamBroken(GraphError):
    """The stream stopped before its `done` event."""

    user_message: ClassVar[str] = "My answer was interrupted. Please try again."


class GraphBusy(GraphError):
    """409 session_busy: another run of the session (maybe another bot process) is going on."""


class GraphNoPending(GraphError):
    """409 no_pending_question / stale_question: the question is gone."""

    user_message: ClassVar[str] = "That question has expired. Please ask again."


class GraphRejected(GraphError):
    """Any other 4xx: the request itself was refused."""

    user_message: ClassVar[str] = "I couldn't process that message."


def refusal(status: int, raw: bytes) -> GraphError:
    """The typed error for a graph answer of `status` (>= 300) with body `raw`."""
    try:
        body = json.loads(raw)
    except ValueError:
        body = {}
    code = str(body.get("error_code", "")) if isinstance(body, dict) else ""
    message = str(body.get("message", "")) if isinstance(body, dict) else ""
    fields: dict[str, Any] = {"status": status, "code": code, "message": message}
    if status == 409 and code == "session_busy":
        return GraphBusy(code, **fields)
    if status == 409:
        return GraphNoPending(code, **fields)
    if status >= 500 or status in (401, 403):
        return GraphUnavailable(f"{status} {code}", **fields)
    return GraphRejected(f"{status} {code}", **fields)


class GraphClient:
    """One keep-alive connection pool to the graph. `read_timeout` bounds the silence
    between two reads of a stream (the graph pings while it works). `max_connections`
    (0: no cap) bounds the requests in flight; a request beyond it waits for a free
    connection, up to the 10 s connect timeout, then fails."""

    log: ClassVar[Any] = structlog.get_logger(__name__)

    def __init__(
        self,
        base_url: str,
        token: str | None,
        *,
        read_timeout: float = 90.0,
        max_connections: int = 100,
        session: aiohttp.ClientSession | None = None,
        proxy: str | None = None,
        trace_configs: Sequence[aiohttp.TraceConfig] = (),
        on_outcome: OutcomeHook = _ignore,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._proxy = proxy
        self._outcome = on_outcome
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        timeout = aiohttp.ClientTimeout(total=None, connect=10.0, sock_connect=5.0, sock_read=read_timeout)
        self._session = LazySession(
            session,
            lambda: aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=max_connections),
                timeout=timeout,
                headers=headers,
                trace_configs=list(trace_configs) or None,
            ),
        )

    async def aclose(self) -> None:
        await self._session.aclose()

    def process_message(self, req: ProcessMessageRequest) -> AsyncGenerator[SSEEvent, None]:
        return self._stream("process_message", req)

    def submit_feedback(self, req: FeedbackRequest) -> AsyncGenerator[SSEEvent, None]:
        return self._stream("submit_feedback", req)

    async def reset(self, session_id: str) -> None:
        """Forget the session's conversation and any pending question (`!reset`)."""
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

    async def _stream(self, endpoint: str, req: BaseModel) -> AsyncGenerator[SSEEvent, None]:
        """The events of one run. A refusal raises before the first event; a stream that
        breaks before `done` raises GraphStreamBroken (GraphUnavailable: no connection)."""
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
                            self.log.warning("graph_unknown_event", sse_event=raw.event[:50])
                            continue
                        done = done or ev.EVENT == "done"
                        yield ev
        except GraphError:
            raise
        except (TimeoutError, aiohttp.ClientError) as exc:
            self._outcome(endpoint, "ok" if done else "unreachable")
            if done:
                return
            self.log.error("graph_stream_failed", endpoint=endpoint, error_type=type(exc).__name__)
            unreachable = isinstance(exc, aiohttp.ClientConnectorError)
            raise (GraphUnavailable if unreachable else GraphStreamBroken)(type(exc).__name__) from exc
        if not done:
            self._outcome(endpoint, "broken")
            raise GraphStreamBroken("stream ended without done")
        self._outcome(endpoint, "ok")

    def _raise_for(self, status: int, raw: bytes, endpoint: str) -> None:
        """A refusal as a typed exception, counted and logged (its code, never its body)."""
        if status < 300:
            return
        error = refusal(status, raw)
        self._outcome(endpoint, f"http_{status}")
        self.log.warning("graph_refused", endpoint=endpoint, status=status, error_code=error.code)
        raise error
