"""Read a whole SSE response into (event, data) models, as the bot will."""

from __future__ import annotations

import re
from typing import Any

import httpx
from httpx_sse import aconnect_sse

from vagent_shared import SSEEvent, parse_sse_event


async def post_sse(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], headers: dict[str, str]
) -> list[SSEEvent]:
    events: list[SSEEvent] = []
    async with aconnect_sse(client, "POST", path, json=body, headers=headers) as src:
        assert src.response.status_code == 200, await src.response.aread()
        assert src.response.headers["content-type"].startswith("text/event-stream")
        async for sse in src.aiter_sse():
            events.append(parse_sse_event(sse.event, sse.data))
    return events


def kinds(events: list[SSEEvent]) -> list[str]:
    return [e.EVENT for e in events]


def parse_sse_text(text: str) -> list[SSEEvent]:
    """The events of a whole SSE body read as text (comments skipped)."""
    return [
        parse_sse_event(m.group(1), m.group(2))
        for m in re.finditer(r"event: (\w+)\r?\ndata: (.*)\r?\n", text)
    ]
