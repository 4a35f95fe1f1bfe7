"""Claimed events are leased until the bot finishes them (vagent_bot.matrix.sync, real Redis): a bot
that dies before finishing leaves them to the next one once the lease runs out, never sooner
and never to two bots; finished or never-for-the-bot events are left to nobody."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import pytest
from nio import AsyncClient
from nio.events import Event
from redis.asyncio import Redis

from vagent_bot.matrix.sync import SyncHandler
from vagent_bot.matrix.tenants import Tenants
from vagent_shared import redis_keys
from vagent_shared.settings import BotSettings

ROOM = "!room:localhost"
pytestmark = pytest.mark.timeout(30)


class FakeClient:
    def __init__(self, user_id: str) -> None:
        self.user_id = user_id


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    r = Redis.from_url(redis_url)
    yield r
    await r.aclose()


@pytest.fixture
def bot_user() -> str:
    return f"@bot{uuid.uuid4().hex[:8]}:localhost"


Handler = tuple[SyncHandler, list[tuple[str, dict[str, Any]]]]


@pytest.fixture
def new_handler(redis: Redis, bot_user: str) -> Callable[[], Handler]:
    """A bot process's SyncHandler (lease: 1 s) and the events it delivered."""

    def make() -> Handler:
        delivered: list[tuple[str, dict[str, Any]]] = []
        settings = BotSettings(MATRIX_USER=bot_user, EVENT_LEASE_SECONDS=1)
        handler = SyncHandler(
            settings,
            cast(AsyncClient, FakeClient(bot_user)),
            redis,
            cast(Tenants, None),
            on_event=lambda room, ev: delivered.append((room, ev.source)),
            on_invite=lambda room, state: asyncio.sleep(0),
            spawn=lambda coro: coro.close(),
        )
        return handler, delivered

    return make


def message(body: str, sender: str = "@alice:localhost") -> Any:
    return Event.parse_event(
        {
            "type": "m.room.message",
            "event_id": f"${uuid.uuid4().hex}",
            "sender": sender,
            "origin_server_ts": 1,
            "content": {"msgtype": "m.text", "body": body},
        }
    )


async def unfinished(redis: Redis, bot_user: str) -> list[str]:
    members = await redis.zrange(redis_keys.events_unfinished(bot_user), 0, -1)
    return [m.decode() if isinstance(m, bytes) else str(m) for m in members]


async def test_a_finished_event_is_left_to_nobody(
    new_handler: Callable[[], Handler], redis: Redis, bot_user: str
) -> None:
    (a, _), (b, got_b) = new_handler(), new_handler()
    ev = message("hi")
    assert await a._claim(ROOM, [ev]) == [True]
    assert await b._claim(ROOM, [ev]) == [False]  # claimed once
    assert await unfinished(redis, bot_user) == [ev.event_id]
    await a.finished(ev.event_id)
    assert await unfinished(redis, bot_user) == []
    assert not await redis.exists(redis_keys.event_unfinished(ev.event_id))
    await asyncio.sleep(1.2)
    await b._take_over()
    assert got_b == []


async def test_a_dead_bots_event_is_taken_over_once_its_lease_ran_out(
    new_handler: Callable[[], Handler], redis: Redis, bot_user: str
) -> None:
    (dead, _), (b, got_b), (c, got_c) = new_handler(), new_handler(), new_handler()
    ev = message("answer me")
    await dead._claim(ROOM, [ev])  # ...and the process is killed before it finishes
    await b._take_over()
    assert got_b == []  # not while the lease runs
    await asyncio.sleep(1.2)
    await asyncio.gather(b._take_over(), c._take_over())
    assert [room for room, _ in got_b + got_c] == [ROOM]  # exactly one bot took it over
    taker = b if got_b else c
    assert (got_b + got_c)[0][1] == ev.source
    assert ev.event_id in taker.held
    await taker.finished(ev.event_id)
    assert await unfinished(redis, bot_user) == []


async def test_a_live_bot_keeps_its_events_by_renewing_the_lease(
    new_handler: Callable[[], Handler], redis: Redis, bot_user: str
) -> None:
    (a, got_a), (b, got_b) = new_handler(), new_handler()
    ev = message("slow answer")
    await a._claim(ROOM, [ev])
    a.last_sync = b.last_sync = 1.0  # both synced: both take over what is due
    renewing = asyncio.create_task(a.keep_leases())
    try:
        await asyncio.sleep(2.5)  # more than two leases
        await b._take_over()
        assert got_b == [] and got_a == []  # a keeps it, and does not hand it to itself again
    finally:
        renewing.cancel()


async def test_own_and_non_message_events_are_not_leased(
    new_handler: Callable[[], Handler], redis: Redis, bot_user: str
) -> None:
    (a, _) = new_handler()
    own = message("my own answer", sender=bot_user)
    state = Event.parse_event(
        {
            "type": "m.room.topic",
            "event_id": f"${uuid.uuid4().hex}",
            "sender": "@alice:localhost",
            "origin_server_ts": 1,
            "state_key": "",
            "content": {"topic": "x"},
        }
    )
    assert await a._claim(ROOM, [own, state]) == [True, True]
    assert await unfinished(redis, bot_user) == [] and a.held == set()
