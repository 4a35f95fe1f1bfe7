"""The session lock reads the checkpoint in the same round trip, and the checkpointer is
served that read (vagent_graph.session_lock, vagent_graph.locked_read), on a real Redis."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from vagent_graph.locked_read import Prefetched, PrefetchingRedis, answer, hold_reads, offer
from vagent_graph.session_lock import SessionBusy, SessionLock
from vagent_shared import redis_keys


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    r = Redis.from_url(redis_url)
    yield r
    await r.aclose()


def ids() -> tuple[str, str]:
    sid = f"!r{uuid.uuid4().hex[:8]}:localhost:main:@u:localhost"
    return sid, f"checkpoint:{sid}:"


async def test_the_lock_brings_the_checkpoint_and_refreshes_its_ttl(redis: Redis) -> None:
    sid, key = ids()
    await redis.json().set(key, "$", {"checkpoint": {"id": "c1"}, "n": 1})  # type: ignore[misc]
    await redis.expire(key, 5)
    lock = await SessionLock.acquire(redis, sid, 60, key, 3600)
    assert lock.checkpoint is not None and lock.checkpoint.raw is not None
    assert json.loads(lock.checkpoint.raw) == {"checkpoint": {"id": "c1"}, "n": 1}
    assert lock.checkpoint.ttl_refreshed and await redis.ttl(key) > 3000
    assert await redis.get(redis_keys.session_lock(sid)) == lock.token.encode()
    with pytest.raises(SessionBusy):  # and a second taker learns nothing
        await SessionLock.acquire(redis, sid, 60, key, 3600)
    await lock.release()
    assert not await redis.exists(redis_keys.session_lock(sid))


async def test_a_new_session_brings_no_checkpoint_and_no_key(redis: Redis) -> None:
    sid, key = ids()
    lock = await SessionLock.acquire(redis, sid, 60, key, 3600)
    assert lock.checkpoint == Prefetched(key, None, ttl_refreshed=False)
    assert not await redis.exists(key)  # reading it did not create it
    await lock.release()


async def test_an_unreadable_checkpoint_still_hands_over_the_lock(redis: Redis) -> None:
    """The read is a pcall: whatever goes wrong there, the lock is held and reported as
    held, so it is released (a lock taken but reported as an error would stay for its TTL)."""
    sid, key = ids()
    await redis.set(key, "not json")  # a key of the wrong type: JSON.GET fails
    lock = await SessionLock.acquire(redis, sid, 60, key, 3600)
    assert lock.checkpoint is None  # nothing prefetched: the checkpointer reads (and fails) itself
    assert await redis.exists(redis_keys.session_lock(sid))
    await lock.release()
    assert not await redis.exists(redis_keys.session_lock(sid))


def test_only_the_checkpointers_read_of_that_key_is_answered_and_only_once() -> None:
    pre = Prefetched("checkpoint:s:", b'{"a": 1}', ttl_refreshed=True)
    assert answer(pre, ("JSON.GET", "checkpoint:other:", ".")) == (False, None)
    assert answer(pre, ("JSON.GET", "checkpoint:s:", "$.checkpoint_id")) == (False, None)
    assert answer(pre, ("EXPIRE", "checkpoint:s:", 60)) == (False, None)  # not before the read
    assert answer(pre, ("JSON.SET", "checkpoint:s:", "$", "{}")) == (False, None)
    assert answer(pre, ("JSON.GET", "checkpoint:s:", ".")) == (True, {"a": 1})
    assert answer(pre, ("JSON.GET", "checkpoint:s:", ".")) == (False, None)  # once
    assert answer(pre, ("EXPIRE", b"checkpoint:s:", 60)) == (True, True)  # the refresh after it
    assert answer(pre, ("EXPIRE", "checkpoint:s:", 60)) == (False, None)


async def test_a_prefetched_read_is_served_in_its_own_run_only(redis: Redis, redis_url: str) -> None:
    _, key = ids()
    await redis.json().set(key, "$", {"where": "redis"})  # type: ignore[misc]
    client = PrefetchingRedis.from_url(redis_url)
    try:
        other: asyncio.Future[object] = asyncio.get_running_loop().create_future()

        async def another_run() -> None:
            await asyncio.sleep(0.01)  # reads after the first run was offered its copy
            other.set_result(await client.json().get(key))  # type: ignore[misc]

        task = asyncio.create_task(another_run())  # its context was copied before the offer
        offer(Prefetched(key, b'{"where": "lock"}', ttl_refreshed=False))
        assert await client.json().get(key) == {"where": "lock"}  # type: ignore[misc]
        assert await client.json().get(key) == {"where": "redis"}  # type: ignore[misc]  # once only
        await task
        assert other.result() == {"where": "redis"}
    finally:
        await client.aclose()


async def test_reads_held_for_a_lock_fail_with_its_refusal_and_touch_nothing(redis_url: str) -> None:
    _, key = ids()
    client = PrefetchingRedis.from_url(redis_url)
    try:
        opening: asyncio.Future[Prefetched | None] = asyncio.get_running_loop().create_future()

        async def refused_run() -> None:
            hold_reads(opening)  # in this run's task only
            await client.set(key, "written")

        write = asyncio.create_task(refused_run())
        await asyncio.sleep(0.05)
        assert not write.done()  # waits for the lock
        opening.set_exception(SessionBusy("s"))
        with pytest.raises(SessionBusy):
            await write
        assert await client.exists(key) == 0  # the refused run never reached Redis
    finally:
        await client.aclose()
