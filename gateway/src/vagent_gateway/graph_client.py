"""HTTP + SSE client of the graph's existing API, with the service token.

Why its own (not the bot's): the gateway is a peer of the bot, not a part of it; the wire
models and the SSE decoder are the shared ones, so the contract is still one copy.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator

import aiohttp
import structlog
from pydantic import BaseModel

from vagent_shared.events import SSEDecoder, SSEEvent, parse_sse_event
from vagent_shared.wire import FeedbackRequest, ProcessMessageRequest, ResetRequest

log = structlog.get_logger(__name__)

_JSON = {"Content-Type": "application/json"}


class GraphError(Exception):
    """The graph refused or could not answer: `status` and `code` for the gateway's reply."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}")
        self.status, self.code, self.message = status, code, message


class GraphClient:
    """One keep-alive pool to the graph; `read_timeout` bounds the silence between two reads
    of a stream (the graph sends a keep-alive comment every SSE_KEEPALIVE_SECONDS)."""

    def __init__(
        self, base_url: str, token: str | None, *, read_timeout: float = 90.0, proxy: str | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=10.0, sock_connect=5.0, sock_read=read_timeout
        )
        self._proxy = proxy
        self._client: aiohttp.ClientSession | None = None

    def _session(self) -> aiohttp.ClientSession:
        if self._client is None:
            self._client = aiohttp.ClientSession(timeout=self._timeout, headers=self._headers)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()

    def process_message(self, req: ProcessMessageRequest) -> AsyncGenerator[SSEEvent, None]:
        return self._stream("process_message", req)

    def submit_feedback(self, req: FeedbackRequest) -> AsyncGenerator[SSEEvent, None]:
        return self._stream("submit_feedback", req)

    async def reset(self, session_id: str) -> None:
        """Forget the session's conversation and any pending question (`!reset`)."""
        body = ResetRequest(session_id=session_id).model_dump_json()
        try:
            async with self._session().post(
                f"{self.base_url}/api/v1/reset_session", data=body, headers=_JSON, proxy=self._proxy
            ) as r:
                raw = await r.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise GraphError(503, "graph_unavailable", "The agent service cannot be reached.") from exc
        _raise_for(r.status, raw, "reset_session")

    async def _stream(self, endpoint: str, req: BaseModel) -> AsyncGenerator[SSEEvent, None]:
        """The events of one run. Refusals raise GraphError before the first event; a stream
        that breaks raises GraphError(502) after the events it gave."""
        decoder = SSEDecoder()
        done = False
        try:
            async with self._session().post(
                f"{self.base_url}/api/v1/{endpoint}",
                data=req.model_dump_json(),
                headers={**_JSON, "Accept": "text/event-stream"},
                proxy=self._proxy,
            ) as resp:
                if resp.status != 200:
                    _raise_for(resp.status, await resp.read(), endpoint)
                async for chunk in resp.content.iter_any():
                    for raw in decoder.feed(chunk):
                        try:
                            ev = parse_sse_event(raw.event, raw.data)
                        except ValueError:
                            log.warning("graph_unknown_event", sse_event=raw.event[:50])
                            continue
                        done = done or ev.EVENT == "done"
                        yield ev
        except GraphError:
            raise
        except (TimeoutError, aiohttp.ClientError) as exc:
            if done:
                return
            log.error("graph_stream_failed", endpoint=endpoint, error_type=type(exc).__name__)
            if isinstance(exc, aiohttp.ClientConnectorError):
                raise GraphError(503, "graph_unavailable", "The agent service cannot be reached.") from exc
            raise GraphError(502, "stream_broken", "The answer was interrupted.") from exc
        if not done:
            raise GraphError(502, "stream_broken", "The answer was interrupted.")


def _raise_for(status: int, raw: bytes, endpoint: str) -> None:
    """A refusal of the graph as GraphError, with the graph's code where a client may act on it."""
    if status < 300:
        return
    try:
        body = json.loads(raw)
    except ValueError:
        body = {}
    code = str(body.get("error_code", "")) if isinstance(body, dict) else ""
    message = str(body.get("message", "")) if isinstance(body, dict) else ""
    log.warning("graph_refused", endpoint=endpoint, status=status, error_code=code)
    if status == 409:
        raise GraphError(409, code or "conflict", message or "The thread is busy.")
    if status == 422:
        raise GraphError(422, code or "invalid_request", message or "The graph refused the message.")
    if status in (413,):
        raise GraphError(413, code, message)
    # 401/403 (a misconfigured service token) and 5xx: the service is not usable right now
    raise GraphError(503, "graph_unavailable", "The agent service cannot answer right now.")
