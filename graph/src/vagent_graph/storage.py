"""Keep a session's Redis footprint flat.

The shallow Redis checkpointer keeps only the latest checkpoint, but (langgraph-checkpoint-redis
0.5.x) never deletes the pending-write keys of the checkpoints before it, nor their entries in
the thread's write-key sorted set: ~7 keys and ~10 KB more per turn. After each run, while the
session is still locked, the writes that do not belong to the latest checkpoint are removed.
"""

from __future__ import annotations

from typing import Any, ClassVar

from langgraph.checkpoint.redis.ashallow import AsyncShallowRedisSaver
from langgraph.checkpoint.redis.jsonplus_redis import JsonPlusRedisSerializer
from langgraph.checkpoint.redis.util import to_storage_safe_str
from redis.asyncio import Redis


def write_keys_zset(thread_id: str, checkpoint_ns: str = "") -> str:
    return f"write_keys_zset:{thread_id}:{to_storage_safe_str(checkpoint_ns)}:shallow"


def checkpoint_id_of_write_key(key: str) -> str:
    """`checkpoint_write:{thread}:{ns}:{checkpoint_id}:{task_id}:{idx}` -> checkpoint_id."""
    return key.rsplit(":", 3)[1]


async def prune_stale_writes(redis: Redis, saver: AsyncShallowRedisSaver, thread_id: str) -> int:
    """Delete pending writes of superseded checkpoints; returns how many keys went.

    Reads only the current checkpoint's id (JSON.GET of one field), not the checkpoint.
    """
    key = saver._make_shallow_redis_checkpoint_key_cached(thread_id, "")
    found: Any = await redis.json().get(key, "$.checkpoint_id")  # type: ignore[misc]
    if not isinstance(found, list) or not found:
        return 0
    current = str(found[0])
    zset = write_keys_zset(thread_id)
    members = [m.decode() if isinstance(m, bytes) else str(m) for m in await redis.zrange(zset, 0, -1)]
    stale = [m for m in members if checkpoint_id_of_write_key(m) != current]
    if stale:
        async with redis.pipeline(transaction=True) as p:
            p.delete(*stale)
            p.zrem(zset, *stale)
            await p.execute()
    return len(stale)


class CachingRedisSerializer(JsonPlusRedisSerializer):
    """The checkpointer's serializer, minus a per-message filesystem search.

    To revive each stored message it imports the module named in the LangChain envelope
    (`langchain.schema.messages`, which does not exist): a failed import searches sys.path
    every time, ~0.2 ms per message per load. The lookup result is the same every time, so
    it is cached (class or failure) per envelope id.
    """

    _classes: ClassVar[dict[tuple[str, ...], type[Any] | None]] = {}

    def _constructor_class(self, obj: dict[str, Any]) -> type[Any]:
        ident = obj.get("id")
        if not isinstance(ident, list) or not all(isinstance(p, str) for p in ident):
            return super()._constructor_class(obj)
        key = tuple(ident)
        if key not in self._classes:
            try:
                self._classes[key] = super()._constructor_class(obj)
            except ValueError:
                self._classes[key] = None
        cls = self._classes[key]
        if cls is None:
            raise ValueError(f"cannot import {'.'.join(key)}")
        return cls
