"""REDIS_URL forms: redis+sentinel:// parsed as redisvl does, errors and messages without the
password, and the kind of client each form gives."""

from __future__ import annotations

import pytest
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel

from vagent_bot.__main__ import redis_client
from vagent_shared.redis_connect import (
    DEFAULT_MAX_CONNECTIONS,
    RedisUrlError,
    SentinelUrl,
    connect,
    connect_sync,
    parse_sentinel_url,
    where,
)
from vagent_shared.settings import BotSettings, GraphSettings


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "redis+sentinel://s1:26379,s2:26380,s3/prod/2",
            SentinelUrl([("s1", 26379), ("s2", 26380), ("s3", 26379)], "prod", 2),
        ),
        ("redis+sentinel://s1:5000", SentinelUrl([("s1", 5000)], "mymaster")),
        ("redis+sentinel://s1:5000/", SentinelUrl([("s1", 5000)], "mymaster")),
        ("redis+sentinel://s1:5000//3", SentinelUrl([("s1", 5000)], "mymaster", 3)),
        (
            "redis+sentinel://alice:p%40ss:w@s1:1,s2:2/main/0",
            SentinelUrl([("s1", 1), ("s2", 2)], "main", 0, "alice", "p@ss:w"),
        ),
        ("redis+sentinel://:secret@s1/main", SentinelUrl([("s1", 26379)], "main", None, None, "secret")),
        (
            "REDIS+SENTINEL://[::1]:26380,[fe80::2]/m",
            SentinelUrl([("::1", 26380), ("fe80::2", 26379)], "m"),
        ),
    ],
)
def test_sentinel_urls_parse_like_redisvl(url: str, expected: SentinelUrl) -> None:
    assert parse_sentinel_url(url) == expected


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://:hunter2@/mymaster",
        "redis+sentinel://:hunter2@s1:notaport/mymaster",
        "redis+sentinel://:hunter2@s1:99999",
        "redis+sentinel://:hunter2@s1,,s2",
        "redis+sentinel://:hunter2@[::1/mymaster",
        "redis+sentinel://:hunter2@s1/mymaster/zero",
        "redis+sentinel://:hunter2@s1/mymaster/0/extra",
        "redis://:hunter2@s1:6379/0",
    ],
)
def test_bad_sentinel_urls_are_refused_without_the_password(url: str) -> None:
    with pytest.raises(RedisUrlError) as err:
        parse_sentinel_url(url)
    assert "hunter2" not in str(err.value)
    assert "REDIS_URL" in str(err.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:hunter2@cache:6380/0", "cache:6380"),
        ("rediss://u:hunter2@cache/1", "cache:6379"),
        ("unix:///run/redis.sock?password=hunter2", "/run/redis.sock"),
        ("redis+sentinel://u:hunter2@s1:1,[::1]:2/prod/0", "sentinel s1:1,[::1]:2 service prod"),
        ("redis+sentinel://u:hunter2@s1:x/prod", "(unreadable REDIS_URL)"),
    ],
)
def test_where_names_the_address_never_the_password(url: str, shown: str) -> None:
    assert where(url) == shown


async def test_a_sentinel_url_gives_a_client_that_follows_the_master() -> None:
    client = connect("redis+sentinel://u:hunter2@127.0.0.1:1,127.0.0.1:2/prod/3", socket_timeout=7)
    try:
        pool = client.connection_pool
        assert isinstance(pool, redis.asyncio.sentinel.SentinelConnectionPool)
        assert pool.service_name == "prod" and pool.is_master
        assert pool.connection_kwargs["db"] == 3 and pool.connection_kwargs["password"] == "hunter2"
        sentinel = pool.sentinel_manager
        assert [c.connection_pool.connection_kwargs["port"] for c in sentinel.sentinels] == [1, 2]
        assert sentinel.sentinel_kwargs == {"socket_timeout": 7, "username": "u", "password": "hunter2"}
    finally:
        await client.aclose()


def test_plain_urls_are_redis_from_url() -> None:
    sync = connect_sync("redis://127.0.0.1:1/4", socket_timeout=3)
    assert not isinstance(sync.connection_pool, redis.sentinel.SentinelConnectionPool)
    assert sync.connection_pool.connection_kwargs["db"] == 4
    sentinel = connect_sync("redis+sentinel://127.0.0.1:1")
    assert isinstance(sentinel.connection_pool, redis.sentinel.SentinelConnectionPool)
    assert isinstance(connect("redis://127.0.0.1:1/0"), redis.asyncio.Redis)


async def test_both_forms_wait_for_a_free_connection_up_to_the_cap() -> None:
    """REDIS_MAX_CONNECTIONS: a blocking pool of that size, for plain and sentinel URLs; the
    pool's own arguments do not reach the connections or the sentinels."""
    for url in ("redis://127.0.0.1:1/2", "redis+sentinel://127.0.0.1:1/prod/2"):
        client = connect(url, max_connections=7, pool_timeout=1.5, socket_timeout=3)
        try:
            pool = client.connection_pool
            assert isinstance(pool, redis.asyncio.BlockingConnectionPool), url
            assert (pool.max_connections, pool.timeout) == (7, 1.5)
            assert pool.connection_kwargs["socket_timeout"] == 3 and pool.connection_kwargs["db"] == 2
            assert "max_connections" not in pool.connection_kwargs and "timeout" not in pool.connection_kwargs
            if isinstance(pool, redis.asyncio.sentinel.SentinelConnectionPool):
                assert "max_connections" not in pool.sentinel_manager.connection_kwargs
        finally:
            await client.aclose()
    default = connect("redis://127.0.0.1:1/0")
    assert default.connection_pool.max_connections == DEFAULT_MAX_CONNECTIONS
    settings = (BotSettings().REDIS_MAX_CONNECTIONS, GraphSettings().REDIS_MAX_CONNECTIONS)
    assert settings == (DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS)
    await default.aclose()


async def test_the_bots_client_takes_its_size_from_the_setting() -> None:
    client = redis_client(BotSettings(REDIS_URL="redis://127.0.0.1:1/0", REDIS_MAX_CONNECTIONS=9))
    assert client.connection_pool.max_connections == 9
    await client.aclose()


def test_clients_retry_a_dropped_connection_with_redis_pys_own_retry() -> None:
    """A restarted or failed-over Redis leaves dead connections in the pool: the first
    command on one must be tried again, not fail the user's run."""
    import redis.exceptions

    from vagent_shared import redis_connect

    for url in ("redis://127.0.0.1:1/0", "redis+sentinel://127.0.0.1:1/mymaster"):
        client = redis_connect.connect(url)
        retry = client.connection_pool.connection_kwargs["retry"]
        assert retry.get_retries() == 3
        assert redis.exceptions.ConnectionError in retry._supported_errors


@pytest.mark.parametrize("url", ["bogus://u:hunter2@db.internal:6379/0", "redis://u:hunter2@db.internal:notaport/0"])
def test_a_url_redis_py_cannot_read_is_a_clear_error_without_the_password(url: str) -> None:
    for open_client in (connect_sync, connect):
        with pytest.raises(RedisUrlError) as err:
            open_client(url)
        assert "hunter2" not in str(err.value) and "cannot be read" in str(err.value)
