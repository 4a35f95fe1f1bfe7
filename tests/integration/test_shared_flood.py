"""The shared flood control (`vagent_shared.flood`) as the gateway will use it, against a real
Redis: its refusal hook is the service's metric, and the bot's and another service's instances
share one window per person (the same `redis_keys.flood` key), so switching doors gains nothing."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from prometheus_client import REGISTRY
from redis.asyncio import Redis

from vagent_bot.flood import BotFloodControl
from vagent_shared import redis_keys
from vagent_shared.flood import FloodControl


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


def user() -> str:
    return f"@u{uuid.uuid4().hex[:10]}:example.org"


def bot_rejected() -> float:
    return REGISTRY.get_sample_value("vagent_bot_flood_rejected_total") or 0.0


async def test_the_refusal_hook_is_called_once_per_refused_message(redis: Redis) -> None:
    refused: list[None] = []
    flood, u = FloodControl(redis, 2, 10, on_rejected=lambda: refused.append(None)), user()
    assert [await flood.allow(u, now=t) for t in (1.0, 2.0, 3.0, 4.0)] == [True, True, False, False]
    assert len(refused) == 2


async def test_without_a_hook_the_bots_metric_is_untouched(redis: Redis) -> None:
    """Another service's refusals must not show up as the bot's."""
    flood, u = FloodControl(redis, 1, 10), user()
    before = bot_rejected()
    assert await flood.allow(u, now=1.0)
    assert not await flood.allow(u, now=2.0)
    assert bot_rejected() == before


async def test_matrix_and_another_door_count_in_one_window_per_person(redis: Redis) -> None:
    """3 a window: two through the bot and one through the gateway use it up, on either side."""
    bot, gateway, u = BotFloodControl(redis, 3, 60), FloodControl(redis, 3, 60), user()
    before = bot_rejected()
    assert await bot.allow(u, now=1.0)
    assert await gateway.allow(u, now=2.0)
    assert await bot.allow(u, now=3.0)
    assert not await gateway.allow(u, now=4.0)
    assert not await bot.allow(u, now=5.0)
    assert bot_rejected() == before + 1  # only the bot's own refusal is the bot's
    assert await redis.zcard(redis_keys.flood(u)) == 3
    assert await gateway.allow(u, now=61.0)  # the oldest left the window, for both doors
