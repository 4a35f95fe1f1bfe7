"""What one turn did, recorded while it runs: the TurnRecorder behind a request's run
(vagent_shared.traces.TurnTrace is the record; docs/traces.md).

The recorder travels in the run's config (`configurable["turn"]`, never checkpointed); the
nodes add to it through `turn_of(config)`. Cheap by design: no per-chunk work beyond one
dict lookup when a model call's first chunk arrives (the model call's AnswerStream sees every
chunk anyway), no I/O: the request stores the finished trace once, at its end.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableConfig
from langgraph.config import get_config
from opentelemetry import trace as otel_trace

from vagent_shared.access import AcContext
from vagent_shared.events import ErrorEvent, HitlRequest, SSEEvent, TextFinal
from vagent_shared.knowledge import Audience
from vagent_shared.memory import Memory
from vagent_shared.traces import (
    LlmCallTrace,
    MemoryTrace,
    SourceTrace,
    ToolCallTrace,
    TurnOutcome,
    TurnTrace,
    question_line,
)

CONFIG_KEY = "turn"


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


@dataclass
class TurnRecorder:
    """One request's part of a turn (a resume continues the trace the question left)."""

    trace: TurnTrace
    #: perf_counter() when this request started (timings are of this request).
    started: float = field(default_factory=time.perf_counter)
    _first_chunk: dict[str, float] = field(default_factory=dict)
    _prior_ms: float = 0.0
    _forced: tuple[TurnOutcome, str] | None = None

    @classmethod
    def resumed(cls, trace: TurnTrace) -> TurnRecorder:
        """Continue a stored trace: its time so far counts into the total."""
        return cls(trace=trace, _prior_ms=trace.total_ms)

    # ---- fed by the stream (turn/events.py EventMapper) ----------------------------------
    def chunk_seen(self, message_id: str | None) -> None:
        """A model call's first streamed chunk (text or tool call): its time to first token."""
        if message_id and message_id not in self._first_chunk:
            self._first_chunk[message_id] = time.perf_counter()

    def first_text(self) -> None:
        """The first answer text of the turn reached the stream."""
        if self.trace.first_token_ms is None:
            self.trace.first_token_ms = _ms(time.perf_counter() - self.started) + self._prior_ms

    # ---- fed by the nodes -----------------------------------------------------------------
    def llm_call(
        self, model: str, ai: AIMessage, started: float, ended: float, *, first_chunk: float | None = None
    ) -> LlmCallTrace:
        """A finished model call, with the usage the provider reported; `first_chunk`: when its
        first chunk came (perf_counter), else as the stream saw it (`chunk_seen`)."""
        usage = ai.usage_metadata
        meta = ai.response_metadata or {}
        first = first_chunk if first_chunk is not None else self._first_chunk.get(ai.id or "")
        call = LlmCallTrace(
            model=str(meta.get("model_name") or meta.get("model") or model),
            purpose="tools" if ai.tool_calls else "answer",
            input_tokens=usage["input_tokens"] if usage else None,
            output_tokens=usage["output_tokens"] if usage else None,
            first_token_ms=_ms(first - started) if first is not None and first >= started else None,
            duration_ms=_ms(ended - started),
            finish_reason=str(meta["finish_reason"]) if meta.get("finish_reason") else None,
        )
        self.trace.llm_calls.append(call)
        return call

    def tool_call(self, call: ToolCallTrace) -> None:
        """A tool call's entry; a call asked about before (same call id) is updated in place."""
        for i, known in enumerate(self.trace.tool_calls):
            if call.call_id and known.call_id == call.call_id:
                self.trace.tool_calls[i] = call
                return
        self.trace.tool_calls.append(call)

    def tool_entry(self, call_id: str) -> ToolCallTrace | None:
        """The entry of a call recorded before (the question a resume answers), if any."""
        return next((t for t in self.trace.tool_calls if call_id and t.call_id == call_id), None)

    def source(self, source: SourceTrace) -> None:
        """A document/entity/file the turn used; each once (the first record wins)."""
        if not any(s.kind == source.kind and s.id == source.id for s in self.trace.sources):
            self.trace.sources.append(source)

    def recalled(self, memories: Sequence[Memory]) -> None:
        """The memories given to the model (ids, dates, rooms: never their text); each once."""
        known = {m.id for m in self.trace.memories}
        for m in memories:
            if m.id not in known:
                self.trace.memories.append(MemoryTrace(id=m.id, created_at=m.created_at, room_id=m.room_id))

    def force(self, outcome: TurnOutcome, reason: str = "") -> None:
        """The turn ends as `outcome` whatever the stream shows (e.g. `over_budget`: the
        budget message is a normal final text on the wire)."""
        self._forced = (outcome, reason)

    @property
    def over_budget(self) -> bool:
        """The budget check ended this turn (its text is the budget notice)."""
        return self._forced is not None and self._forced[0] == "over_budget"

    # ---- the end of the request -----------------------------------------------------------
    def finish(self, outcome: TurnOutcome, reason: str = "") -> TurnTrace:
        """Close this request's part: outcome and total time (a resume adds to it)."""
        if self._forced is not None:
            outcome, reason = self._forced
        self.trace.outcome = outcome
        self.trace.reason = reason
        self.trace.total_ms = _ms(time.perf_counter() - self.started) + self._prior_ms
        self.trace.ended_at = datetime.now(UTC)
        return self.trace


def turn_of(config: RunnableConfig) -> TurnRecorder | None:
    """The recorder of the run (None: a run nobody records, e.g. a test's bare graph)."""
    found: Any = config.get("configurable", {}).get(CONFIG_KEY)
    return found if isinstance(found, TurnRecorder) else None


def current_turn() -> TurnRecorder | None:
    """The recorder of the run this code runs in (a tool, a tool call's steps), found through
    LangGraph's run context: tools get no config of their own. None outside a run."""
    try:
        return turn_of(get_config())
    except RuntimeError:  # not inside a graph run (a unit test calling a tool directly)
        return None


def new_trace(
    session_id: str,
    ac: AcContext,
    audience: Audience | None,
    message: str = "",
    files: Sequence[str] = (),
) -> TurnTrace:
    """A new turn's trace: a new id, who asks and what (the start of `message`, secrets
    masked: `question_line`; a message of files alone: their names in brackets), whether
    others read the answer, and the OpenTelemetry trace this request belongs to (if one is
    being recorded). A resume passes no message: an answer to the agent's question is not
    the question the turn answered."""
    trace = TurnTrace(
        turn_id=uuid.uuid4().hex,
        session_id=session_id,
        user_id=ac.user_id,
        tenant=ac.active_acl_domain,
        group=audience is not None and (audience.public_only or bool(audience.members)),
        question=question_line(message if message.strip() else " ".join(f"[{n}]" for n in files)),
    )
    add_otel_trace(trace)
    return trace


def add_otel_trace(trace: TurnTrace) -> None:
    """Note the current OpenTelemetry trace id (hex) on `trace`, once."""
    context = otel_trace.get_current_span().get_span_context()
    if context.is_valid:
        trace_id = otel_trace.format_trace_id(context.trace_id)
        if trace_id not in trace.otel_trace_ids:
            trace.otel_trace_ids.append(trace_id)


def turn_outcome(
    last: SSEEvent | None, error: ErrorEvent | None, trace: TurnTrace
) -> tuple[TurnOutcome, str]:
    """How a request's part of a turn ended, from what its stream said (pure):

    - `failed`: an `error` event (reason: its error code);
    - `cancelled`: no question and no answer went out (the client went away), or the run
      stopped on a question cancelled or declined with nothing said after (an empty answer);
    - `asked`: it ended with a question;
    - `denied`: it answered, but every tool call of the turn was refused (access denied, a
      personal result refused in a group room, no credential) and none ran: the answer says
      it may not, so the turn is on record as a refusal;
    - `answered` otherwise. `over_budget` is forced by the budget check (TurnRecorder.force).
    """
    if error is not None:
        return "failed", error.error_code
    if last is None:
        return "cancelled", "client_gone"
    if isinstance(last, HitlRequest):
        return "asked", ""
    calls = trace.tool_calls
    if isinstance(last, TextFinal) and not last.content.strip():
        if any(c.outcome in ("cancelled", "declined") for c in calls):
            return "cancelled", "question_not_confirmed"
    if calls and all(c.outcome in ("denied", "refused") for c in calls):
        return "denied", "tool_refused"
    return "answered", ""
