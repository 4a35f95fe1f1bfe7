"""The session lock (vagent_graph.state.session_lock) on a real Redis: one holder per session,
each releases only its own lock, and taking it reads the pending-question hint."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from tests.support.factories import new_session
from vagent_graph.state import session_lock
from vagent_graph.state.session_lock import SessionBusy, SessionLock
from vagent_shared import redis_keys


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    r = Redis.from_url(redis_url)
    yield r
    await r.aclose()


async def test_one_holder_per_session(redis: Redis) -> None:
    sid, other = new_session().format(), new_session().format()
    results = await asyncio.gather(
        *(SessionLock.acquire(redis, sid, 60) for _ in range(10)), return_exceptions=True
    )
    locks = [r for r in results if isinstance(r, SessionLock)]
    assert len(locks) == 1 and all(isinstance(r, SessionBusy) for r in results if r not in locks)
    assert await redis.get(redis_keys.session_lock(sid)) == locks[0].token.encode()
    assert 0 < await redis.pttl(redis_keys.session_lock(sid)) <= 60_000  # expires if never released
    elsewhere = await SessionLock.acquire(redis, other, 60)  # other sessions are not blocked
    await locks[0].release()
    assert not await redis.exists(redis_keys.session_lock(sid))
    again = await SessionLock.acquire(redis, sid, 60)  # free again once released
    await again.release()
    await elsewhere.release()


async def test_a_lock_is_released_only_by_its_holder(redis: Redis) -> None:
    sid = new_session().format()
    expired = await SessionLock.acquire(redis, sid, 0.05)
    await asyncio.sleep(0.1)  # its TTL ran out (a run that took too long)...
    newer = await SessionLock.acquire(redis, sid, 60)  # ...and a newer run took the session
    await expired.release()  # the late release leaves the newer run's lock alone
    assert await redis.get(redis_keys.session_lock(sid)) == newer.token.encode()
    await newer.release()
    assert not await redis.exists(redis_keys.session_lock(sid))


async def test_taking_the_lock_reads_the_question_hint(redis: Redis) -> None:
    sid = new_session().format()
    lock = await SessionLock.acquire(redis, sid, 60)
    assert not lock.question_may_be_pending
    await lock.release()
    await redis.set(redis_keys.graph_question_pending(sid), "1", ex=60)
    lock = await SessionLock.acquire(redis, sid, 60)
    assert lock.question_may_be_pending
    await lock.release()
    await redis.delete(redis_keys.graph_question_pending(sid))


async def test_the_lock_is_a_renewed_lease(redis: Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """Held as long as the run goes on, but expiring soon after its holder is gone."""
    monkeypatch.setattr(session_lock, "LEASE_SECONDS", 1.0)
    monkeypatch.setattr(session_lock, "RENEW_EVERY_SECONDS", 0.2)
    sid, dead = new_session().format(), new_session().format()
    lock = await SessionLock.acquire(redis, sid, 600)
    gone = await SessionLock.acquire(redis, dead, 600)
    gone.stop_renewal()  # its holder died: nobody renews it
    await asyncio.sleep(2.5)
    assert await redis.exists(redis_keys.session_lock(sid))  # renewed past its lease
    assert not await redis.exists(redis_keys.session_lock(dead))  # free again after the lease
    again = await SessionLock.acquire(redis, dead, 600)
    await again.release()
    await lock.release()
    assert lock._renewal is None and not await redis.exists(redis_keys.session_lock(sid))


async def test_renewal_ends_when_the_lock_is_not_ours_and_never_outlives_the_bound(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session_lock, "LEASE_SECONDS", 0.6)
    monkeypatch.setattr(session_lock, "RENEW_EVERY_SECONDS", 0.1)
    sid, bounded = new_session().format(), new_session().format()
    lock = await SessionLock.acquire(redis, sid, 600)
    await redis.delete(redis_keys.session_lock(sid))  # unlocked elsewhere (end_of_run)
    assert lock._renewal is not None
    await asyncio.wait_for(lock._renewal, 5)  # stops by itself
    short = await SessionLock.acquire(redis, bounded, 1.0)
    assert short._renewal is not None
    await asyncio.wait_for(short._renewal, 5)
    assert not await redis.exists(redis_keys.session_lock(bounded))  # gone after its 1 s bound
