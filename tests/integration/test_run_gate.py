"""A run's gate (runner.Run.gate): the session lock, taken while the graph prepares. A run
never reads a session it could not lock, a failed prelude fails the run and not the
request, and when the caller gives up, the lock it took is its own to release. Real
Redis, the real compiled workflow, the scripted LLM."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from tests.support.factories import ac, new_session
from tests.support.graph_runtime import scripted_runtime
from tests.support.llm_server import ScriptedLLMServer
from vagent_graph.app import Runtime, run_config
from vagent_graph.runner import Run
from vagent_graph.session_lock import SessionBusy, SessionLock
from vagent_graph.storage import checkpoint_key
from vagent_graph.workflow import new_turn_input
from vagent_shared import redis_keys
from vagent_shared.events import ErrorEvent, SSEEvent, TextChunk


@pytest.fixture
async def runtime(redis_url: str, llm_server: ScriptedLLMServer, tmp_path: Path) -> AsyncIterator[Runtime]:
    async with scripted_runtime(redis_url, llm_server.base_url, tmp_path) as rt:
        yield rt


@pytest.fixture
async def loop_errors() -> list[dict[str, Any]]:
    """What the loop reports on its own (e.g. "Future exception was never retrieved")."""
    errors: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, ctx: errors.append(ctx))
    return errors


def gate_for(rt: Runtime, sid: str) -> Any:
    async def gate() -> SessionLock:
        return await SessionLock.acquire(rt.redis, sid, 60, checkpoint_key(rt.checkpointer, sid), 60)

    return gate


def new_run(rt: Runtime, sid: str, gate: Any, prelude: Any = None) -> Run:
    return Run(
        rt.graph, new_turn_input("hi", ac(superuser=True)), run_config(sid), 30, gate=gate, prelude=prelude
    )


async def events_of(run: Run) -> list[SSEEvent]:
    return [ev async for batch in run.batches() for ev in batch]


async def lock_holder(redis: Redis, sid: str) -> Any:
    return await redis.get(redis_keys.session_lock(sid))


async def test_an_open_gate_runs_the_turn_with_the_lock_held(
    runtime: Runtime, llm_server: ScriptedLLMServer
) -> None:
    llm_server.push_text("Hello there.")
    sid = new_session().format()
    run = new_run(runtime, sid, gate_for(runtime, sid))
    lock = await run.gate
    assert run.gate_opened and (await lock_holder(runtime.redis, sid)).decode() == lock.token
    events = await events_of(run)
    assert "".join(e.content for e in events if isinstance(e, TextChunk)) == "Hello there."
    await lock.release()


async def test_a_refused_gate_raises_and_the_graph_never_reads_or_calls_the_llm(
    runtime: Runtime, llm_server: ScriptedLLMServer, loop_errors: list[dict[str, Any]]
) -> None:
    sid = new_session().format()
    held = await SessionLock.acquire(runtime.redis, sid, 60)  # another run has the session
    run = new_run(runtime, sid, gate_for(runtime, sid))
    with pytest.raises(SessionBusy):
        await run.gate
    assert not run.gate_opened
    await run.close()
    await asyncio.sleep(0.05)
    assert llm_server.requests == []
    assert (await lock_holder(runtime.redis, sid)).decode() == held.token  # untouched
    await held.release()
    del run
    gc.collect()
    assert loop_errors == []


async def test_a_failed_prelude_fails_the_run_with_an_error_event_not_the_request(
    runtime: Runtime, llm_server: ScriptedLLMServer, loop_errors: list[dict[str, Any]]
) -> None:
    async def prelude(lock: SessionLock) -> None:
        raise RuntimeError("the stale question could not be closed")

    sid = new_session().format()
    run = new_run(runtime, sid, gate_for(runtime, sid), prelude)
    lock = await run.gate  # the caller gets its stream...
    events = await events_of(run)  # ...which says the run failed
    assert [type(e) for e in events] == [ErrorEvent]
    assert llm_server.requests == []  # nothing of the session was read, nothing asked
    await lock.release()
    gc.collect()
    assert loop_errors == []


async def test_a_caller_that_gives_up_during_the_prelude_keeps_the_lock_to_release(
    runtime: Runtime, llm_server: ScriptedLLMServer, loop_errors: list[dict[str, Any]]
) -> None:
    started = asyncio.Event()

    async def prelude(lock: SessionLock) -> None:
        started.set()
        await asyncio.Event().wait()

    sid = new_session().format()
    run = new_run(runtime, sid, gate_for(runtime, sid), prelude)
    lock = await run.gate
    await started.wait()
    await run.close()  # the client went away while a stale question was being closed
    assert run.gate_opened and run.gate.result() is lock
    assert (await lock_holder(runtime.redis, sid)).decode() == lock.token
    await lock.release()
    assert await lock_holder(runtime.redis, sid) is None
    assert llm_server.requests == []
    gc.collect()
    assert loop_errors == []
