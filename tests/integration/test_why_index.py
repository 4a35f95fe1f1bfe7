"""The bot's index from its messages to their turn (🔍 / `!why` find the TurnTrace through it),
on a real Redis: written as the messages go out, with the traces' expiry, and never in the
way of the answer when Redis fails."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from redis_local import free_port
from vagent_bot.conversation.trace_store import TraceStore, TurnIndex
from vagent_shared import redis_keys
from vagent_shared.traces import TurnTrace

TTL = 3600


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def test_messages_are_indexed_under_their_turn_as_they_are_sent(redis: Redis) -> None:
    store = TraceStore(redis, TTL)
    sent: list[str] = ["$first"]
    index = TurnIndex(store, sent)
    await index.flush()  # no turn named yet: nothing to index
    assert await store.turn_for_event("$first") is None

    index.turn_id = "turn-1"
    await index.flush()
    sent += ["$question", "$image"]
    await index.flush()
    for event_id in sent:
        assert await store.turn_for_event(event_id) == "turn-1"
        assert 0 < await redis.ttl(redis_keys.trace_event(event_id)) <= TTL

    sid = "!r:localhost:main:@alice:localhost"
    await redis.zadd(redis_keys.trace_session(sid), {"turn-old": 1.0, "turn-new": 2.0})
    assert await store.last_turn(sid) == "turn-new"
    assert await store.last_turn("!r:localhost:main:@bob:localhost") is None

    trace = TurnTrace(turn_id="turn-new", session_id=sid, user_id="@alice:localhost")
    await redis.set(redis_keys.trace_turn("turn-new"), trace.model_dump_json())
    await redis.set(redis_keys.trace_turn("turn-old"), '{"not": "a trace"}')
    assert await store.load("turn-new") == trace
    assert await store.load("turn-old") is None  # unreadable: as good as gone
    assert await store.load("turn-gone") is None


async def test_a_redis_failure_never_breaks_the_answer() -> None:
    dead = Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=0.5)
    try:
        index = TurnIndex(TraceStore(dead, TTL), ["$answer"])
        index.turn_id = "turn-1"
        started = time.monotonic()
        await index.flush()  # logged, not raised
        assert time.monotonic() - started < 1.5  # nor does the answer wait long for it
    finally:
        await dead.aclose()
