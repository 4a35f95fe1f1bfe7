"""The checkpointer as the service runs it: langgraph-checkpoint-redis's shallow saver (only
the latest checkpoint of each session), with the one memo it never empties bounded. What it
leaves behind in Redis after a run is pruned by end_of_run.py."""

from __future__ import annotations

from typing import TypeVar

from langgraph.checkpoint.redis.ashallow import AsyncShallowRedisSaver
from redis.asyncio import Redis
from redisvl.exceptions import RedisSearchError

K = TypeVar("K")
V = TypeVar("V")

#: Entries the checkpointer's key cache may hold (the synchronous RedisSaver's own limit).
KEY_CACHE_MAX = 1000
#: Index creations lost to another replica that we retry (the saver creates three).
SETUP_ATTEMPTS = 4


class BoundedKeyCache(dict[K, V]):
    """The checkpointer's key-name cache, bounded: emptied when full.

    Why: AsyncShallowRedisSaver (langgraph-checkpoint-redis 0.5.x) memoises every key name it
    builds in `_key_cache`, one to three per thread and run, and never evicts (its sync
    sibling stops at 1000). A process that parks 10 000 confirmations kept them all: the
    graph's RSS grew with the number of sessions waiting for people (bench-capacity). The
    names are cheap to rebuild; only the memo is bounded, so nothing is held per session.
    """

    def __init__(self, max_entries: int = KEY_CACHE_MAX) -> None:
        super().__init__()
        self.max_entries = max_entries

    def __setitem__(self, key: K, value: V) -> None:
        if len(self) >= self.max_entries and key not in self:
            self.clear()
        super().__setitem__(key, value)


async def open_checkpointer(redis: Redis, ttl_minutes: int) -> AsyncShallowRedisSaver:
    """The shallow saver on `redis` (checkpoints expire `ttl_minutes` after their last read),
    its key memo bounded, its indexes created."""
    saver = AsyncShallowRedisSaver(
        redis_client=redis,
        ttl={"default_ttl": ttl_minutes, "refresh_on_read": True},
    )
    saver._key_cache = BoundedKeyCache()  # unbounded in the library (see BoundedKeyCache)
    await set_up_indexes(saver)
    return saver


async def set_up_indexes(saver: AsyncShallowRedisSaver) -> None:
    """The saver's search indexes, also when replicas start at the same moment on a new Redis.

    Why: asetup checks whether each index exists, then creates it; a replica that loses that
    race got "Index already exists" and exited at startup. Another try sees the index."""
    for attempt in range(1, SETUP_ATTEMPTS + 1):
        try:
            await saver.asetup()
            return
        except RedisSearchError as exc:
            if "already exists" not in str(exc) or attempt == SETUP_ATTEMPTS:
                raise
