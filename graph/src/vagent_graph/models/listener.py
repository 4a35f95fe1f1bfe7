"""Who reads a model call's answer as it streams: the model node's AnswerStream
(workflow/answer_stream.py), set around the call with `listening`.

Two parts below the node need it and are handed nothing by LangChain: the chat model's
`_astream` (lean_stream.py: each chunk goes to the listener as a plain delta) and the model's
HTTP connection (read_pacing.py: once the listener has shown text, the socket is read once per
window). So the node sets it in a ContextVar, in its own task, for the one call it makes; a
call outside a model node (embeddings, a test's bare model) has none.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol

from langchain_core.outputs import ChatGenerationChunk


class AnswerListener(Protocol):
    """A model call's answer stream (AnswerStream), as the model and its reads use it."""

    @property
    def window(self) -> float:
        """Seconds between two sends of the answer's text (STREAM_COALESCE_MS)."""

    @property
    def shown(self) -> bool:
        """Visible text has gone out (from now on, reads are paced)."""

    @property
    def due(self) -> float:
        """When held text may go out next (time.monotonic()); a read waits for it, so what it
        brings goes out at once instead of a window later."""

    def delta(self, text: str, *, tool_call: bool, reasoning: bool) -> None:
        """One model chunk: its text, whether it carries a tool call, whether it reasons."""

    def told(self, chunk: ChatGenerationChunk) -> None:
        """`chunk` is the whole answer, already given delta by delta: not to be told again."""


_LISTENER: ContextVar[AnswerListener | None] = ContextVar("vagent_answer_listener", default=None)


@contextmanager
def listening(listener: AnswerListener | None) -> Iterator[None]:
    """Model calls made inside this block (in this task) stream their answer to `listener`."""
    token = _LISTENER.set(listener)
    try:
        yield
    finally:
        _LISTENER.reset(token)


def current_listener() -> AnswerListener | None:
    """The listener of the model call running in this task, if any."""
    return _LISTENER.get()
