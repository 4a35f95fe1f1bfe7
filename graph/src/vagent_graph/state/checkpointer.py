"""The checkpointer as the service runs it: langgraph-checkpoint-redis's shallow saver (only
the latest checkpoint of each session), with the one memo it never empties bounded. What it
leaves behind in Redis after a run is pruned by end_of_run.py."""

from __future__ import annotations

from typing import Any, TypeVar

from langgraph.checkpoint.redis.ashallow import AsyncShallowRedisSaver
from langgraph.checkpoint.redis.jsonplus_redis import JsonPlusRedisSerializer
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


#: Constructor ids the serializer remembers the lookup of (messages, a few LangGraph types).
CONSTRUCTOR_CACHE_MAX = 256


class CheckpointSerializer(JsonPlusRedisSerializer):
    """The saver's serializer, with the class lookup behind each stored object remembered.

    Why: reading a checkpoint, JsonPlusRedisSerializer (langgraph-checkpoint-redis 0.5.x)
    imports the module named in every LangChain object's id before reviving it. A message's
    id names the legacy `langchain.schema.messages`, which is not installed, so every message
    of the history cost a failed import (a search of sys.path, ~55 µs) on every turn: 1.7-2.3
    ms of a turn's ~13 ms fixed CPU at ~24 messages, more up to the bound of 40
    (bench/README.md, issue 34). The lookup's answer, found or not, cannot change in a
    running process; the reviving itself stays the library's.

    On an upgrade of langgraph-checkpoint-redis: if it stops importing per object (the first
    test of tests/unit/test_checkpoint_serializer.py then fails on the library's own count),
    delete this class.
    """

    def __init__(self) -> None:
        super().__init__()
        self._constructors: dict[tuple[str, ...], type[Any] | ValueError] = {}

    def _constructor_class(self, obj: dict[str, Any]) -> type[Any]:
        parts = obj.get("id")
        key = None
        if isinstance(parts, list) and all(isinstance(p, str) for p in parts):
            key = tuple(parts)
        known = self._constructors.get(key) if key is not None else None
        if known is None:
            try:
                known = super()._constructor_class(obj)
            except ValueError as exc:
                known = exc
            if key is not None and len(self._constructors) < CONSTRUCTOR_CACHE_MAX:
                self._constructors[key] = known
        if isinstance(known, ValueError):
            raise ValueError(str(known))
        return known


async def open_checkpointer(redis: Redis, ttl_minutes: int) -> AsyncShallowRedisSaver:
    """The shallow saver on `redis` (checkpoints expire `ttl_minutes` after their last read),
    its key memo bounded, its indexes created."""
    saver = AsyncShallowRedisSaver(
        redis_client=redis,
        ttl={"default_ttl": ttl_minutes, "refresh_on_read": True},
    )
    saver._key_cache = BoundedKeyCache()  # unbounded in the library (see BoundedKeyCache)
    saver.serde = CheckpointSerializer()  # one import per class, not per message read
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
