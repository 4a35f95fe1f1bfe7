"""Streaming an answer into Matrix as one message that is edited while the text grows.

First text as a message, then paced edits (m.replace), a final Markdown edit, and extra
messages when the answer is too long. The decisions are pure and live elsewhere: when an
edit may go out (`edit_pacing`), where a long answer is cut (`splitting`), the exact event
content (`event_content`, `rendering`). This module only coordinates them and does the I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import structlog
from nio import AsyncClient

from vagent_bot.answers.edit_pacing import EditThrottle
from vagent_bot.answers.event_content import message_content
from vagent_bot.answers.rendering import progress_line
from vagent_bot.answers.splitting import split_message
from vagent_bot.matrix import client as matrix
from vagent_bot.observability import metrics

log = structlog.get_logger(__name__)
TYPING_MS = 30_000


class Answer:
    """One answer being written into a room: its text so far, the message that shows it, and
    the tasks that keep it up to date (typing notice, paced edits)."""

    def __init__(
        self,
        client: AsyncClient,
        room_id: str,
        *,
        thread_root: str | None,
        reply_to: str | None,
        throttle: EditThrottle,
        hold_seconds: float = 0.0,
    ) -> None:
        self.client, self.room_id = client, room_id
        #: The first text waits this long: an answer complete by then is sent once, unedited.
        self.hold_seconds = hold_seconds
        self._first_timer: asyncio.Task[None] | None = None
        self._finalized = False
        self.thread_root, self.reply_to = thread_root, reply_to
        self.throttle = throttle
        #: Shown before the answer's text and kept in the final message (a voice message's
        #: quoted transcript: what the bot understood).
        self.prefix = ""
        self.text = ""
        self.status: str | None = None
        self.event_id: str | None = None  # the message being edited
        self.first_reply_at: float | None = None
        self._shown = ""  # what the message currently shows
        self._dirty = asyncio.Event()
        self._lock = asyncio.Lock()
        self._flusher: asyncio.Task[None] | None = None
        self._typing: asyncio.Task[None] | None = None
        self.sent_event_ids: list[str] = []

    @property
    def finalized(self) -> bool:
        """The text shown is the final one (or nothing more will be shown)."""
        return self._finalized

    # ---- typing --------------------------------------------------------------------------
    def start_typing(self, after_seconds: float = 0.0) -> None:
        """Typing notice while working; a fast answer needs none (it would only cost requests)."""

        async def keep_typing() -> None:
            with contextlib.suppress(Exception):
                await asyncio.sleep(after_seconds)
                if self.event_id is not None or self._finalized:
                    return
                while True:
                    await self.client.room_typing(self.room_id, True, timeout=TYPING_MS)
                    await asyncio.sleep(TYPING_MS / 1000 - 5)

        self._typing = asyncio.create_task(keep_typing())

    async def stop_typing(self) -> None:
        if self._typing:
            self._typing.cancel()
            self._typing = None
            with contextlib.suppress(Exception):
                await self.client.room_typing(self.room_id, False)

    # ---- content -------------------------------------------------------------------------
    def _render(self) -> str:
        text = self.prefix + self.text if self.text else self.prefix.rstrip()
        if self.status and not text:
            return progress_line(self.status)
        if self.status:
            return f"{text}\n\n{progress_line(self.status)}"
        return text

    async def chunk(self, piece: str) -> None:
        self.text += piece
        self.status = None
        await self._update()

    async def progress(self, status: str) -> None:
        self.status = status
        await self._update()

    async def _update(self) -> None:
        if self.event_id is None:
            if self._first_timer is None:
                self._first_timer = asyncio.create_task(self._first_after_hold())
            return
        self._dirty.set()
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush_loop())

    async def _first_after_hold(self) -> None:
        if self.hold_seconds > 0:
            await asyncio.sleep(self.hold_seconds)
        async with self._lock:
            if self._finalized or self.event_id is not None:
                return
            body = self._render()
            await self._send_first(body)
        if self.event_id is not None and self._render() != body:
            self._dirty.set()
            if self._flusher is None:
                self._flusher = asyncio.create_task(self._flush_loop())

    async def _send_first(self, body: str) -> None:
        content = message_content(
            split_message(body)[0], thread_root=self.thread_root, reply_to=self.reply_to, html=False
        )
        event_id = await matrix.send(self.client, self.room_id, content)
        if event_id:
            self.event_id, self._shown = event_id, body
            self.sent_event_ids.append(event_id)
            self.first_reply_at = time.monotonic()
            self.throttle.start(time.monotonic())

    async def _flush_loop(self) -> None:
        """Edits at the pace the throttle allows, always with the newest text."""
        while True:
            await self._dirty.wait()
            next_at = self.throttle.next_at()
            if next_at is None:  # edit cap reached: only the final edit remains
                return
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            self._dirty.clear()
            body = self._render()
            if body == self._shown or self.event_id is None:
                continue
            async with self._lock:
                await self._edit(body, html=False)

    async def _edit(self, body: str, *, html: bool) -> bool:
        assert self.event_id is not None
        content = message_content(
            split_message(body)[0], thread_root=self.thread_root, replaces=self.event_id, html=html
        )
        event_id, retry_after = await matrix.try_send_once(self.client, self.room_id, content)
        now = time.monotonic()
        if event_id:
            self._shown = body
            self.throttle.sent(now)
            metrics.EDITS.labels("sent").inc()
            return True
        if retry_after is not None:
            self.throttle.rate_limited(now, retry_after)
            metrics.EDITS.labels("rate_limited").inc()
            self._dirty.set()
        return False

    async def final(self, text: str) -> None:
        """The complete answer: a final Markdown edit, then more messages if it is long."""
        await self._stop_flusher()
        self.text, self.status = text, None
        parts = split_message(self.prefix + text if text else self.prefix.rstrip()) or [""]
        async with self._lock:
            self._finalized = True
            if self.event_id is None:
                for part in parts:
                    await self.notice(part)
                return
            for _ in range(5):  # the final edit is not subject to the cap, only to rate limits
                wait = self.throttle.final_at(time.monotonic()) - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if await self._edit(parts[0], html=True):
                    break
            for part in parts[1:]:
                await self.notice(part)

    async def notice(self, text: str) -> str | None:
        """A separate message (question, error, refusal, or the next part of a long answer) in the
        same thread/reply chain."""
        content = message_content(text, thread_root=self.thread_root, reply_to=self.reply_to)
        event_id = await matrix.send(self.client, self.room_id, content)
        if event_id:
            self.sent_event_ids.append(event_id)
            if self.first_reply_at is None:
                self.first_reply_at = time.monotonic()
        return event_id

    async def settle(self) -> None:
        """Before a question or an error: show the text streamed so far as final (with the
        prefix: the quoted transcript stays visible above a question or an error)."""
        if self.text or (self.prefix and not self._finalized):
            await self.final(self.text)
            return
        await self._stop_flusher()
        async with self._lock:
            self._finalized = True  # a held progress line is not worth a message any more

    async def _stop_flusher(self) -> None:
        if self._flusher:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None

    async def close(self) -> None:
        if self._first_timer and not self._first_timer.done():
            self._first_timer.cancel()
        await self._stop_flusher()
        await self.stop_typing()
