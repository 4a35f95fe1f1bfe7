"""HTTP request/response bodies between the bot and the graph service."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from vagent_shared.access import AcContext
from vagent_shared.attachments import Attachment
from vagent_shared.knowledge import Audience
from vagent_shared.session import SessionId


def _now() -> datetime:
    return datetime.now(UTC)


class BotMessage(BaseModel):
    """One user message as the bot forwards it."""

    model_config = ConfigDict(extra="ignore")

    session_id: str
    room_id: str
    user_id: str
    message: str
    context: dict[str, str] = Field(default_factory=dict)
    timestamp: datetime = Field(default_factory=_now)

    @model_validator(mode="after")
    def _consistent(self) -> BotMessage:
        sid = SessionId.parse(self.session_id)
        if sid.room_id != self.room_id:
            raise ValueError("session_id does not match room_id")
        if sid.user_id != self.user_id:
            raise ValueError("session_id does not match user_id")
        return self

    @property
    def session(self) -> SessionId:
        return SessionId.parse(self.session_id)


#: Files one request may carry at most, whatever the graph's ATTACHMENT_MAX_PER_TURN says.
WIRE_MAX_ATTACHMENTS = 16


class ProcessMessageRequest(BotMessage):
    """`POST /api/v1/process_message`: the message plus who sends it, and who else reads
    the answer (`audience`: the other joined members of a group room; None in a DM).

    `attachments`: files that come with the message (docs/api.md). With an empty
    `message` they are kept in the session for its next question (a file sent alone in a
    DM), and the answer only says so."""

    ac_context: AcContext
    audience: Audience | None = None
    #: A group room whose readers the bot does not check (AUDIENCE_FILTER=off): `audience`
    #: is None, yet others read the answer. Memory then recalls only `--everywhere` memories
    #: (docs/memory.md).
    audience_unchecked: bool = False
    attachments: list[Attachment] = Field(default_factory=list, max_length=WIRE_MAX_ATTACHMENTS)


class FeedbackRequest(BaseModel):
    """`POST /api/v1/submit_feedback`: the human's answer to a pending question.

    `ac_context`, when sent, is the user's current AcContext and is used for the
    access re-check when the paused tool finally runs; otherwise the context of the
    paused run applies. `audience`, when sent, replaces the paused run's audience (the
    room's members may have changed while the question waited).
    """

    model_config = ConfigDict(extra="ignore")

    session_id: str
    response: str = Field(max_length=16000)
    metadata: dict[str, Any] = Field(default_factory=dict)
    interrupt_id: str | None = None
    ac_context: AcContext | None = None
    audience: Audience | None = None
    #: As ProcessMessageRequest's: a group room whose readers the bot does not check.
    audience_unchecked: bool = False

    @model_validator(mode="after")
    def _valid_session(self) -> FeedbackRequest:
        SessionId.parse(self.session_id)
        return self


class ResetRequest(BaseModel):
    """`POST /api/v1/reset_session`: forget a session's conversation (`!reset`)."""

    session_id: str

    @model_validator(mode="after")
    def _valid_session(self) -> ResetRequest:
        SessionId.parse(self.session_id)
        return self


class FeedbackAck(BaseModel):
    """JSON answer to submit_feedback for clients that ask for application/json."""

    success: bool
    message: str


class ErrorResponse(BaseModel):
    """Every 4xx/5xx JSON body."""

    error_code: str
    message: str
    details: list[dict[str, Any]] = Field(default_factory=list)


class McpServerStatus(BaseModel):
    """One MCP server as the graph sees it (GET /health); a server that is down does not
    make the graph unhealthy: its tools are just absent until it answers."""

    up: bool
    tools: int
    reason: str | None = None


class HealthResponse(BaseModel):
    status: Literal["healthy", "unhealthy"]
    active_sessions: int
    uptime_seconds: float
    mcp_servers: dict[str, McpServerStatus] = Field(default_factory=dict)
    #: Whether the entity graphs' Redis (ENTITY_REDIS_URL) answers with its graph module.
    #: Not part of `status`: without it only entity lookups stop (they say so).
    entities: Literal["available", "unavailable"] = "available"


class AuthenticateRequest(BaseModel):
    """`POST {ACCESS_CONTROL_PROVIDER_URL}/api/v1/authenticate` (docs/access-control.md).

    200 answers the AcContext (camelCase); 403/404 mean no access.
    """

    user_id: str = Field(min_length=1)
    domain: str = Field(min_length=1)
