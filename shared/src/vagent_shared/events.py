"""Server-Sent Events from the graph to the bot: one model per event type.

On the wire the SSE `event:` field is the model's EVENT name and `data:` its JSON.
Every stream ends with `done`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Event(BaseModel):
    model_config = ConfigDict(extra="ignore")
    EVENT: ClassVar[str]

    def sse_data(self) -> str:
        return self.model_dump_json()


class TextChunk(_Event):
    """A piece of the answer as the LLM produces it."""

    EVENT: ClassVar[str] = "text_chunk"
    content: str
    chunk_index: int = Field(ge=0)


class Progress(_Event):
    """Something is happening that is not answer text (a tool runs)."""

    EVENT: ClassVar[str] = "progress"
    content: str


class HitlAction(BaseModel):
    """One action a confirmation would run, as the question shows it: the tool's name and
    its arguments (secrets already masked, as in the question's text). The gateway offers
    them to LangGraph clients as `action_requests`; the bot shows only the question."""

    model_config = ConfigDict(extra="ignore")
    name: str
    args: dict[str, Any] = Field(default_factory=dict)


class HitlRequest(_Event):
    """The workflow paused and waits for the same user's answer."""

    EVENT: ClassVar[str] = "hitl_request"
    question: str
    options: list[str] = Field(default_factory=list)
    timeout_seconds: int = Field(default=3600, gt=0)
    interrupt_id: str
    #: What "yes" runs (empty for questions that run no tool, e.g. a group-room check).
    actions: list[HitlAction] = Field(default_factory=list)


class TextFinal(_Event):
    """The complete answer text of this run (replaces the streamed chunks)."""

    EVENT: ClassVar[str] = "text_final"
    content: str
    is_final: bool = True


class ErrorEvent(_Event):
    """A short, user-presentable failure; no stack traces or internal ids."""

    EVENT: ClassVar[str] = "error"
    error_code: str
    message: str


class ImageOut(_Event):
    """An image a tool returned, for the bot to post after the answer text (as `m.image`,
    encrypted in an encrypted room). `data` is base64; the graph keeps it under
    TOOL_IMAGE_MAX_BYTES and has checked its type from its bytes."""

    EVENT: ClassVar[str] = "image"
    name: str
    mimetype: str
    data: str
    width: int | None = None
    height: int | None = None


class TurnStarted(_Event):
    """First event of a stream: the turn this request is part of (a resume continues the
    turn that asked). The bot indexes its answer's Matrix event under it, so a 🔍 on the
    answer finds the turn's TurnTrace (vagent_shared.traces)."""

    EVENT: ClassVar[str] = "turn"
    turn_id: str


class Done(_Event):
    """Always the last event of a stream. `outcome` is set when the turn ended other than
    its text shows: `over_budget` (the budget notice is an ordinary final text), so a
    scheduled run over budget is recorded as skipped."""

    EVENT: ClassVar[str] = "done"
    outcome: Literal["over_budget"] | None = None


SSEEvent = TextChunk | Progress | HitlRequest | TextFinal | ImageOut | ErrorEvent | TurnStarted | Done

EVENT_TYPES: dict[str, type[_Event]] = {
    cls.EVENT: cls
    for cls in (TextChunk, Progress, HitlRequest, TextFinal, ImageOut, ErrorEvent, TurnStarted, Done)
}


def parse_sse_event(event: str, data: str) -> SSEEvent:
    """Turn one received SSE event into its model; unknown types raise ValueError."""
    cls = EVENT_TYPES.get(event)
    if cls is None:
        raise ValueError(f"unknown SSE event type {event!r}")
    if not data.strip():
        return cls.model_validate({})  # type: ignore[return-value]
    return cls.model_validate_json(data)  # type: ignore[return-value]


@dataclass(frozen=True)
class RawEvent:
    """One dispatched SSE event before it is parsed into its model."""

    event: str
    data: str


_LINE_END = re.compile(rb"\r\n|\r|\n")


@dataclass
class SSEDecoder:
    """Incremental `text/event-stream` parser (the WHATWG rules the graph's stream needs):
    feed it bytes as they arrive, get the complete events. Pure, so any HTTP client can
    stream through it. Lines end in CRLF, LF or CR; `:` lines are comments (pings);
    several `data:` lines join with newlines; `id` and `retry` are ignored.
    """

    _buf: bytes = b""
    _event: str = ""
    _data: list[str] = field(default_factory=list)
    _started: bool = False
    _after_cr: bool = False  # the last read ended in CR: a LF starting the next belongs to it

    def feed(self, chunk: bytes) -> list[RawEvent]:
        if not chunk:
            return []
        if self._after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        self._after_cr = False
        self._buf += chunk
        out: list[RawEvent] = []
        pos = 0
        for m in _LINE_END.finditer(self._buf):
            self._line(self._buf[pos : m.start()], out)
            pos = m.end()
        self._after_cr = pos > 0 and self._buf[pos - 1 : pos] == b"\r"
        self._buf = self._buf[pos:]
        return out

    def _line(self, raw: bytes, out: list[RawEvent]) -> None:
        line = raw.decode("utf-8", errors="replace")
        if not self._started:
            self._started, line = True, line.removeprefix("\ufeff")
        if not line:
            if self._data:
                out.append(RawEvent(self._event or "message", "\n".join(self._data)))
            self._event, self._data = "", []
            return
        if line.startswith(":"):
            return
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
