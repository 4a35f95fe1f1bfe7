"""When a stream's next write goes out (vagent_graph.turn.outbox): the first text and everything a
user waits for at once, later text chunks together."""

from __future__ import annotations

import asyncio

import pytest

from vagent_graph.turn.outbox import Outbox, may_wait, write_now
from vagent_shared.events import ErrorEvent, HitlRequest, Progress, TextChunk, TextFinal

END = object()  # what the runner puts last


def chunk(i: int) -> TextChunk:
    return TextChunk(content=f"w{i} ", chunk_index=i)


URGENT = [
    Progress(content="Running database_query..."),
    HitlRequest(question="Delete 3 records?", options=["yes", "no"], timeout_seconds=60, interrupt_id="i1"),
    TextFinal(content="done", is_final=True),
    ErrorEvent(error_code="timeout", message="too long"),
    END,
]


def test_only_text_after_the_first_text_may_wait() -> None:
    assert not may_wait(chunk(0), text_sent=False)  # the first text: at once
    assert may_wait(chunk(1), text_sent=True)
    for item in URGENT:
        assert not may_wait(item, text_sent=True), item


def test_a_waiting_chunk_goes_once_the_interval_is_over() -> None:
    assert not write_now(chunk(3), text_sent=True, now=10.0, next_write=10.05)
    assert write_now(chunk(3), text_sent=True, now=10.05, next_write=10.05)
    for item in URGENT:  # never held back, even within the interval
        assert write_now(item, text_sent=True, now=10.0, next_write=99.0)


async def take_now(box: Outbox) -> list[object] | None:
    """What a write would carry right now (None: no write is due)."""
    try:
        return await asyncio.wait_for(box.take(), timeout=0.01)
    except TimeoutError:
        return None


async def test_first_text_at_once_then_chunks_ride_along_with_the_final_answer() -> None:
    box = Outbox(interval=3600)  # no timer will ever release the chunks
    box.put(chunk(0))
    assert await take_now(box) == [chunk(0)]
    for i in range(1, 20):
        box.put(chunk(i))
    assert await take_now(box) is None  # held: the interval since the last write is not over
    final = TextFinal(content="all of it", is_final=True)
    box.put(final)
    assert await take_now(box) == [*(chunk(i) for i in range(1, 20)), final]  # one write, in order
    box.put(END)
    assert await take_now(box) == [END]


@pytest.mark.parametrize("urgent", URGENT, ids=lambda e: getattr(e, "EVENT", "end"))
async def test_anything_but_text_takes_the_waiting_chunks_along_at_once(urgent: object) -> None:
    box = Outbox(interval=3600)
    box.put(chunk(0))
    await box.take()
    box.put(chunk(1))
    box.put(urgent)
    assert await take_now(box) == [chunk(1), urgent]


async def test_a_lone_waiting_chunk_is_released_by_the_timer() -> None:
    box = Outbox(interval=0.02)
    box.put(chunk(0))
    await box.take()
    box.put(chunk(1))  # the LLM then goes quiet: nothing else will come for a while
    assert await asyncio.wait_for(box.take(), timeout=5) == [chunk(1)]


async def test_interval_zero_releases_every_item_as_it_is_put() -> None:
    box = Outbox(interval=0)
    for i in range(5):
        box.put(chunk(i))
        assert await take_now(box) == [chunk(i)]


async def test_a_reader_that_falls_behind_gets_everything_in_one_write() -> None:
    box = Outbox(interval=0)
    for i in range(5):
        box.put(chunk(i))
    assert await take_now(box) == [chunk(i) for i in range(5)]


async def test_close_drops_the_pending_timer() -> None:
    box = Outbox(interval=0.02)
    box.put(chunk(0))
    await box.take()
    box.put(chunk(1))
    box.close()
    await asyncio.sleep(0.05)
    assert await take_now(box) is None  # the timer never fired


async def test_nothing_to_say_for_a_while_is_an_empty_take_for_a_keep_alive() -> None:
    box = Outbox(interval=0.05, keepalive=0.02)
    assert await asyncio.wait_for(box.take(), timeout=5) == []
    box.put(chunk(0))  # an event before the keep-alive is due: no empty take
    assert await asyncio.wait_for(box.take(), timeout=5) == [chunk(0)]


async def test_without_keepalive_a_take_waits_for_something() -> None:
    box = Outbox(interval=0)
    assert await take_now(box) is None
