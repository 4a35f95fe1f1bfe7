"""The services' Redis client (redis_connect.connect, REDIS_MAX_CONNECTIONS) on a real Redis:
twice as many concurrent commands as the pool has connections all succeed, the surplus
waiting for a free connection, where redis-py's default pool fails them at once with
MaxConnectionsError (1 of 10 000 parked runs did, bench/README.md). Plain and Sentinel URLs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio
from redis.exceptions import MaxConnectionsError

from tests.support.redis_sentinel import SentinelSetup
from vagent_shared.redis_connect import PoolExhaustedError, connect

POOL = 5
HOLD = 0.3  # seconds each command keeps its connection (BLPOP on a key that stays empty)


@pytest.fixture(scope="module")
def sentinel_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with SentinelSetup(Path(tmp_path_factory.mktemp("pool-sentinel"))) as setup:
        yield setup.url


@pytest.fixture(params=["plain", "sentinel"])
def url(request: pytest.FixtureRequest, redis_url: str) -> str:
    if request.param == "plain":
        return redis_url
    return str(request.getfixturevalue("sentinel_url"))


async def hold(client: redis.asyncio.Redis, key: str) -> None:
    assert await client.blpop([key], timeout=HOLD) is None


async def test_twice_the_pool_of_concurrent_commands_all_succeed(url: str) -> None:
    client = connect(url, max_connections=POOL, socket_timeout=10)
    try:
        started = time.monotonic()
        await asyncio.gather(*(hold(client, f"pool-test:{i}") for i in range(2 * POOL)))
        took = time.monotonic() - started
        pool = client.connection_pool
        assert len(pool._in_use_connections) + len(pool._available_connections) <= POOL  # type: ignore[attr-defined]
        assert took >= 2 * HOLD * 0.9  # two rounds: the second half waited for the first
        assert await client.ping()  # type: ignore[misc]
    finally:
        await client.aclose()


async def test_waiting_longer_than_the_pool_timeout_is_a_clear_error(redis_url: str) -> None:
    client = connect(redis_url, max_connections=2, pool_timeout=0.2, socket_timeout=10)
    try:
        busy = [asyncio.create_task(hold(client, f"pool-test:busy{i}")) for i in range(2)]
        await asyncio.sleep(0.05)
        with pytest.raises(PoolExhaustedError, match=r"all 2 are in use \(REDIS_MAX_CONNECTIONS\)"):
            await client.ping()  # type: ignore[misc]
        await asyncio.gather(*busy)
        assert await client.ping()  # type: ignore[misc]
    finally:
        await client.aclose()


async def test_redis_pys_default_pool_fails_at_once_beyond_its_cap(redis_url: str) -> None:
    """What the waiting pool replaces (so the test above is not vacuous)."""
    client = redis.asyncio.Redis.from_url(redis_url, max_connections=POOL)
    try:
        results = await asyncio.gather(
            *(hold(client, f"pool-test:{i}") for i in range(2 * POOL)), return_exceptions=True
        )
        assert sum(isinstance(r, MaxConnectionsError) for r in results) == POOL
    finally:
        await client.aclose()
