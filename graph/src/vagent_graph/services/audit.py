"""The graph's side of the audit trail: one call per access decision, from the workflow and
from tools, for the user of the current call. Without an AuditTrail service (some tests)
nothing is recorded."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vagent_graph.services import Services
from vagent_shared.access import AcContext
from vagent_shared.audit import AuditEventType, Decision
from vagent_shared.audit_trail import AuditTrail


def audit(
    services: Services,
    event_type: AuditEventType,
    ac: AcContext,
    session_id: str,
    *,
    resource: str,
    decision: Decision,
    reason: str = "",
    metadata: dict[str, Any] | None = None,
    arguments: Mapping[str, Any] | None = None,
) -> None:
    trail = services.find(AuditTrail)
    if trail is not None:
        trail.record(
            event_type,
            user_id=ac.user_id,
            session_id=session_id or None,
            domain=ac.active_acl_domain,
            resource=resource,
            decision=decision,
            reason=reason,
            metadata=metadata,
            arguments=arguments,
        )
