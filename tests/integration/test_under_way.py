"""When a run counts as under way (runner.Run.under_way, upstream.py): the moment the
service sets up its HTTP response, so that set-up overlaps the model's latency."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from langgraph.checkpoint.memory import InMemorySaver

from tests.support.factories import ac, new_session
from tests.support.graph_runtime import scripted_runtime
from tests.support.llm_server import ScriptedLLMServer
from vagent_graph import runner, upstream
from vagent_graph.agent import load_descriptor
from vagent_graph.offline_model import OfflineChatModel
from vagent_graph.runner import Run
from vagent_graph.tools import Services, default_registry
from vagent_graph.tools.records import RecordsDb, ensure_records_db
from vagent_graph.workflow import Deps, build_graph, new_turn_input
from vagent_shared.events import TextChunk


@pytest.fixture
async def graph(redis_url: str, llm_server: ScriptedLLMServer, tmp_path: Path) -> AsyncIterator[Any]:
    """The workflow as the service builds it, on the scripted LLM."""
    async with scripted_runtime(redis_url, llm_server.base_url, tmp_path) as runtime:
        yield runtime.graph


def new_run(graph: Any, thread: str | None = None) -> Run:
    config = {"configurable": {"thread_id": thread or new_session().format()}}
    return Run(graph, new_turn_input("hi", ac(superuser=True)), config, 30)  # type: ignore[arg-type]


async def first_text(run: Run) -> float:
    """Read the run to its end; when its first text arrived (perf_counter)."""
    first = 0.0
    async for batch in run.batches():
        if not first and any(isinstance(e, TextChunk) for e in batch):
            first = time.perf_counter()
    return first


async def test_a_run_is_under_way_as_soon_as_its_llm_request_has_left(
    graph: Any, llm_server: ScriptedLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "UNDER_WAY_AFTER", 60.0)  # only the request can say so
    llm_server.push_text("A slow and thoughtful answer.", chunks=1, delay=1.5)
    start = time.perf_counter()
    run = new_run(graph)
    reading = asyncio.create_task(first_text(run))
    await asyncio.wait_for(asyncio.shield(run.under_way), 1.2)  # well before the first token
    under_way = time.perf_counter()
    first = await reading
    assert len(llm_server.requests) == 1  # the one request that made it so
    assert under_way - start < 1.2 <= first - start


async def test_a_run_without_an_llm_request_is_under_way_with_its_first_event(tmp_path: Path) -> None:
    """The offline model makes no HTTP request: its first event says so instead."""
    ensure_records_db(tmp_path / "records.db")
    deps = Deps(
        default_registry(),
        load_descriptor(),
        OfflineChatModel(),
        "offline",
        Services(RecordsDb(tmp_path / "records.db")),
    )
    run = new_run(build_graph(deps, InMemorySaver()), "t")
    reading = asyncio.create_task(first_text(run))
    await asyncio.wait_for(asyncio.shield(run.under_way), 5)
    assert await reading


class _SilentGraph:
    """A graph that says nothing until it is cancelled (a tool or a connect that hangs)."""

    async def astream(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        await asyncio.Event().wait()
        yield ("messages", None)  # never reached


async def test_a_silent_run_is_under_way_after_a_bounded_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "UNDER_WAY_AFTER", 0.2)
    start = time.perf_counter()
    run = new_run(_SilentGraph(), "t")
    try:
        await asyncio.wait_for(asyncio.shield(run.under_way), 5)
        assert time.perf_counter() - start >= 0.2
    finally:
        await run.close()


async def test_the_trace_hook_only_touches_requests_made_inside_a_run(llm_server: ScriptedLLMServer) -> None:
    seen: list[str] = []

    async def earlier_trace(event: str, info: dict[str, Any]) -> None:
        seen.append(event)

    sent: list[int] = []
    async with httpx.AsyncClient(event_hooks={"request": [upstream.trace_request]}) as client:
        outside = await client.get(llm_server.base_url + "/models", extensions={"trace": earlier_trace})
        assert sent == [] and outside.request.extensions["trace"] is earlier_trace

        async def inside() -> None:
            upstream.notify_sent(lambda: sent.append(len(seen)))
            await client.get(llm_server.base_url + "/models", extensions={"trace": earlier_trace})

        async def untraced() -> httpx.Response:
            upstream.notify_sent(lambda: sent.append(-1))
            return await client.get(llm_server.base_url + "/models")

        await asyncio.create_task(inside())  # a task of its own: its own context, like a run
        plain = await asyncio.create_task(untraced())
    assert sent[0] >= 0 and len(sent) == 2  # once per request, after the body was written...
    assert "http11.send_request_body.complete" in seen[: sent[0]]  # ...and the earlier trace still ran
    # Once sent, the earlier trace is back in place and sees the response's phases...
    assert "http11.receive_response_headers.complete" in seen[sent[0] :]
    # ...and a request that had none is left without one: its response is not traced.
    assert plain.status_code == 200 and "trace" not in plain.request.extensions
    assert upstream._ON_SENT.get() is None  # nothing leaked into this context
