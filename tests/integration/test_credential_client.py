"""The Credential Registry client against an HTTP registry in every state, with the real
Redis cache: 404, 403, timeout, 5xx, expiry, revocation, encryption at rest."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cryptography.fernet import Fernet
from redis.asyncio import Redis

from tests.support.http_standin import HttpStandIn
from tests.support.redis_dump import dump_redis
from vagent_graph.services.credentials import (
    CredentialCache,
    CredentialDenied,
    CredentialMissing,
    CredentialRegistry,
    CredentialUnavailable,
)
from vagent_shared import redis_keys

DOMAIN = "localhost"


class Registry:
    """What the stand-in registry answers next; every credential it issues is new."""

    def __init__(self) -> None:
        self.status = 200
        self.lifetime: timedelta | None = timedelta(hours=1)
        self.delay = 0.0
        self.issued: list[str] = []
        self.now = datetime.now(UTC)

    async def __call__(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        await asyncio.sleep(self.delay)
        if self.status != 200:
            return self.status, {"error": "nope"}
        secret = f"secret-{uuid.uuid4().hex}"
        self.issued.append(secret)
        expires = self.now + self.lifetime if self.lifetime is not None else None
        return 200, {
            "credential_type": "api_key",
            "credential": secret,
            "expires_at": expires.isoformat() if expires else None,
        }


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    r = Redis.from_url(redis_url)
    yield r
    await r.aclose()


@pytest.fixture
async def registry() -> AsyncIterator[tuple[Registry, HttpStandIn]]:
    behaviour = Registry()
    async with HttpStandIn(behaviour) as server:
        yield behaviour, server


def user() -> str:
    return f"@u{uuid.uuid4().hex[:8]}:localhost"


def client(server: HttpStandIn, redis: Redis | None, clock: list[datetime], **kw: Any) -> CredentialRegistry:
    cache = CredentialCache(redis, Fernet.generate_key().decode()) if redis is not None else None
    return CredentialRegistry(server.url, timeout=0.5, cache=cache, clock=lambda: clock[0], **kw)


async def test_the_contract_request_and_a_valid_credential(registry: tuple[Registry, HttpStandIn]) -> None:
    behaviour, server = registry
    c = client(server, None, [behaviour.now])
    u = user()
    got = await c.get(u, "tickets", DOMAIN)
    assert got.credential.credential.get_secret_value() == behaviour.issued[-1]
    assert got.source == "registry"
    method, path, body, _ = server.requests[-1]
    assert (method, path, body) == (
        "POST",
        "/api/v1/credentials/get",
        {"user_id": u, "resource_id": "tickets", "domain": DOMAIN},
    )
    assert behaviour.issued[-1] not in repr(got) and behaviour.issued[-1] not in str(got)
    await c.aclose()


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (404, CredentialMissing),
        (403, CredentialDenied),
        (500, CredentialUnavailable),
        (503, CredentialUnavailable),
    ],
)
async def test_registry_answers_become_typed_failures(
    registry: tuple[Registry, HttpStandIn], status: int, error: type[Exception]
) -> None:
    behaviour, server = registry
    behaviour.status = status
    c = client(server, None, [behaviour.now])
    with pytest.raises(error):
        await c.get(user(), "tickets", DOMAIN)
    await c.aclose()


async def test_a_registry_that_hangs_is_unavailable_within_the_timeout(
    registry: tuple[Registry, HttpStandIn],
) -> None:
    behaviour, server = registry
    behaviour.delay = 5
    c = client(server, None, [behaviour.now])
    with pytest.raises(CredentialUnavailable, match="in time"):
        await asyncio.wait_for(c.get(user(), "tickets", DOMAIN), 3)
    await c.aclose()


async def test_nothing_listens_is_unavailable() -> None:
    from procutil import free_port

    c = CredentialRegistry(f"http://127.0.0.1:{free_port()}", timeout=1)
    with pytest.raises(CredentialUnavailable, match="unreachable"):
        await c.get(user(), "tickets", DOMAIN)
    await c.aclose()


async def test_a_malformed_answer_is_unavailable_and_does_not_quote_it() -> None:
    async def answer(method: str, path: str, body: Any) -> tuple[int, Any]:
        return 200, {"credential_type": "magic", "credential": "leaky-secret-123"}

    async with HttpStandIn(answer) as server:
        c = CredentialRegistry(server.url, timeout=1)
        with pytest.raises(CredentialUnavailable) as info:
            await c.get(user(), "tickets", DOMAIN)
        assert "leaky-secret-123" not in str(info.value) and info.value.__cause__ is None
        await c.aclose()


async def test_the_cache_is_encrypted_and_used_until_expiry_minus_margin(
    registry: tuple[Registry, HttpStandIn], redis: Redis, redis_url: str
) -> None:
    behaviour, server = registry
    clock = [behaviour.now]
    c = client(server, redis, clock, margin_seconds=60, cache_max_seconds=7200)
    u = user()
    first = await c.get(u, "tickets", DOMAIN)
    again = await c.get(u, "tickets", DOMAIN)
    assert (first.source, again.source) == ("registry", "cache") and len(server.requests) == 1
    assert again.credential.credential.get_secret_value() == behaviour.issued[0]
    key = redis_keys.credential_cache(u, DOMAIN, "tickets")
    ttl = await redis.ttl(key)
    assert 3400 <= ttl <= 3540  # an hour minus the margin
    assert await redis.ttl(redis_keys.credential_cache(user(), DOMAIN, "x")) == -2
    everything = await dump_redis(redis_url)
    assert key in everything and not any(behaviour.issued[0] in v for v in everything.values())

    clock[0] = behaviour.now + timedelta(minutes=59, seconds=30)  # inside the margin
    third = await c.get(u, "tickets", DOMAIN)
    assert third.source == "registry" and len(server.requests) == 2
    assert third.credential.credential.get_secret_value() == behaviour.issued[1]
    await c.aclose()


async def test_an_expired_credential_is_fetched_again_never_used(
    registry: tuple[Registry, HttpStandIn], redis: Redis
) -> None:
    behaviour, server = registry
    behaviour.lifetime = timedelta(seconds=30)
    clock = [behaviour.now]
    c = client(server, redis, clock, margin_seconds=0)
    u = user()
    await c.get(u, "tickets", DOMAIN)
    clock[0] = behaviour.now + timedelta(seconds=31)
    behaviour.now = clock[0]
    got = await c.get(u, "tickets", DOMAIN)
    assert got.credential.credential.get_secret_value() == behaviour.issued[1] != behaviour.issued[0]
    # a registry handing out a credential that has already expired is not trusted either
    behaviour.now = clock[0] - timedelta(hours=2)
    await redis.delete(redis_keys.credential_cache(u, DOMAIN, "tickets"))
    with pytest.raises(CredentialUnavailable, match="expired"):
        await c.get(u, "tickets", DOMAIN)
    await c.aclose()


async def test_credentials_inside_the_margin_are_used_but_not_cached(
    registry: tuple[Registry, HttpStandIn], redis: Redis
) -> None:
    behaviour, server = registry
    behaviour.lifetime = timedelta(seconds=30)
    c = client(server, redis, [behaviour.now], margin_seconds=60)
    u = user()
    got = await c.get(u, "tickets", DOMAIN)
    assert got.source == "registry"
    assert not await redis.exists(redis_keys.credential_cache(u, DOMAIN, "tickets"))


@pytest.mark.parametrize(("status", "error"), [(403, CredentialDenied), (404, CredentialMissing)])
async def test_a_refusal_on_refresh_drops_the_cached_entry(
    registry: tuple[Registry, HttpStandIn], redis: Redis, status: int, error: type[Exception]
) -> None:
    behaviour, server = registry
    clock = [behaviour.now]
    c = client(server, redis, clock, margin_seconds=60, cache_max_seconds=3600)
    u, other = user(), user()
    await c.get(u, "tickets", DOMAIN)
    await c.get(other, "tickets", DOMAIN)
    key = redis_keys.credential_cache(u, DOMAIN, "tickets")
    await redis.expire(key, 3600)
    clock[0] = behaviour.now + timedelta(minutes=59, seconds=30)  # due for a refresh
    behaviour.status = status
    with pytest.raises(error):
        await c.get(u, "tickets", DOMAIN)
    assert not await redis.exists(key)
    assert await redis.exists(redis_keys.credential_cache(other, DOMAIN, "tickets"))
    await c.aclose()


async def test_an_entry_written_with_another_key_is_ignored_and_replaced(
    registry: tuple[Registry, HttpStandIn], redis: Redis
) -> None:
    behaviour, server = registry
    u = user()
    await client(server, redis, [behaviour.now]).get(u, "tickets", DOMAIN)
    fresh = await client(server, redis, [behaviour.now]).get(u, "tickets", DOMAIN)  # a new Fernet key
    assert fresh.source == "registry" and len(server.requests) == 2


async def test_users_domains_and_resources_never_share_an_entry(
    registry: tuple[Registry, HttpStandIn], redis: Redis
) -> None:
    behaviour, server = registry
    c = client(server, redis, [behaviour.now])
    u, v = user(), user()
    seen = {
        (await c.get(who, res, dom)).credential.credential.get_secret_value()
        for who, res, dom in [
            (u, "tickets", DOMAIN),
            (v, "tickets", DOMAIN),
            (u, "wiki", DOMAIN),
            (u, "tickets", "acme"),
        ]
    }
    assert len(seen) == 4
    await c.aclose()


async def test_redis_trouble_in_the_cache_falls_back_to_the_registry(
    registry: tuple[Registry, HttpStandIn],
) -> None:
    from procutil import free_port

    behaviour, server = registry
    dead = Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.5)
    c = client(server, dead, [behaviour.now])
    got = await c.get(user(), "tickets", DOMAIN)
    assert got.source == "registry"
    await c.aclose()
    await dead.aclose()
