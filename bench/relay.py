#!/usr/bin/env python3
"""A plain per-chunk relay of the model's stream: the yardstick of issue 34's held-out check.

Why: the graph's CPU per streamed turn means little alone. This is what a naive service
written with the project's own libraries pays to deliver the same stream: FastAPI (with
the same request model as the graph), httpx to the model, one JSON decode and one SSE
event (sse-starlette) per model chunk. No LangChain, no LangGraph, no Redis: the history
is a dict in memory, so the model gets the same messages as from the graph. It speaks the
graph's wire (``POST /api/v1/process_message``, ``text_chunk`` ... ``text_final``,
``done``), so the bench drives it with the bot's GraphClient and the same conversations.

Plain text turns only: a tool call from the model is answered with an ``error`` event.

    python bench/relay.py --llm-url http://127.0.0.1:LLM_PORT/v1 --port PORT
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI
from sse_starlette import EventSourceResponse, ServerSentEvent

from vagent_shared.events import Done, ErrorEvent, TextChunk, TextFinal
from vagent_shared.wire import ProcessMessageRequest

SYSTEM = "You are a helpful assistant."
MODEL = "test-model"


def create_app(llm_url: str) -> FastAPI:
    """The relay's app: one httpx client to the model for the process's life."""
    history: dict[str, list[dict[str, str]]] = {}
    state: dict[str, httpx.AsyncClient] = {}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(base_url=llm_url, timeout=120, limits=limits) as client:
            state["client"] = client
            yield

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/api/v1/process_message")
    async def process_message(body: ProcessMessageRequest) -> EventSourceResponse:
        messages = history.setdefault(body.session_id, [{"role": "system", "content": SYSTEM}])
        messages.append({"role": "user", "content": body.message})
        request = {"model": MODEL, "messages": messages, "stream": True}

        async def events() -> AsyncIterator[ServerSentEvent]:
            parts: list[str] = []
            failed = ""
            async with state["client"].stream("POST", "/chat/completions", json=request) as r:
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk: dict[str, Any] = json.loads(line[6:])  # the one decode per model chunk
                    for choice in chunk.get("choices") or ():
                        delta = choice.get("delta") or {}
                        if delta.get("tool_calls"):
                            failed = "the relay runs no tools"
                        text = delta.get("content")
                        if text:
                            ev = TextChunk(content=text, chunk_index=len(parts))
                            parts.append(text)
                            yield ServerSentEvent(event=ev.EVENT, data=ev.sse_data())
            if failed:
                err = ErrorEvent(error_code="unsupported", message=failed)
                yield ServerSentEvent(event=err.EVENT, data=err.sse_data())
            answer = "".join(parts)
            messages.append({"role": "assistant", "content": answer})
            final = TextFinal(content=answer)
            yield ServerSentEvent(event=final.EVENT, data=final.sse_data())
            yield ServerSentEvent(event=Done.EVENT, data=Done().sse_data())

        return EventSourceResponse(events(), ping=0, headers={"Cache-Control": "no-cache"})

    return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llm-url", required=True, help="the model's OpenAI-compatible base URL (.../v1)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    a = p.parse_args()
    # served as the graph is: one uvicorn worker, its defaults (uvloop, httptools), no access log
    uvicorn.run(
        create_app(a.llm_url),
        host=a.host,
        port=a.port,
        access_log=False,
        log_level=os.environ.get("LOG_LEVEL", "warning").lower(),
        timeout_graceful_shutdown=10,
    )


if __name__ == "__main__":
    main()
