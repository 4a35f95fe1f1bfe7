"""A turn that comes with files: read them (each in a process of its own, attachments/), then
the turn's input for the model, or an answer without the model.

Without the model: a file sent alone is kept in the session for its next question (the
HumanMessage that carries it is saved into the history, with a short reply saying so), and
a file that cannot be used ends the turn with one reply naming it and why; nothing is sent
to the model and nothing is kept then. Attachments never enter the organisation's document
index: they live in the session's checkpoint only, and go with it (`!reset`, `vagent admin
forget`, the checkpoint TTL).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from langchain_core.messages import AIMessage, HumanMessage

from vagent_graph.attachments import ReadFile, ReadLimits, Refused, describe, read_attachment, turn_content
from vagent_graph.attachments.messages import FILES_KEY, KEPT_KEY
from vagent_graph.observability import metrics
from vagent_graph.observability.recorder import TurnRecorder
from vagent_graph.turn.events import Reply
from vagent_shared.attachments import Attachment
from vagent_shared.events import Progress, SSEEvent
from vagent_shared.traces import SourceTrace

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class FileReading:
    """How files are read and shown to the model (GraphSettings: ATTACHMENT_*, LLM_VISION)."""

    limits: ReadLimits
    vision: bool
    max_tokens: int


async def read_turn(
    message: str,
    attachments: Sequence[Attachment],
    how: FileReading,
    emit: Callable[[SSEEvent], None],
    turn: TurnRecorder | None = None,
) -> HumanMessage | Reply:
    """The turn's HumanMessage with its files, or the Reply that ends the turn. The turn's
    trace names each file (the asker sent it into the room: its readers saw it)."""
    files: list[ReadFile] = []
    for att in attachments:
        if turn is not None:
            turn.source(SourceTrace(kind="file", id=att.name, title=att.name))
        emit(Progress(content=f"Reading {att.name}…"))
        started = time.perf_counter()
        try:
            read = await read_attachment(att.name, att.data, how.limits)
        except Refused as exc:
            metrics.ATTACHMENTS.labels("refused", "refused").inc()
            log.info("attachment_refused", reason=exc.reason, size=len(att.data))
            return Reply(f"⚠️ I could not use {exc.name}: {exc.reason}")
        metrics.ATTACHMENT_SECONDS.observe(time.perf_counter() - started)
        metrics.ATTACHMENTS.labels(read.kind, "read").inc()
        log.info(
            "attachment_read",
            kind=read.kind,
            mime=read.mime,
            size=read.size,
            worker_peak_rss=read.worker_peak_rss,
        )
        files.append(read)
    human = HumanMessage(
        content=turn_content(message, files, vision=how.vision, max_tokens=how.max_tokens),
        additional_kwargs={FILES_KEY: [file_facts(f) for f in files]},
    )
    if message.strip():
        return human
    kept = f"Got {describe(files)} — what should I do with it?"
    return Reply(kept, keep=[human, AIMessage(content=kept, additional_kwargs={KEPT_KEY: True})])


def file_facts(f: ReadFile) -> dict[str, Any]:
    """What the history keeps about a file beside its content: plain JSON (checkpointed)."""
    facts: dict[str, Any] = {"name": f.name, "mime": f.mime, "kind": f.kind, "size": f.size}
    if f.pages is not None:
        facts["pages"] = f.pages
    if f.kind == "image":
        facts["width"], facts["height"] = f.width, f.height
    return facts
