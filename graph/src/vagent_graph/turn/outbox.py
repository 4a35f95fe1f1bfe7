"""When the next SSE write may go out: a run's events coalesced into few writes.

Each write is a syscall, a TCP segment and a wake-up of the reader. At one write per LLM
token that was most of the service's own CPU per request (bench-graph: 21 writes for a
20-token answer). So once the first text is out, further text chunks wait up to the flush
interval and leave together; everything a user is waiting for (the first text, progress,
a question, the final answer, an error, the end of the run) leaves at once and takes
whatever waits with it. Every event keeps its own SSE frame: only the number of writes
changes, never the events.

Fewer events too: the model node hands the answer's text to the stream coalesced
(workflow/answer_stream.py, `Coalescer`): the first visible text at once, later text once
per STREAM_COALESCE_MS window, so one `text_chunk` carries all the model chunks of its window
(bench/README.md: per model chunk, an event built, mapped, queued and encoded was most of the
graph's CPU per turn).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from vagent_shared.events import TextChunk


@dataclass(frozen=True)
class Pacing:
    """How a stream's writes are paced (see Outbox): seconds a later text chunk may wait
    for the next write, and seconds of silence before a keep-alive (None: never)."""

    flush_interval: float = 0.0
    keepalive: float | None = None


def may_wait(item: Any, text_sent: bool) -> bool:
    """Only a text chunk after the first may wait for the next write."""
    return text_sent and isinstance(item, TextChunk)


def write_now(item: Any, *, text_sent: bool, now: float, next_write: float) -> bool:
    """Should putting `item` release a write? (`next_write`: when the interval since the
    previous write is over.)"""
    return not may_wait(item, text_sent) or now >= next_write


class Outbox:
    """The queue between a run (`put`, never blocks) and its stream (`take`, one write's
    worth). `interval` 0 releases every item as soon as it is put. After `keepalive`
    seconds without a write, `take` returns nothing: time for a keep-alive comment, so
    proxies keep a stream open while a tool or a slow model takes its time."""

    def __init__(self, interval: float, keepalive: float | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._interval = interval
        self._keepalive = keepalive
        self._items: list[Any] = []
        self._ready = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._text_sent = False
        self._next_write = 0.0

    def put(self, item: Any) -> None:
        self._items.append(item)
        due = write_now(item, text_sent=self._text_sent, now=self._loop.time(), next_write=self._next_write)
        self._text_sent = self._text_sent or isinstance(item, TextChunk)
        if self._ready.is_set():  # a write is due anyway: the item goes with it
            return
        if due:
            self._release()
        elif self._timer is None:
            self._timer = self._loop.call_at(self._next_write, self._release)

    def _release(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._ready.set()

    async def take(self) -> list[Any]:
        """Everything put since the previous take, once a write is due ([]: keep-alive)."""
        if self._keepalive is not None and not self._ready.is_set():
            ping = self._loop.call_later(self._keepalive, self._ready.set)
            try:
                await self._ready.wait()
            finally:
                ping.cancel()
        else:
            await self._ready.wait()
        self._ready.clear()
        items, self._items = self._items, []
        self._next_write = self._loop.time() + self._interval
        return items

    def close(self) -> None:
        """No more takes: drop a pending timer."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
