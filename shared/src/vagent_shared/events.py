"""Server-Sent Events from the graph to the bot: one model per event type.

On the wire the SSE `event:` field is the model's EVENT name and `data:` its JSON.
Every stream ends with `done`.
"""

from __future__ import annotations

import json
from typing import ClassVar

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


class HitlRequest(_Event):
    """The workflow paused and waits for the same user's answer."""

    EVENT: ClassVar[str] = "hitl_request"
    question: str
    options: list[str] = Field(default_factory=list)
    timeout_seconds: int = Field(default=3600, gt=0)
    interrupt_id: str


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


class Done(_Event):
    """Always the last event of a stream."""

    EVENT: ClassVar[str] = "done"


SSEEvent = TextChunk | Progress | HitlRequest | TextFinal | ErrorEvent | Done

EVENT_TYPES: dict[str, type[_Event]] = {
    cls.EVENT: cls for cls in (TextChunk, Progress, HitlRequest, TextFinal, ErrorEvent, Done)
}


def parse_sse_event(event: str, data: str) -> SSEEvent:
    """Turn one received SSE event into its model; unknown types raise ValueError."""
    cls = EVENT_TYPES.get(event)
    if cls is None:
        raise ValueError(f"unknown SSE event type {event!r}")
    payload = json.loads(data) if data.strip() else {}
    return cls.model_validate(payload)  # type: ignore[return-value]
