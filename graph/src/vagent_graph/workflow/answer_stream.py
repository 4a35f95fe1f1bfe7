"""A model call's answer text, as the person reads it: streamed chunks coalesced per
STREAM_COALESCE_MS window into LangGraph's custom stream (`get_stream_writer`), the first
text at once. The turn (turn/events.py) maps these items to SSE events; the AIMessage for
the checkpoint is built once, at the call's end, by LangChain."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessageChunk
from langchain_core.outputs import ChatGenerationChunk, GenerationChunk
from langgraph.types import StreamWriter

from vagent_graph.models.reasoning import REASONING_MARK, ThinkFilter
from vagent_graph.models.text import text_of

#: A piece arriving this close to its window's end goes out with it (seconds): timers and
#: paced reads (models/read_pacing.py) wake up to a few ms early, and holding the text a whole
#: window more for that would halve the rate at which a person sees the answer grow.
SLACK = 0.005


@dataclass
class Coalescer:
    """One model call's streamed text -> the pieces to send (pure: the caller says when).

    `feed` returns what to send now: before any visible text, every piece at once (first-token
    latency never grows); after it, "" until `window` seconds have passed since the last piece
    sent, then everything held (checked as pieces arrive). `flush` sends what is held (at a
    tool call, at the end of the call). `<think>` blocks are cut first (`ThinkFilter`), so a
    block split across windows is never sent; the held text is joined, never split, so a
    character (or a combining sequence, an emoji) cut between model chunks arrives whole."""

    window: float
    think: ThinkFilter = field(default_factory=ThinkFilter)
    #: Visible text has been sent (the coalescing applies from then on).
    shown: bool = False
    _held: list[str] = field(default_factory=list)
    _due: float = 0.0

    def feed(self, piece: str, now: float) -> str:
        if self.shown and self.window > 0:
            self._held.append(piece)
            if now + SLACK < self._due:
                return ""
            piece = "".join(self._held)
            self._held.clear()
        return self._sent(self.think.feed(piece), now)

    def flush(self, now: float, *, last: bool = False) -> str:
        """Everything held, now; `last`: the message is over, so a held partial tag is text."""
        piece = "".join(self._held)
        self._held.clear()
        visible = self.think.feed(piece) if piece else ""
        if last:
            visible += self.think.flush()
        return self._sent(visible, now)

    @property
    def thinking(self) -> bool:
        """Inside a `<think>` block."""
        return self.think.inside

    @property
    def due(self) -> float:
        """When held text may go out next (the clock `feed` is given; 0.0 before any send)."""
        return self._due

    def _sent(self, visible: str, now: float) -> str:
        if visible:
            self.shown = True
            self._due = now + self.window
        return visible


class AnswerStream(BaseCallbackHandler):
    """One model call's streamed chunks -> `custom` stream items, coalesced (outbox.Coalescer):
    `{"type": "text", "content"}` (visible text: the first at once, then one per window) and
    `{"type": "thinking"}` (the model reasons before any visible text; once).

    A callback handler on the call (inline: no task, no thread per chunk) so the call stays
    `ainvoke` and LangChain builds the AIMessage for the checkpoint once, at its end. An
    OpenAI-compatible model gives it each chunk as a plain `delta` (models/lean_stream.py);
    the offline model's chunks come through `on_llm_new_token`. The caller must `close()` it
    however the call ends: what is held is sent then.
    `last_chunk`: when the last chunk came (time.monotonic), for the call's StallGuard."""

    run_inline = True

    def __init__(self, write: StreamWriter, window: float) -> None:
        self.last_chunk = time.monotonic()
        #: When the first chunk came (time.perf_counter): the call's time to first token.
        self.first_chunk: float | None = None
        self._write = write
        self._coalescer = Coalescer(window)
        self._thinking_sent = False
        self._last: object = None

    def on_llm_new_token(
        self,
        token: str | list[str | dict[str, Any]],
        *,
        chunk: GenerationChunk | ChatGenerationChunk | None = None,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        """A streamed chunk from LangChain's per-chunk path (the offline model, or a call
        models/lean_stream.py leaves to langchain-openai)."""
        if not isinstance(chunk, ChatGenerationChunk) or chunk is self._last:
            return  # the same chunk told twice, or the whole answer already given by deltas
        self._last = chunk
        message = chunk.message
        content = message.content
        self.delta(
            content if isinstance(content, str) else text_of(message),
            tool_call=isinstance(message, AIMessageChunk) and bool(message.tool_call_chunks),
            reasoning=bool(message.additional_kwargs.get(REASONING_MARK)),
        )

    def delta(self, text: str, *, tool_call: bool, reasoning: bool) -> None:
        """One model chunk (models/listener.py's AnswerListener): its visible text, whether
        a tool call starts or goes on in it, whether the model reasons in it."""
        self.last_chunk = now = time.monotonic()  # all the stall guard needs per chunk
        if self.first_chunk is None:
            self.first_chunk = time.perf_counter()
        coalescer = self._coalescer
        if tool_call:
            self._send(coalescer.flush(now))  # the text before the tool call, now
        if text:
            self._send(coalescer.feed(text, now))
        if not coalescer.shown and not self._thinking_sent and (coalescer.thinking or reasoning):
            self._thinking_sent = True
            self._write({"type": "thinking"})

    def told(self, chunk: ChatGenerationChunk) -> None:
        """`chunk` holds the whole answer, already given by `delta`: on_llm_new_token skips it."""
        self._last = chunk

    @property
    def window(self) -> float:
        """Seconds between two sends of the text (models/read_pacing.py paces reads by it)."""
        return self._coalescer.window

    @property
    def shown(self) -> bool:
        """Visible text has gone out (from then on, the model's socket is read paced)."""
        return self._coalescer.shown

    @property
    def due(self) -> float:
        """When held text may go out next (time.monotonic()): the paced reads wait for it."""
        return self._coalescer.due

    def close(self) -> None:
        """The call ended (answered, failed or cancelled): send what is held."""
        self._send(self._coalescer.flush(time.monotonic(), last=True))

    def _send(self, text: str) -> None:
        if text:
            self._write({"type": "text", "content": text})
