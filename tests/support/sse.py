"""Read a whole SSE response into (event, data) models, as the bot will."""

from __future__ import annotations

import re
from typing import Any

import httpx
from httpx_sse import aconnect_sse

from vagent_shared import SSEEvent, parse_sse_event
from vagent_shared.events import TurnStarted


async def post_sse(
    client: httpx.AsyncClient,
    path: str,
    body: dict[str, Any],
    headers: dict[str, str],
    *,
    keep_turn: bool = False,
) -> list[SSEEvent]:
    """The stream's events; the `turn` event that opens every stream only with `keep_turn`
    (tests of the turn's trace want it, the others read what the user sees)."""
    events: list[SSEEvent] = []
    async with aconnect_sse(client, "POST", path, json=body, headers=headers) as src:
        assert src.response.status_code == 200, await src.response.aread()
        assert src.response.headers["content-type"].startswith("text/event-stream")
        async for sse in src.aiter_sse():
            event = parse_sse_event(sse.event, sse.data)
            if keep_turn or not isinstance(event, TurnStarted):
                events.append(event)
    return events


def kinds(events: list[SSEEvent]) -> list[str]:
    """The events' kinds, without the `turn` event that opens every stream (its own tests:
    tests/integration/test_turn_traces.py)."""
    return [e.EVENT for e in events if not isinstance(e, TurnStarted)]


def parse_sse_text(text: str) -> list[SSEEvent]:
    """The events of a whole SSE body read as text (comments skipped)."""
    return [
        parse_sse_event(m.group(1), m.group(2))
        for m in re.finditer(r"event: (\w+)\r?\ndata: (.*)\r?\n", text)
    ]
