"""Who is calling: the person's own Matrix access token, verified with their homeserver.

Why the homeserver: it is the one authority that issued the token, so the gateway needs no
user store of its own, and a logout or a deactivated account stops the token within
GATEWAY_TOKEN_CACHE_SECONDS. The token is never logged or stored: the cache key is its
SHA-256, the cached value only the user id.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping
from typing import Final

import aiohttp
import structlog
from redis.asyncio import Redis

from vagent_shared import redis_keys
from vagent_shared.session import SessionId

log = structlog.get_logger(__name__)

WHOAMI_PATH: Final = "/_matrix/client/v3/account/whoami"
#: Longest token accepted at all (Synapse's are ~40-60 characters; anything huge is junk).
MAX_TOKEN_CHARS: Final = 2048


class HomeserverUnavailable(Exception):
    """The homeserver gave no trustworthy answer: the caller is neither accepted nor refused."""


def token_from(headers: Mapping[str, str]) -> str | None:
    """The token of `Authorization: Bearer …` or `X-Api-Key` (what agent-chat-ui and the SDK's
    `api_key` send). None when absent or not token-shaped."""
    auth = headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    # only HTTP's own whitespace around it: str.strip() would also take off a non-breaking
    # space (latin-1 0xA0), accepting "<token>\xa0" as the token
    raw = value if scheme.lower() == "bearer" else headers.get("x-api-key", "")
    token = raw.strip(" \t")
    if not token or len(token) > MAX_TOKEN_CHARS or not token.isascii() or not token.isprintable():
        return None
    if any(c.isspace() for c in token):
        return None
    return token


def token_hash(token: str) -> str:
    """The cache key's hash of a token (the token itself is never stored)."""
    return hashlib.sha256(token.encode()).hexdigest()


class Identity:
    """Token -> Matrix user id, via `GET {homeserver}/_matrix/client/v3/account/whoami`,
    cached in Redis for at most `cache_seconds` (0: asked every time)."""

    def __init__(
        self,
        homeserver: str,
        redis: Redis,
        cache_seconds: int,
        *,
        timeout: float = 5.0,
        proxy: str | None = None,
    ) -> None:
        self.url = homeserver.rstrip("/") + WHOAMI_PATH
        self.redis, self.cache_seconds = redis, cache_seconds
        self.timeout, self.proxy = timeout, proxy
        self._client: aiohttp.ClientSession | None = None

    def _session(self) -> aiohttp.ClientSession:
        if self._client is None:
            self._client = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()

    async def user_for(self, token: str) -> str | None:
        """The user the token belongs to; None for a bad or expired token. Raises
        HomeserverUnavailable when the homeserver cannot say."""
        key = redis_keys.gateway_token(token_hash(token))
        if self.cache_seconds > 0:
            cached = await self.redis.get(key)
            if cached:
                return cached.decode() if isinstance(cached, bytes) else str(cached)
        user_id = await self._whoami(token)
        if user_id is not None and self.cache_seconds > 0:
            await self.redis.set(key, user_id, ex=self.cache_seconds)
        return user_id

    async def _whoami(self, token: str) -> str | None:
        try:
            async with (
                asyncio.timeout(self.timeout),
                self._session().get(
                    self.url,
                    headers={"Authorization": f"Bearer {token}"},
                    allow_redirects=False,
                    proxy=self.proxy,
                ) as resp,
            ):
                status = resp.status
                body = await resp.json(content_type=None) if status == 200 else None
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            log.error("homeserver_unavailable", url=self.url, error_type=type(exc).__name__)
            raise HomeserverUnavailable(type(exc).__name__) from exc
        if status in (401, 403):  # M_UNKNOWN_TOKEN, M_MISSING_TOKEN, deactivated / locked
            return None
        if status != 200:
            log.error("homeserver_unavailable", url=self.url, status=status)
            raise HomeserverUnavailable(f"http_{status}")
        user_id = body.get("user_id") if isinstance(body, dict) else None
        if not isinstance(user_id, str) or not _valid_user(user_id):
            log.error("homeserver_bad_answer", url=self.url)
            raise HomeserverUnavailable("bad_answer")
        return user_id


def _valid_user(user_id: str) -> bool:
    """A user id that can own a session (`@name:server`)."""
    try:
        SessionId(room_id="!check", user_id=user_id)
    except ValueError:
        return False
    return True
