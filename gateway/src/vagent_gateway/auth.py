"""Who is calling and may they use the agent: the gateway's door, with the bot's rules.

Token -> user (identity.py, 401 when bad), tenant (GATEWAY_TENANT, else the user's own
server name), then the AccessControlProvider asked afresh on every request (no cache: a
revoked grant takes effect on the next request): no agent access 403, provider down 503
(fail closed). The provider audits each decision; a bad token is audited here.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog
from fastapi import HTTPException, Request
from opentelemetry import trace

from vagent_gateway import metrics
from vagent_gateway.identity import HomeserverUnavailable, Identity, token_from
from vagent_shared.access import AcContext, agent
from vagent_shared.access_provider import UNAVAILABLE_REASONS, AccessProvider
from vagent_shared.audit_trail import AuditTrail
from vagent_shared.http_errors import api_error

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Caller:
    """A person verified by their homeserver and allowed to use the agent."""

    user_id: str
    tenant: str
    ac: AcContext


def unauthorized() -> HTTPException:
    return HTTPException(
        401,
        detail={"error_code": "unauthorized", "message": "Missing, invalid or expired access token."},
        headers={"WWW-Authenticate": "Bearer"},
    )


def tenant_of(user_id: str, configured: str | None) -> str:
    """GATEWAY_TENANT, or the server name of the user's id (`@alice:localhost` -> localhost)."""
    return configured or user_id.split(":", 1)[1]


class Door:
    """Resolves a request to its Caller, or the HTTP error the bot's rules give."""

    def __init__(
        self, identity: Identity, access: AccessProvider, audit: AuditTrail, tenant: str | None, agent_id: str
    ) -> None:
        self.identity, self.access, self.audit = identity, access, audit
        self.tenant, self.agent_id = tenant, agent_id

    async def caller(self, request: Request) -> Caller:
        token = token_from(request.headers)
        if token is None:
            self._refused(request, "no access token" if not _has_token(request) else "malformed access token")
            raise unauthorized()
        try:
            user_id = await self.identity.user_for(token)
        except HomeserverUnavailable:
            metrics.AUTH.labels("homeserver_unavailable").inc()
            raise api_error(
                503, "homeserver_unavailable", "The homeserver cannot verify tokens right now."
            ) from None
        if user_id is None:
            self._refused(request, "invalid or expired access token")
            raise unauthorized()
        metrics.AUTH.labels("verified").inc()
        tenant = tenant_of(user_id, self.tenant)
        span = trace.get_current_span()  # the request's server span, when tracing is on
        span.set_attribute("enduser.id", user_id)
        span.set_attribute("vagent.tenant", tenant)
        result = await self.access.check(user_id, tenant)
        span.set_attribute("vagent.access.reason", result.reason)
        if result.allowed and result.ac is not None:
            return Caller(user_id, tenant, result.ac)
        if result.reason in UNAVAILABLE_REASONS:
            raise api_error(503, "access_provider_unavailable", "Access cannot be checked right now.")
        raise api_error(403, "no_agent_access", f"You may not use the agent {self.agent_id}.")

    def _refused(self, request: Request, reason: str) -> None:
        """A refused token: counted, logged and audited, never with the token."""
        metrics.AUTH.labels("refused").inc()
        client = request.client.host if request.client else None
        log.warning("security.bad_access_token", path=request.url.path[:200], client=client, reason=reason)
        self.audit.record(
            "access_denied",
            user_id="unknown",
            resource=agent(self.agent_id),
            decision="denied",
            reason=reason,
            metadata={"client": client, "path": request.url.path[:200]},
        )


def _has_token(request: Request) -> bool:
    return "authorization" in request.headers or "x-api-key" in request.headers
