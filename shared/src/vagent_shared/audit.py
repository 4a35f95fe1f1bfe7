"""The audit trail's contract: every access decision is one AuditEvent, written by both
services to the JSON log and to a Redis stream (docs/audit.md).

Pure parts only: the event model, how it is stored in a stream entry, and how tool
arguments are scrubbed before they are recorded. The writer lives in audit_trail.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from vagent_shared.secrets import mask_secrets, secret_name

AuditEventType = Literal[
    "agent_access",  # bot: may this user use the agent at all
    "tool_offered",  # graph: the set of tools the model was shown
    "tool_access",  # graph: one tool invocation allowed or denied
    "rag_query",  # graph: a document search (how many results, never their text)
    "entity_query",  # graph: an entity lookup
    "credential_access",  # graph: a user's credential fetched (never its value)
    "hitl_decision",  # bot: who answered which confirmation, and how
    "access_denied",  # either: a security refusal (forged token, a tool never offered, ...)
    "user_forgotten",  # vagent admin forget: a user's data was erased
    "budget_exceeded",  # graph: a turn refused or stopped because the token budget is spent
    "memory_written",  # graph: a memory stored (its id, never its text)
    "memory_recalled",  # graph: memories given to the model (ids and count)
    "memory_withheld",  # graph: memories not recalled here (count and reason)
    "memory_deleted",  # graph / vagent memory: memories deleted (ids or count, and why)
    "schedule_created",  # graph tool / bot !schedule: a scheduled job stored (its id, never its task text)
    "schedule_run",  # bot: a due run of a job started (job id, due time, outcome)
    "schedule_skipped",  # bot: a due run not made (reason: access, audience, provider down, budget...)
    "schedule_paused",  # bot: a job paused (by its owner, or after too many skipped runs in a row)
    "schedule_deleted",  # bot !unschedule / vagent schedules delete / erasure: jobs deleted (and why)
]
Decision = Literal["allowed", "denied", "error", "approved", "declined", "answered", "expired", "done"]
#: The one field of a stream entry: the event as JSON.
STREAM_FIELD = "event"

MAX_VALUE_CHARS = 200
MAX_ITEMS = 20
#: Argument names whose values are what people wrote (kept only with AUDIT_INCLUDE_CONTENT).
_CONTENT_KEY = re.compile(
    r"^(message|messages|text|body|content|description|question|answer|query|prompt|comment|sql)$",
    re.IGNORECASE,
)
_BEARER = re.compile(r"(?i)(bearer|basic)\s+[A-Za-z0-9._~+/=-]+")
REDACTED = "[REDACTED]"


def now_utc() -> datetime:
    return datetime.now(UTC)


class AuditEvent(BaseModel):
    model_config = ConfigDict(extra="forbid")

    timestamp: datetime = Field(default_factory=now_utc)
    service: str
    user_id: str
    session_id: str | None = None
    domain: str | None = None
    event_type: AuditEventType
    #: What was decided about, e.g. `tool:create_ticket`, `agent:vagent`, `credential:tickets`.
    resource: str
    decision: Decision
    reason: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)

    def to_stream(self) -> dict[str, str]:
        return {STREAM_FIELD: self.model_dump_json()}

    @classmethod
    def from_stream(cls, fields: Mapping[Any, Any]) -> AuditEvent:
        raw = fields.get(STREAM_FIELD) or fields.get(STREAM_FIELD.encode())
        if raw is None:
            raise ValueError("not an audit entry: no 'event' field")
        return cls.model_validate_json(raw)


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"… ({len(text)} chars)"


def scrub(value: Any, include_content: bool = False, depth: int = 0, key: str = "") -> Any:
    """A value fit for an audit record: secrets by name and by shape removed, message bodies
    replaced by their length unless `include_content`, strings and lists truncated."""
    if key and secret_name(key):
        return REDACTED
    if key and not include_content and _CONTENT_KEY.match(key) and value not in (None, ""):
        size = len(value) if isinstance(value, str) else len(json.dumps(value, default=str))
        return f"[omitted: {size} chars]"
    if depth > 3:
        return "[nested]"
    if isinstance(value, str):
        return _truncate(mask_secrets(_BEARER.sub(REDACTED, value), REDACTED), MAX_VALUE_CHARS)
    if isinstance(value, Mapping):
        items = list(value.items())[:MAX_ITEMS]
        return {str(k)[:64]: scrub(v, include_content, depth + 1, str(k)) for k, v in items}
    if isinstance(value, list | tuple | set):
        return [scrub(v, include_content, depth + 1) for v in list(value)[:MAX_ITEMS]]
    if value is None or isinstance(value, bool | int | float):
        return value
    return _truncate(str(value), MAX_VALUE_CHARS)


def scrub_arguments(args: Mapping[str, Any], include_content: bool = False) -> dict[str, Any]:
    """Tool-call arguments as the audit trail records them."""
    scrubbed = scrub(dict(args), include_content)
    return scrubbed if isinstance(scrubbed, dict) else {}
