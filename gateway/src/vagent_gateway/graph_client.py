"""The gateway's client of the graph's existing API: the shared one
(`vagent_shared.graph_client`, also used by the bot) with its errors turned into the
gateway's replies.

Why a subclass and not a copy: the graph's HTTP + SSE contract and what each refusal means
must exist once. What stays here is only the gateway's own: `GraphError`, the HTTP status,
code and message the gateway answers its client with (`reply_for`), and its logger name.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from typing import Any, ClassVar

import structlog
from pydantic import BaseModel

from vagent_shared import graph_client as shared
from vagent_shared.events import SSEEvent

__all__ = ["GraphClient", "GraphError", "reply_for"]


class GraphError(Exception):
    """The graph refused or could not answer: `status` and `code` for the gateway's reply."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}")
        self.status, self.code, self.message = status, code, message


def reply_for(exc: shared.GraphError) -> GraphError:
    """The gateway's reply to a failed graph call: the graph's code where a client may act on
    it (409, 413, 422); 502 for a broken stream; otherwise 503 (unreachable, 5xx, or
    401/403: a misconfigured service token — the service is not usable right now)."""
    if isinstance(exc, shared.GraphStreamBroken):
        return GraphError(502, "stream_broken", "The answer was interrupted.")
    if exc.status is None:
        return GraphError(503, "graph_unavailable", "The agent service cannot be reached.")
    if exc.status == 409:
        return GraphError(409, exc.code or "conflict", exc.message or "The thread is busy.")
    if exc.status == 422:
        return GraphError(422, exc.code or "invalid_request", exc.message or "The graph refused the message.")
    if exc.status == 413:
        return GraphError(413, exc.code, exc.message)
    return GraphError(503, "graph_unavailable", "The agent service cannot answer right now.")


class GraphClient(shared.GraphClient):
    """The shared client; its failures raise the gateway's GraphError. `read_timeout` bounds
    the silence between two reads of a stream (the graph sends a keep-alive comment every
    SSE_KEEPALIVE_SECONDS)."""

    log: ClassVar[Any] = structlog.get_logger(__name__)

    def __init__(
        self, base_url: str, token: str | None, *, read_timeout: float = 90.0, proxy: str | None = None
    ) -> None:
        super().__init__(base_url, token, read_timeout=read_timeout, proxy=proxy)

    async def reset(self, session_id: str) -> None:
        try:
            await super().reset(session_id)
        except shared.GraphError as exc:
            raise reply_for(exc) from exc

    async def _stream(self, endpoint: str, req: BaseModel) -> AsyncGenerator[SSEEvent, None]:
        """The shared stream; a refusal raises GraphError before the first event, a stream
        that breaks raises GraphError(502) after the events it gave."""
        async with contextlib.aclosing(super()._stream(endpoint, req)) as events:
            try:
                async for ev in events:
                    yield ev
            except shared.GraphError as exc:
                raise reply_for(exc) from exc
