"""Layer 1 of access control: may this user use the agent at all? (docs/access-control.md)

Why shared: every door into the agent (the bot's Matrix rooms, the gateway's HTTP API) must
ask the AccessControlProvider the same way and apply the same rule, so both use this one
client. It asks about every request (no caching: a revoked grant takes effect on the next
message) and lets nothing through when the provider cannot give a trustworthy answer (fail
closed). What differs per service is injected: its metrics (`ProviderMetrics`) and the HTTP
proxy to reach the provider through.

Needs the `provider` extra (aiohttp): `vagent-shared[provider]`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

import aiohttp
import structlog
from pydantic import ValidationError

from vagent_shared.access import AcContext, agent, instance_matches
from vagent_shared.audit import AuditEventType
from vagent_shared.audit_trail import AuditTrail
from vagent_shared.wire import AuthenticateRequest

AUTHENTICATE_PATH: Final = "/api/v1/authenticate"

GRANTED: Final = "granted"
SUPERUSER: Final = "superuser"
NO_AGENT_GRANT: Final = "no_agent_grant"
PROVIDER_DENIED: Final = "provider_denied"
PROVIDER_ERROR: Final = "provider_error"
PROVIDER_TIMEOUT: Final = "provider_timeout"
BAD_PROVIDER_ANSWER: Final = "bad_provider_answer"
DOMAIN_MISMATCH: Final = "domain_mismatch"
#: The reasons that mean "the provider gave no trustworthy answer" (it is down, slow or
#: misbehaving), as opposed to a real refusal: a caller answers these with 503, not 403.
UNAVAILABLE_REASONS: Final[frozenset[str]] = frozenset(
    {PROVIDER_ERROR, PROVIDER_TIMEOUT, BAD_PROVIDER_ANSWER}
)
#: How much of a provider's (unexpected) domain a log line or audit reason quotes.
_MAX_QUOTED_DOMAIN = 200


def _ignore(_: Any) -> None:
    """The default metric hook: count nothing."""


@dataclass(frozen=True)
class ProviderMetrics:
    """What a service counts about its provider calls, as three hooks (each service has its own
    metric names and registry, so this module imports no metrics library):
    `decision(reason)` once per `check`, `error(kind)` once per failed call (timeout,
    transport, http_5xx, bad_answer, ...), `seconds(duration)` once per HTTP call."""

    decision: Callable[[str], None] = _ignore
    error: Callable[[str], None] = _ignore
    seconds: Callable[[float], None] = _ignore


#: Counts nothing: the default when a caller injects no metrics.
NO_METRICS: Final = ProviderMetrics()


def _role_grants_agent(ac: AcContext, agent_id: str) -> bool:
    """An active role in the active domain grants `agent:{agent_id}` (exact or `agent:*`)."""
    wanted = agent(agent_id)
    return any(instance_matches(i, wanted) for i in ac.get_instances_for_roles(ac.active_roles))


def agent_allowed(ac: AcContext, agent_id: str) -> bool:
    """The layer-1 rule: an active role grants `agent:{agent_id}`, or the user is a superuser."""
    return _role_grants_agent(ac, agent_id) or ac.is_superuser()


@dataclass(frozen=True)
class _Fetched:
    """What one provider call yielded. `ac` set: a valid answer about the user asked about.
    Otherwise `reason` says why not; `kind` is set when the provider misbehaved (not a 403/404)."""

    ac: AcContext | None
    reason: str = "answered"
    kind: str | None = None
    exc: BaseException | None = None
    extra: dict[str, object] = field(default_factory=dict)

    @staticmethod
    def failed(reason: str, kind: str | None, exc: BaseException | None = None, **extra: object) -> _Fetched:
        return _Fetched(None, reason, kind, exc, extra)


def _validated(user_id: str, status: int, raw: bytes) -> _Fetched:
    """The provider's answer, trusted only if it is a valid AcContext about `user_id`."""
    if status in (403, 404):
        return _Fetched.failed(PROVIDER_DENIED, None, status=status)
    if status != 200:
        return _Fetched.failed(PROVIDER_ERROR, f"http_{status // 100}xx", status=status)
    try:
        ac = AcContext.model_validate_json(raw)
    except ValidationError as exc:
        return _Fetched.failed(
            BAD_PROVIDER_ANSWER, "bad_answer", status=200, problems=exc.error_count(), body_bytes=len(raw)
        )
    if ac.user_id != user_id:
        return _Fetched.failed(BAD_PROVIDER_ANSWER, "user_mismatch", status=200, answered_user_id=ac.user_id)
    return _Fetched(ac)


@dataclass(frozen=True)
class AccessResult:
    """The outcome of one check. `ac` is set whenever the provider answered a valid AcContext
    for the domain asked about (never one of another domain)."""

    allowed: bool
    reason: str
    ac: AcContext | None


class AccessProvider:
    """Client of `POST {base_url}/api/v1/authenticate`, asked afresh for every message or request.

    `timeout` bounds the whole call (connect + send + answer), not each phase, so a
    provider trickling bytes cannot hold a message up longer than that. `proxy` is the HTTP
    proxy to reach the provider through (None: direct; the environment is not read here).
    Its log lines carry the logger name of `log`, which a service's subclass may rename.
    """

    log: ClassVar[Any] = structlog.get_logger(__name__)

    def __init__(
        self,
        base_url: str,
        timeout: float,
        agent_id: str,
        client: aiohttp.ClientSession | None = None,
        audit: AuditTrail | None = None,
        *,
        metrics: ProviderMetrics | None = None,
        proxy: str | None = None,
    ) -> None:
        self.url = base_url.rstrip("/") + AUTHENTICATE_PATH
        self.audit = audit
        self.timeout = timeout
        self.agent_id = agent_id
        agent(agent_id)  # a malformed AGENT_ID is a configuration error, found at startup
        self._owns_client = client is None
        self._client = client  # created on first use when not injected: aiohttp needs a running loop
        self._proxy = proxy
        self.metrics = metrics if metrics is not None else NO_METRICS

    def _session(self) -> aiohttp.ClientSession:
        """The HTTP session, created here (and then owned) on first use, inside the running loop."""
        if self._client is None:
            self._client = aiohttp.ClientSession(
                # Pooled keep-alive connections, as httpx's defaults (100 connections, idle 5 s).
                connector=aiohttp.TCPConnector(limit=100, keepalive_timeout=5.0),
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                # trust_env stays False: the proxy is the one the caller passed.
            )
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP session if this object created it."""
        if self._owns_client and self._client is not None:
            await self._client.close()

    async def check(self, user_id: str, domain: str) -> AccessResult:
        """May `user_id` use the agent in `domain`? Every failure answers `allowed=False`."""
        got = await self._fetch(user_id, domain)
        if got.kind is not None:
            return self._unavailable(user_id, domain, got.reason, got.kind, got.exc, **got.extra)
        if got.ac is None:
            return self._decide(user_id, domain, PROVIDER_DENIED, None, **got.extra)
        ac = got.ac
        if ac.active_acl_domain != domain:
            # Roles of another domain say nothing about this tenant: deny (fail closed).
            answered = ac.active_acl_domain[:_MAX_QUOTED_DOMAIN]
            why = f"{DOMAIN_MISMATCH}: provider answered domain {answered!r} for tenant {domain!r}"
            extra = {"active_acl_domain": answered}
            return self._conclude(user_id, domain, DOMAIN_MISMATCH, None, "access_denied", why, extra)
        if _role_grants_agent(ac, self.agent_id):
            return self._decide(user_id, domain, GRANTED, ac)
        if ac.is_superuser():
            return self._decide(user_id, domain, SUPERUSER, ac)
        return self._decide(user_id, domain, NO_AGENT_GRANT, ac, active_roles=ac.active_roles)

    async def context(self, user_id: str, domain: str) -> AcContext | None:
        """`user_id`'s AcContext in `domain`, or None when the provider gives no usable answer.

        For what another room member may READ, not whether they may use the agent: no access
        decision, no `access_denied` audit line (they did not ask for anything). Provider
        failures still count as errors (`metrics.error`): they are the provider's health.
        """
        got = await self._fetch(user_id, domain)
        if got.kind is not None:
            self.metrics.error(got.kind)
        if got.ac is None:
            self.log.debug(
                "acp_context_unavailable",
                user_id=user_id,
                domain=domain,
                reason=got.reason,
                kind=got.kind,
                error_type=type(got.exc).__name__ if got.exc else None,
                **got.extra,
            )
        return got.ac

    async def _fetch(self, user_id: str, domain: str) -> _Fetched:
        """One call to the provider and the validation of its answer; no decision, no logging."""
        try:
            body = AuthenticateRequest(user_id=user_id, domain=domain).model_dump()
        except ValidationError as exc:  # an empty user or domain is a caller bug: deny, do not raise
            return _Fetched.failed(PROVIDER_ERROR, "bad_request", exc)
        start = time.perf_counter()
        try:
            async with (
                asyncio.timeout(self.timeout),
                self._session().post(
                    self.url,
                    json=body,
                    timeout=aiohttp.ClientTimeout(total=self.timeout),
                    allow_redirects=False,
                    proxy=self._proxy,
                ) as resp,
            ):
                status = resp.status
                raw = await resp.read()  # the whole body, within the timeout
        except TimeoutError as exc:  # also asyncio.TimeoutError and aiohttp's timeout errors
            return _Fetched.failed(PROVIDER_TIMEOUT, "timeout", exc)
        except Exception as exc:  # connection refused, DNS, protocol error, bad URL: fail closed
            return _Fetched.failed(PROVIDER_ERROR, "transport", exc)
        finally:
            self.metrics.seconds(time.perf_counter() - start)
        return _validated(user_id, status, raw)

    def _decide(
        self, user_id: str, domain: str, reason: str, ac: AcContext | None, **extra: object
    ) -> AccessResult:
        """Count and audit-log a decision the provider's answer supports."""
        return self._conclude(user_id, domain, reason, ac, "agent_access", reason, extra)

    def _conclude(
        self,
        user_id: str,
        domain: str,
        reason: str,
        ac: AcContext | None,
        event_type: AuditEventType,
        audit_reason: str,
        extra: Mapping[str, object],
    ) -> AccessResult:
        """Count, log (`access_granted` / `access_denied` with `extra`) and record in the audit
        trail (`event_type`, `audit_reason`) one decision."""
        allowed = reason in (GRANTED, SUPERUSER)
        self.metrics.decision(reason)
        if allowed:
            self.log.info(
                "access_granted", user_id=user_id, domain=domain, reason=reason, agent_id=self.agent_id
            )
        else:
            self.log.warning(
                "access_denied",
                user_id=user_id,
                domain=domain,
                reason=reason,
                agent_id=self.agent_id,
                **extra,
            )
        if self.audit is not None:
            self.audit.record(
                event_type,
                user_id=user_id,
                domain=domain,
                resource=agent(self.agent_id),
                decision="allowed" if allowed else "denied",
                reason=audit_reason,
            )
        return AccessResult(allowed=allowed, reason=reason, ac=ac)

    def _unavailable(
        self,
        user_id: str,
        domain: str,
        reason: str,
        kind: str,
        exc: BaseException | None,
        **extra: object,
    ) -> AccessResult:
        """No trustworthy answer: log the failure and deny (fail closed)."""
        self.metrics.error(kind)
        self.log.error(
            "acp_unavailable",
            user_id=user_id,
            domain=domain,
            reason=reason,
            kind=kind,
            url=self.url,
            error_type=type(exc).__name__ if exc else None,
            error=str(exc) if exc else None,
            **extra,
        )
        return self._decide(user_id, domain, reason, None)
