"""What the demo services that know people by an API key share (the ticket service, the
calendar MCP server): the key's digest (all they keep and record of a key), where a seed-file
error is (never the key itself, which is the place under `keys:`), and the request log the
tests read (`GET` / `DELETE /debug/requests`)."""

from __future__ import annotations

import hashlib
from collections import deque
from typing import Any

from fastapi import FastAPI, Response

from vagent_shared.validation import Loc

#: How many requests the log keeps.
REQUEST_LOG_SIZE = 1000


def key_sha256(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def seed_place(loc: Loc) -> str:
    """A seed file's validation error place; under `keys` that would be the key, so not that."""
    if loc[:1] == ("keys",):
        return "keys"
    return ".".join(str(p) for p in loc) or "seed"


def request_log() -> deque[dict[str, Any]]:
    return deque(maxlen=REQUEST_LOG_SIZE)


def add_request_log_routes(app: FastAPI, entries: deque[dict[str, Any]]) -> None:
    @app.get("/debug/requests")
    async def requests() -> dict[str, list[dict[str, Any]]]:
        """The recorded requests, oldest first (the hash of each key, never the key)."""
        return {"requests": list(entries)}

    @app.delete("/debug/requests", status_code=204)
    async def clear_requests() -> Response:
        entries.clear()
        return Response(status_code=204)
