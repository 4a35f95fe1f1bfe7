"""The stall watchdog of a streamed model call (stall_guard.py): it ends a call after the
limit of silence (the first chunk's wait too), never while chunks keep coming, and costs no
timer, handle or task per chunk."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from vagent_graph.models.stall_guard import ModelStalled, StallGuard, on_attempt
from vagent_graph.turn.events import error_event_for

pytestmark = pytest.mark.timeout(30)


@dataclass
class Chunks:
    """What AnswerStream is to the guard: the time of the last chunk."""

    last_chunk: float = field(default_factory=time.monotonic)

    def chunk(self) -> None:
        self.last_chunk = time.monotonic()


async def stream(chunks: Chunks, count: int, every: float) -> None:
    """A model sending `count` chunks `every` seconds apart."""
    for _ in range(count):
        await asyncio.sleep(every)
        chunks.chunk()


async def test_silence_ends_the_call_after_the_limit_as_a_timeout() -> None:
    chunks = Chunks()
    started = time.monotonic()
    with pytest.raises(ModelStalled) as stalled:
        async with StallGuard(0.3, chunks) as guard:
            await asyncio.sleep(10)  # a model that never sends its first chunk
    elapsed = time.monotonic() - started
    assert 0.3 <= elapsed < 1.0 and guard.stalled
    assert isinstance(stalled.value, TimeoutError)
    event = error_event_for(stalled.value)  # what the user reads, as for any LLM timeout
    assert event.error_code == "timeout" and event.message == "The answer took too long and was stopped."


async def test_chunks_that_keep_coming_are_never_stopped() -> None:
    chunks = Chunks()
    started = time.monotonic()
    async with StallGuard(0.3, chunks) as guard:
        await stream(chunks, 12, 0.1)  # 1.2 s in all, four times the limit
    assert time.monotonic() - started >= 1.2 and not guard.stalled


async def test_the_silence_is_counted_from_the_last_chunk() -> None:
    chunks = Chunks()
    async with asyncio.timeout(5):
        with pytest.raises(ModelStalled):
            async with StallGuard(0.3, chunks):
                await stream(chunks, 5, 0.1)
                stopped = time.monotonic()
                await asyncio.sleep(10)  # then only keep-alives: no chunk
    assert 0.3 <= time.monotonic() - stopped < 0.8


async def test_each_http_attempt_restarts_the_wait_for_the_first_chunk() -> None:
    chunks = Chunks()
    with pytest.raises(ModelStalled):
        async with StallGuard(0.4, chunks):
            for _ in range(3):  # the SDK's retries, each sent within the limit
                await asyncio.sleep(0.25)
                await on_attempt(object())
            attempted = time.monotonic()
            await asyncio.sleep(10)
    assert 0.4 <= time.monotonic() - attempted < 0.9
    await on_attempt(object())  # outside a guarded call: nothing to touch, no error


async def test_a_cancellation_from_outside_stays_a_cancellation() -> None:
    chunks = Chunks()

    async def call() -> None:
        async with StallGuard(0.3, chunks):
            await asyncio.sleep(10)

    task = asyncio.create_task(call())
    await asyncio.sleep(0.05)
    task.cancel()  # a stop, or the client went away
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_error_of_the_call_passes_through_and_the_timer_is_gone() -> None:
    chunks = Chunks()
    with pytest.raises(ConnectionError):
        async with StallGuard(0.2, chunks):
            raise ConnectionError("stream broke")
    await asyncio.sleep(0.4)  # the disarmed timer would fire here, into nothing
    task = asyncio.current_task()  # never cancelled by it
    assert task is not None and not task.cancelling()


def test_the_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="> 0"):
        StallGuard(0, Chunks())


# ---- the cost per chunk -------------------------------------------------------------------------


def counting(calls: list[Any], method: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[1] if len(args) > 1 else args[0])  # the callback (a task's coroutine)
        return method(*args, **kwargs)

    return wrapper


@pytest.fixture
async def scheduled(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every timer handle and task the running loop creates: their callbacks (a task: its
    coroutine). asyncio's call_later is a call_at, so each timer counts once."""
    loop = asyncio.get_running_loop()
    calls: list[Any] = []
    monkeypatch.setattr(loop, "call_at", counting(calls, loop.call_at))
    monkeypatch.setattr(loop, "create_task", counting(calls, loop.create_task))
    return calls


async def test_a_thousand_chunks_create_no_timer_handle_or_task(scheduled: list[Any]) -> None:
    chunks = Chunks()
    before = len(scheduled)  # the test's own task
    async with StallGuard(30, chunks) as guard:
        armed = scheduled[before:]
        for _ in range(1000):
            chunks.chunk()
            await asyncio.sleep(0)  # the loop runs between chunks, as with a real stream
        assert scheduled[before:] == armed  # nothing per chunk
    assert armed == [guard._check]  # one timer for the whole call


async def test_a_paced_stream_re_arms_the_timer_at_most_once_per_limit(scheduled: list[Any]) -> None:
    chunks = Chunks()
    limit = 0.1
    started = time.monotonic()
    async with StallGuard(limit, chunks) as guard:
        await stream(chunks, 100, 0.01)  # ~1 s of chunks (each sleep is a handle of its own)
    elapsed = time.monotonic() - started
    armed = [c for c in scheduled if c == guard._check]
    assert not guard.stalled and 1 <= len(armed) <= elapsed / limit + 2
