"""Builders for test data: AcContexts, session ids, requests."""

from __future__ import annotations

import uuid
from typing import Any

from vagent_shared import AcContext, SessionId

DOMAIN = "acme"
ALL_TOOLS = ["tool:database_query", "tool:delete_records", "tool:ask_user"]


def ac(
    user: str = "@alice:localhost",
    instances: list[str] | None = None,
    *,
    superuser: bool = False,
    domain: str = DOMAIN,
) -> AcContext:
    """A user whose one active role `agent_user` grants `instances` in `domain`."""
    inst = ["agent:vagent", *(ALL_TOOLS if instances is None else instances)]
    return AcContext.model_validate(
        {
            "userId": user,
            "activeAclDomain": domain,
            "activeRoles": ["agent_user"],
            "superuserGroups": ["vagent-admins"] if superuser else [],
            "roles": {domain: [{"name": "agent_user", "instances": inst}]},
        }
    )


def new_session(user: str = "@alice:localhost", thread: str | None = None) -> SessionId:
    room = f"!{uuid.uuid4().hex[:12]}:localhost"
    return SessionId(room_id=room, thread_id=thread, user_id=user)


def message_body(sid: SessionId, text: str, ac_context: AcContext | None = None) -> dict[str, Any]:
    return {
        "session_id": sid.format(),
        "room_id": sid.room_id,
        "user_id": sid.user_id,
        "message": text,
        "context": {},
        "timestamp": "2026-11-22T10:00:00Z",
        "ac_context": (ac_context or ac(sid.user_id)).to_wire(),
    }
