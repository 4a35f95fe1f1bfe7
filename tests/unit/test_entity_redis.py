"""ENTITY_REDIS_URL: REDIS_URL when unset, the same URL forms (Sentinel, TLS, unix), and
messages that name the setting the URL came from, never its password."""

from __future__ import annotations

import pytest
import redis.asyncio
import redis.asyncio.sentinel

from vagent_graph.knowledge import entity_redis
from vagent_shared.redis_connect import RedisUrlError
from vagent_shared.settings import GraphSettings


def settings(**env: str | None) -> GraphSettings:
    return GraphSettings(**{"REDIS_URL": "redis://main:6379/0", "ENTITY_REDIS_URL": None, **env})  # type: ignore[arg-type]


def test_unset_it_is_redis_url() -> None:
    s = settings()
    assert s.entity_redis_url() == "redis://main:6379/0"
    assert entity_redis.where(s) == "main:6379 (REDIS_URL)"
    s = settings(ENTITY_REDIS_URL="redis://graphs:6380/0")
    assert s.entity_redis_url() == "redis://graphs:6380/0"
    assert entity_redis.where(s) == "graphs:6380 (ENTITY_REDIS_URL)"


async def test_its_own_client_with_the_same_url_forms() -> None:
    """A client apart from the main one (nothing is sent yet), with REDIS_URL's forms."""
    plain = entity_redis.connect(settings())
    tls = entity_redis.connect(settings(ENTITY_REDIS_URL="rediss://:pw@graphs:6380/1"))
    sentinel = entity_redis.connect(settings(ENTITY_REDIS_URL="redis+sentinel://:pw@s1,s2:26380/graphs/0"))
    try:
        kwargs = plain.connection_pool.connection_kwargs
        assert kwargs["host"] == "main" and kwargs["socket_connect_timeout"] == entity_redis.CONNECT_TIMEOUT_S
        assert tls.connection_pool.connection_class is redis.asyncio.SSLConnection
        assert tls.connection_pool.connection_kwargs["db"] == 1
        pool = sentinel.connection_pool
        assert isinstance(pool, redis.asyncio.sentinel.SentinelConnectionPool)
        assert pool.service_name == "graphs"
    finally:
        for client in (plain, tls, sentinel):
            await client.aclose()


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://:hunter2@s1:notaport/graphs",
        "ftp://:hunter2@graphs:6380/0",
        "redis://:hunter2@h:x/0",
    ],
)
def test_a_bad_url_names_entity_redis_url_without_the_password(url: str) -> None:
    with pytest.raises(RedisUrlError) as err:
        entity_redis.connect(settings(ENTITY_REDIS_URL=url))
    assert "ENTITY_REDIS_URL" in str(err.value) and "hunter2" not in str(err.value)


def test_a_bad_redis_url_used_for_entities_names_redis_url() -> None:
    with pytest.raises(RedisUrlError) as err:
        entity_redis.connect(settings(REDIS_URL="ftp://:hunter2@main:6379/0"))
    assert "ENTITY_REDIS_URL" not in str(err.value) and "REDIS_URL" in str(err.value)
    assert "hunter2" not in str(err.value)
