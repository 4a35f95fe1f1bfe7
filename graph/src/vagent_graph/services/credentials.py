"""Per-user credentials for tools, from the Credential Registry (docs/credentials.md).

A tool with `requires_credentials` acts on an external system as the asking user. The
workflow fetches that user's credential right before the tool runs and hands it to the
tool alone (`ToolContext.credential`): it never enters the LLM request, the graph state
or checkpoint, an SSE event, a log line or an exception message. The secret stays a
`SecretStr` until a tool applies it with `credential_auth`.

The Redis cache is optional: only with `CREDENTIAL_CACHE_KEY` (a Fernet key), encrypted,
and only until `expires_at` minus a margin. A 403 or 404 drops a cached entry (revocation).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Generator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

import httpx
import structlog
from cryptography.fernet import Fernet, InvalidToken
from pydantic import ValidationError
from redis.asyncio import Redis

from vagent_graph.observability.spans import cache_hit, credential_span
from vagent_shared import redis_keys
from vagent_shared.credentials import CREDENTIALS_GET_PATH, CredentialRequest, CredentialResponse
from vagent_shared.settings import GraphSettings

log = structlog.get_logger(__name__)

Failure = Literal["missing", "denied", "unavailable"]


class CredentialError(Exception):
    """Why a tool gets no credential. The message is safe to show: it never holds a secret."""

    kind: Failure = "unavailable"


class CredentialMissing(CredentialError):
    kind: Failure = "missing"


class CredentialDenied(CredentialError):
    kind: Failure = "denied"


class CredentialUnavailable(CredentialError):
    kind: Failure = "unavailable"


@dataclass(frozen=True)
class Fetched:
    credential: CredentialResponse
    source: Literal["cache", "registry"]


def cache_seconds(cred: CredentialResponse, now: datetime, margin: int, longest: int) -> int:
    """How long a credential may stay cached: until `expires_at - margin`, at most `longest`;
    0 = do not cache."""
    if cred.expires_at is None:
        return longest
    return max(0, min(longest, int((cred.expires_at - now).total_seconds()) - margin))


class CredentialCache:
    """Fernet-encrypted credentials in Redis, keyed per user, domain and resource."""

    def __init__(self, redis: Redis, key: str) -> None:
        self.redis, self._fernet = redis, Fernet(key.encode())

    async def get(self, user_id: str, domain: str, resource_id: str) -> CredentialResponse | None:
        raw = await self.redis.get(redis_keys.credential_cache(user_id, domain, resource_id))
        if raw is None:
            return None
        try:
            return CredentialResponse.model_validate_json(self._fernet.decrypt(raw))
        except (InvalidToken, ValidationError):  # another key, or tampered with: never used
            await self.drop(user_id, domain, resource_id)
            return None

    async def put(
        self, user_id: str, domain: str, resource_id: str, cred: CredentialResponse, ttl: int
    ) -> None:
        token = self._fernet.encrypt(json.dumps(cred.to_wire()).encode())
        await self.redis.set(redis_keys.credential_cache(user_id, domain, resource_id), token, ex=ttl)

    async def drop(self, user_id: str, domain: str, resource_id: str) -> None:
        await self.redis.delete(redis_keys.credential_cache(user_id, domain, resource_id))


class CredentialRegistry:
    """Client of the Credential Registry, with the optional encrypted cache in front."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = 5.0,
        cache: CredentialCache | None = None,
        margin_seconds: int = 60,
        cache_max_seconds: int = 900,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), timeout=timeout, headers=headers, transport=transport
        )
        self.cache, self.margin, self.cache_max = cache, margin_seconds, cache_max_seconds
        self.clock = clock

    @classmethod
    def from_settings(cls, settings: GraphSettings, redis: Redis) -> CredentialRegistry | None:
        if not settings.CREDENTIAL_REGISTRY_URL:
            return None
        key = settings.CREDENTIAL_CACHE_KEY.get_secret_value() if settings.CREDENTIAL_CACHE_KEY else ""
        token = settings.CREDENTIAL_REGISTRY_TOKEN
        return cls(
            settings.CREDENTIAL_REGISTRY_URL,
            token=token.get_secret_value() if token else None,
            timeout=settings.CREDENTIAL_REGISTRY_TIMEOUT_SECONDS,
            cache=CredentialCache(redis, key) if key else None,
            margin_seconds=settings.CREDENTIAL_CACHE_MARGIN_SECONDS,
            cache_max_seconds=settings.CREDENTIAL_CACHE_MAX_SECONDS,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def get(self, user_id: str, resource_id: str, domain: str) -> Fetched:
        """The user's valid credential; raises a CredentialError subclass otherwise."""
        with credential_span(resource_id) as span:
            fetched = await self._get(user_id, resource_id, domain)
            cache_hit(span, fetched.source == "cache")
            return fetched

    async def _get(self, user_id: str, resource_id: str, domain: str) -> Fetched:
        now = self.clock()
        if self.cache is not None:
            with _cache_errors_ignored():
                cached = await self.cache.get(user_id, domain, resource_id)
                if cached is not None and not cached.expired(now, self.margin):
                    return Fetched(cached, "cache")
        cred = await self._fetch(user_id, resource_id, domain)
        now = self.clock()  # after the request, which may have taken a while
        if cred.expired(now):
            raise CredentialUnavailable("the credential registry returned an expired credential")
        ttl = cache_seconds(cred, now, self.margin, self.cache_max)
        if self.cache is not None and ttl > 0:
            with _cache_errors_ignored():
                await self.cache.put(user_id, domain, resource_id, cred, ttl)
        return Fetched(cred, "registry")

    async def _fetch(self, user_id: str, resource_id: str, domain: str) -> CredentialResponse:
        body = CredentialRequest(user_id=user_id, resource_id=resource_id, domain=domain)
        try:
            resp = await self._http.post(CREDENTIALS_GET_PATH, json=body.model_dump())
        except httpx.TimeoutException:
            raise CredentialUnavailable("the credential registry did not answer in time") from None
        except httpx.HTTPError as exc:
            raise CredentialUnavailable(
                f"the credential registry is unreachable ({type(exc).__name__})"
            ) from None
        if resp.status_code in (403, 404):
            if self.cache is not None:  # revoked: a cached copy must not outlive the registry's answer
                with _cache_errors_ignored():
                    await self.cache.drop(user_id, domain, resource_id)
            if resp.status_code == 404:
                raise CredentialMissing("no credential is configured")
            raise CredentialDenied("the credential registry denied access")
        if resp.status_code != 200:
            raise CredentialUnavailable(f"the credential registry answered {resp.status_code}")
        try:
            return CredentialResponse.model_validate_json(resp.content)
        except ValidationError:
            raise CredentialUnavailable("the credential registry sent an invalid answer") from None


@contextlib.contextmanager
def _cache_errors_ignored() -> Generator[None, None, None]:
    """The cache is an optimisation: Redis trouble there falls back to the registry."""
    try:
        yield
    except Exception as exc:  # logged by type only: never a value
        log.warning("credential_cache_error", error=type(exc).__name__)


class HeaderAuth(httpx.Auth):
    """One header carrying the secret; its repr names the header only."""

    def __init__(self, header: str, value: str) -> None:
        self.header, self._value = header, value

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers[self.header] = self._value
        yield request

    def __repr__(self) -> str:
        return f"HeaderAuth({self.header!r})"


def credential_auth(cred: CredentialResponse, api_key_header: str = "X-API-Key") -> httpx.Auth:
    """httpx auth applying a credential: `api_key` as a header, `bearer_token` and `jwt` as
    `Authorization: Bearer`, `basic_auth` (`user:password`) as HTTP Basic. `custom` is the
    tool's own business (ValueError here)."""
    secret = cred.credential.get_secret_value()
    match cred.credential_type:
        case "api_key":
            return HeaderAuth(api_key_header, secret)
        case "bearer_token" | "jwt":
            return HeaderAuth("Authorization", f"Bearer {secret}")
        case "basic_auth":
            user, sep, password = secret.partition(":")
            if not sep:
                raise ValueError("a basic_auth credential must look like user:password")
            return httpx.BasicAuth(user, password)
    raise ValueError(f"a {cred.credential_type} credential has no standard HTTP form")
