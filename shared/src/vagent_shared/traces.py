"""The TurnTrace contract: what one turn did, why the agent answered what it answered
(docs/traces.md). The graph writes it; the bot (🔍 / `!why`), `vagent trace` and
`/admin/v1/traces` read it. Stored in Redis as JSON under `redis_keys.trace_turn`.

Nothing here is secret: tool arguments are scrubbed as the audit trail scrubs them
(`vagent_shared.audit.scrub`), free text left out, no prompt or answer text is kept (only the
start of the asker's message, `question`: one line, at most QUESTION_CHARS, secret-looking
parts masked, so `vagent trace list` says which question a turn answered), and the documents
named are those the asker may read. Each tool call and source carries its `scope`: what
decides who may be told about it. The bot's account judges it against whoever reads the
room when the account is asked for (people join rooms after a turn), not the turn's readers.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final, Literal

import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vagent_shared.readers import ResultScope
from vagent_shared.secrets import mask_secrets

log = structlog.get_logger(__name__)

TurnOutcome = Literal["answered", "asked", "denied", "failed", "cancelled", "over_budget"]
ToolOutcome = Literal["ok", "error", "denied", "asked", "declined", "cancelled", "refused"]


#: The most of the asker's message a trace keeps (`TurnTrace.question`).
QUESTION_CHARS: Final = 80
#: What stands in a trace's question for a part that looks like a secret.
QUESTION_MASK: Final = "[REDACTED]"


def _now() -> datetime:
    return datetime.now(UTC)


def question_line(message: str) -> str:
    """What a trace keeps of the message a turn answers (pure): one line (whitespace runs,
    line breaks included, become one space), secret-looking parts masked, then cut to
    QUESTION_CHARS. Masked before the cut (a key cut short may no longer look like one) and
    after it (a cut may leave a shorter run that does), so no secret survives either way."""
    flat = " ".join(message.split())
    return mask_secrets(mask_secrets(flat, QUESTION_MASK)[:QUESTION_CHARS], QUESTION_MASK)[:QUESTION_CHARS]


class LlmCallTrace(BaseModel):
    """One model call, with the usage the provider reported (None: it reported none)."""

    model_config = ConfigDict(extra="ignore")

    model: str
    #: `tools`: the model chose tool calls; `answer`: it wrote the final answer.
    purpose: Literal["answer", "tools"] = "answer"
    input_tokens: int | None = None
    output_tokens: int | None = None
    first_token_ms: float | None = None
    duration_ms: float = 0.0
    finish_reason: str | None = None
    started_at: datetime = Field(default_factory=_now)


class ToolCallTrace(BaseModel):
    """One tool call the model made, and what became of it."""

    model_config = ConfigDict(extra="ignore")

    name: str
    #: The model's id of the call: a call asked about is updated by its resume, not repeated.
    call_id: str = ""
    #: `builtin`, `mcp:<server>`, or `unknown` (a tool the registry does not know).
    source: str = "builtin"
    #: The access decision at invocation (`allowed` / `denied`).
    decision: Literal["allowed", "denied"] = "allowed"
    #: Scrubbed (vagent_graph.observability.trace_arguments): the audit trail's rule, and no free text
    #: (any string the tool's schema does not make a choice or a date) unless
    #: OTEL_CAPTURE_CONTENT; capped.
    arguments: dict[str, Any] = Field(default_factory=dict)
    confirmation_asked: bool = False
    #: When the (latest) question for this call was asked.
    asked_at: datetime | None = None
    #: `yes`/`no`/other words, once answered.
    confirmation_answer: str | None = None
    confirmation_seconds: float | None = None
    credential_used: bool = False
    duration_ms: float = 0.0
    outcome: ToolOutcome = "ok"
    result_chars: int = 0
    #: The turn's own judgement: its readers then could be told about it. Written for a bot
    #: of the previous version (a rolling upgrade); this version judges `scope` instead.
    room_may_see: bool = True
    #: What its result was derived from (documents, entities, the asker's personal data): who
    #: may be told about the call. None: stored by a version that did not record it.
    scope: ResultScope | None = None
    started_at: datetime = Field(default_factory=_now)


class SourceTrace(BaseModel):
    """A document, entity or file the turn used (ids and titles the asker may read)."""

    model_config = ConfigDict(extra="ignore")

    kind: Literal["document", "entity", "file"]
    id: str
    title: str = ""
    #: As ToolCallTrace's: the turn's own judgement, for a bot of the previous version.
    room_may_see: bool = True
    #: The document or entity with what decides who may read it. None: a file (the asker's
    #: own message in the room), or stored by a version that did not record it.
    scope: ResultScope | None = None


class MemoryTrace(BaseModel):
    """A memory the turn recalled: which one, when and where it was written."""

    model_config = ConfigDict(extra="ignore")

    id: str
    created_at: datetime
    room_id: str = ""


class TurnTrace(BaseModel):
    """One turn: from the user's message to the answer (or the question, or the refusal).
    A turn paused on a confirmation continues in the same trace when it is answered."""

    model_config = ConfigDict(extra="ignore")

    turn_id: str
    session_id: str
    user_id: str
    tenant: str = ""
    #: The room's other readers were part of the turn (a group room): the audience rule.
    group: bool = False
    #: OpenTelemetry trace ids (hex) of the requests of this turn (a resume is its own).
    otel_trace_ids: list[str] = Field(default_factory=list)
    #: The start of the message the turn answers (`question_line`: one line, at most
    #: QUESTION_CHARS, secrets masked; files alone: their names); a resume keeps the asking
    #: turn's. Empty: stored by a version that did not record it.
    question: str = ""
    #: Matrix event ids of the bot's messages for this turn (answer, question), set by the bot.
    event_ids: list[str] = Field(default_factory=list)
    started_at: datetime = Field(default_factory=_now)
    ended_at: datetime | None = None
    outcome: TurnOutcome = "answered"
    total_ms: float = 0.0
    first_token_ms: float | None = None
    llm_calls: list[LlmCallTrace] = Field(default_factory=list)
    tool_calls: list[ToolCallTrace] = Field(default_factory=list)
    sources: list[SourceTrace] = Field(default_factory=list)
    #: The memories given to the model in this turn (docs/memory.md): ids, dates and rooms,
    #: never their text (a forgotten memory must not live on in a trace).
    memories: list[MemoryTrace] = Field(default_factory=list)
    #: A short reason for `denied`/`failed`/`over_budget` (an error code, never details).
    reason: str = ""

    @property
    def input_tokens(self) -> int:
        return sum(c.input_tokens or 0 for c in self.llm_calls)

    @property
    def output_tokens(self) -> int:
        return sum(c.output_tokens or 0 for c in self.llm_calls)


def stored_trace(raw: bytes | str | None) -> TurnTrace | None:
    """A trace as Redis holds it (`redis_keys.trace_turn`); None when missing or not a
    TurnTrace (expired, forgotten, written by another version): skipped, never an error."""
    if not raw:
        return None
    try:
        return TurnTrace.model_validate_json(raw)
    except ValidationError:
        log.warning("trace_unreadable")
        return None
