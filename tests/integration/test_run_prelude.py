"""A run's prelude (event_stream.Run, closing a stale question before a new turn): it runs in the
run's task before the graph, its failure fails the run with an `error` event and not the
request, and a run closed meanwhile (the client went away) stops there, without an LLM
call and without leaving anything behind. Real Redis, the real compiled workflow, the
scripted LLM."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.factories import ac, new_session
from tests.support.graph_runtime import scripted_runtime
from tests.support.llm_server import ScriptedLLMServer
from vagent_graph.observability import metrics
from vagent_graph.resources import Resources
from vagent_graph.turn.events import Prelude, Run
from vagent_graph.workflow.graph import new_turn_input, run_config
from vagent_shared.events import ErrorEvent, SSEEvent, TextChunk


@pytest.fixture
async def runtime(redis_url: str, llm_server: ScriptedLLMServer, tmp_path: Path) -> AsyncIterator[Resources]:
    async with scripted_runtime(redis_url, llm_server.base_url, tmp_path) as rt:
        yield rt


@pytest.fixture
async def loop_errors() -> list[dict[str, Any]]:
    """What the loop reports on its own (e.g. "Future exception was never retrieved")."""
    errors: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, ctx: errors.append(ctx))
    return errors


def new_run(rt: Resources, prelude: Prelude | None) -> Run:
    sid = new_session().format()
    return Run(rt.graph, new_turn_input("hi", ac(superuser=True)), run_config(sid), 30, prelude=prelude)


async def events_of(run: Run) -> list[SSEEvent]:
    return [ev async for batch in run.batches() for ev in batch]


def active_runs() -> float:
    return float(metrics.ACTIVE_RUNS._value.get())


async def test_the_prelude_runs_before_the_graph(runtime: Resources, llm_server: ScriptedLLMServer) -> None:
    llm_server.push_text("Hello there.")
    asked: list[int] = []

    async def prelude() -> None:
        asked.append(len(llm_server.requests))

    events = await events_of(new_run(runtime, prelude))
    assert asked == [0] and len(llm_server.requests) == 1
    assert "".join(e.content for e in events if isinstance(e, TextChunk)) == "Hello there."


async def test_a_failed_prelude_fails_the_run_with_an_error_event_not_the_request(
    runtime: Resources, llm_server: ScriptedLLMServer, loop_errors: list[dict[str, Any]]
) -> None:
    async def prelude() -> None:
        raise RuntimeError("the stale question could not be closed")

    events = await events_of(new_run(runtime, prelude))
    [error] = events
    assert isinstance(error, ErrorEvent) and error.error_code == "internal_error"
    assert llm_server.requests == []  # nothing asked
    gc.collect()
    assert loop_errors == []


async def test_a_run_closed_during_its_prelude_stops_there(
    runtime: Resources, llm_server: ScriptedLLMServer, loop_errors: list[dict[str, Any]]
) -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def prelude() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    before = active_runs()
    run = new_run(runtime, prelude)
    assert active_runs() == before + 1
    await started.wait()
    await run.close()  # the client went away while a stale question was being closed
    await run.close()  # idempotent
    assert cancelled.is_set() and active_runs() == before
    await asyncio.sleep(0.05)
    assert llm_server.requests == []
    gc.collect()
    assert loop_errors == []
