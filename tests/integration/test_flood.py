"""Flood control against a real Redis: the sliding window, its edges, isolation, TTL, atomicity;
the shared class (`vagent_shared.flood`) the gateway uses: its own refusal hook, and one window
per person across the bot and the gateway (the same `redis_keys.flood` key)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import cast

import pytest
import structlog
from prometheus_client import REGISTRY
from redis.asyncio import Redis

from vagent_bot.access.flood import BotFloodControl as FloodControl
from vagent_shared import redis_keys
from vagent_shared.flood import FloodControl as SharedFloodControl


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


def user() -> str:
    return f"@u{uuid.uuid4().hex[:10]}:example.org"


def rejected_total() -> float:
    return REGISTRY.get_sample_value("vagent_bot_flood_rejected_total") or 0.0


async def test_allows_max_messages_per_window_then_refuses(redis: Redis) -> None:
    flood, u = FloodControl(redis, max_messages=3, window_seconds=10), user()
    assert [await flood.allow(u, now=t) for t in (100.0, 101.0, 102.0)] == [True] * 3
    assert await flood.allow(u, now=103.0) is False
    assert await flood.allow(u, now=109.999) is False  # the message at 100 still counts


async def test_window_edge_a_message_counts_for_exactly_window_seconds(redis: Redis) -> None:
    flood, u = FloodControl(redis, max_messages=2, window_seconds=10), user()
    assert await flood.allow(u, now=100.0)
    assert await flood.allow(u, now=105.0)
    assert not await flood.allow(u, now=109.999999)
    assert await flood.allow(u, now=110.0)  # [100, 110): the first one has left the window
    assert not await flood.allow(u, now=114.9)  # 105 and 110 count
    assert await flood.allow(u, now=115.0)


async def test_refused_messages_do_not_extend_the_ban(redis: Redis) -> None:
    flood, u = FloodControl(redis, max_messages=2, window_seconds=10), user()
    assert await flood.allow(u, now=0.0) and await flood.allow(u, now=1.0)
    for i in range(40):  # hammering for 9 seconds changes nothing...
        assert not await flood.allow(u, now=1.5 + i * 0.2)
    assert await flood.allow(u, now=10.0)  # ...the oldest accepted message ages out on time
    assert await flood.allow(u, now=11.0)
    assert (await redis.zcard(redis_keys.flood(u))) == 2  # refused attempts are not stored


async def test_a_spammer_stays_limited_while_spamming(redis: Redis) -> None:
    flood, u = FloodControl(redis, max_messages=3, window_seconds=10), user()
    accepted: list[float] = []
    for i in range(1000):  # 10 messages a second for 100 seconds
        now = i * 0.1
        if await flood.allow(u, now=now):
            accepted.append(now)
    for t in accepted:  # no window ever holds more than max_messages
        assert sum(1 for a in accepted if t <= a < t + 10) <= 3
    assert 25 <= len(accepted) <= 33  # ~ max per window, not 1000, and not blocked forever


async def test_users_are_isolated(redis: Redis) -> None:
    flood, a, b = FloodControl(redis, max_messages=1, window_seconds=60), user(), user()
    assert await flood.allow(a, now=1.0)
    assert not await flood.allow(a, now=2.0)
    assert await flood.allow(b, now=2.0)
    assert not await flood.allow(b, now=3.0)


async def test_the_key_has_a_ttl_of_one_window(redis: Redis) -> None:
    flood, u = FloodControl(redis, max_messages=5, window_seconds=30), user()
    await flood.allow(u, now=1.0)
    ttl = await redis.pttl(redis_keys.flood(u))
    assert 0 < ttl <= 30_000
    refused = FloodControl(redis, max_messages=1, window_seconds=30)
    await refused.allow(u, now=2.0)  # refused: the key is not made immortal either
    assert 0 < await redis.pttl(redis_keys.flood(u)) <= 30_000


async def test_same_instant_messages_all_count(redis: Redis) -> None:
    flood, u = FloodControl(redis, max_messages=2, window_seconds=10), user()
    assert [await flood.allow(u, now=5.0) for _ in range(3)] == [True, True, False]


async def test_concurrent_messages_cannot_share_the_last_slot(redis: Redis) -> None:
    flood, u = FloodControl(redis, max_messages=5, window_seconds=60), user()
    results = await asyncio.gather(*(flood.allow(u, now=1.0) for _ in range(30)))
    assert sum(results) == 5


async def test_default_clock_is_the_redis_server_time(redis: Redis) -> None:
    flood, u = FloodControl(redis, max_messages=2, window_seconds=60), user()
    assert await flood.allow(u) and await flood.allow(u)
    assert not await flood.allow(u)
    rows = cast(list[tuple[str, float]], await redis.zrange(redis_keys.flood(u), 0, -1, withscores=True))
    scores = [score for _, score in rows]
    seconds, micros = await redis.time()
    assert len(scores) == 2 and all(abs(s - (seconds + micros / 1e6)) < 5 for s in scores)


async def test_refusals_are_counted_in_metrics(redis: Redis) -> None:
    flood, u = FloodControl(redis, max_messages=1, window_seconds=10), user()
    before = rejected_total()
    await flood.allow(u, now=1.0)
    await flood.allow(u, now=2.0)
    await flood.allow(u, now=3.0)
    assert rejected_total() == before + 2


def test_invalid_limits_are_refused() -> None:
    fake = Redis()  # never connects: construction only
    with pytest.raises(ValueError):
        FloodControl(fake, max_messages=0, window_seconds=10)
    with pytest.raises(ValueError):
        FloodControl(fake, max_messages=1, window_seconds=0)


async def test_each_refusal_is_one_warning_naming_the_user_room_and_limit(redis: Redis) -> None:
    flood, u = FloodControl(redis, max_messages=1, window_seconds=30), user()
    with structlog.testing.capture_logs() as logs:
        assert await flood.allow(u, now=1.0, room_id="!r:example.org")
        assert not await flood.allow(u, now=2.0, room_id="!r:example.org")
        assert not await flood.allow(u, now=3.0, room_id="!r:example.org")
    line = {
        "event": "flood_limited",
        "log_level": "warning",
        "user_id": u,
        "room_id": "!r:example.org",
        "limit": 1,
        "window": 30.0,
    }
    assert logs == [line, line]  # nothing for the accepted message, one line per refused one


async def test_the_refusal_hook_is_called_once_per_refused_message(redis: Redis) -> None:
    refused: list[None] = []
    flood, u = SharedFloodControl(redis, 2, 10, on_rejected=lambda: refused.append(None)), user()
    assert [await flood.allow(u, now=t) for t in (1.0, 2.0, 3.0, 4.0)] == [True, True, False, False]
    assert len(refused) == 2


async def test_without_a_hook_the_bots_metric_is_untouched(redis: Redis) -> None:
    """Another service's refusals must not show up as the bot's."""
    flood, u = SharedFloodControl(redis, 1, 10), user()
    before = rejected_total()
    assert await flood.allow(u, now=1.0)
    assert not await flood.allow(u, now=2.0)
    assert rejected_total() == before


async def test_matrix_and_another_door_count_in_one_window_per_person(redis: Redis) -> None:
    """3 a window: two through the bot and one through the gateway use it up, on either side."""
    bot, gateway, u = FloodControl(redis, 3, 60), SharedFloodControl(redis, 3, 60), user()
    before = rejected_total()
    assert await bot.allow(u, now=1.0)
    assert await gateway.allow(u, now=2.0)
    assert await bot.allow(u, now=3.0)
    assert not await gateway.allow(u, now=4.0)
    assert not await bot.allow(u, now=5.0)
    assert rejected_total() == before + 1  # only the bot's own refusal is the bot's
    assert await redis.zcard(redis_keys.flood(u)) == 3
    assert await gateway.allow(u, now=61.0)  # the oldest left the window, for both doors
