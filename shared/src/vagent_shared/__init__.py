"""Contracts shared by the vagent bot and graph services.

This package is the single definition of the wire format (HTTP + SSE), the
settings names, the access-control context and the Redis key names.
"""

from vagent_shared.access import AcContext, Resource, RoleGrant
from vagent_shared.events import (
    Done,
    ErrorEvent,
    HitlRequest,
    Progress,
    RawEvent,
    SSEDecoder,
    SSEEvent,
    TextChunk,
    TextFinal,
    parse_sse_event,
)
from vagent_shared.session import SessionId
from vagent_shared.wire import (
    BotMessage,
    ErrorResponse,
    FeedbackAck,
    FeedbackRequest,
    HealthResponse,
    ProcessMessageRequest,
    ResetRequest,
)

__all__ = [
    "AcContext",
    "BotMessage",
    "Done",
    "ErrorEvent",
    "ErrorResponse",
    "FeedbackAck",
    "FeedbackRequest",
    "HealthResponse",
    "HitlRequest",
    "ProcessMessageRequest",
    "Progress",
    "RawEvent",
    "ResetRequest",
    "Resource",
    "RoleGrant",
    "SSEDecoder",
    "SSEEvent",
    "SessionId",
    "TextChunk",
    "TextFinal",
    "parse_sse_event",
]
