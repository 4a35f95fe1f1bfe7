"""After each run: keep a session's Redis footprint flat, and unlock it.

The shallow Redis checkpointer keeps only the latest checkpoint, but (langgraph-checkpoint-redis
0.5.x) never deletes the pending-write keys of the checkpoints before it, nor their entries in
the thread's write-key sorted set: ~7 keys and ~10 KB more per turn. After each run, while the
session is still locked, the writes that do not belong to the latest checkpoint are removed
(write keys are `checkpoint_write:{thread}:{ns}:{checkpoint_id}:{task_id}:{idx}`).
"""

from __future__ import annotations

from langgraph.checkpoint.redis.ashallow import AsyncShallowRedisSaver
from langgraph.checkpoint.redis.util import to_storage_safe_str
from redis.asyncio import Redis

from vagent_graph.state.session_lock import SessionLock
from vagent_shared import redis_keys


def checkpoint_key(saver: AsyncShallowRedisSaver, thread_id: str) -> str:
    """Where the shallow checkpointer keeps the thread's (only) checkpoint."""
    return saver._make_shallow_redis_checkpoint_key_cached(thread_id, "")


def write_keys_zset(thread_id: str, checkpoint_ns: str = "") -> str:
    return f"write_keys_zset:{thread_id}:{to_storage_safe_str(checkpoint_ns)}:shallow"


#: After a run, in ONE round trip and while the session is still locked: delete the write
#: keys of superseded checkpoints, record whether a question now waits (the lock's hint),
#: and release the lock if it is still ours. The prune is best effort (pcall): a failure
#: there must never keep the session locked.
#: KEYS: checkpoint, write-key zset, question hint, lock. ARGV: "1"/"0"/"" (question waits /
#: not / unknown), hint TTL seconds, lock token. Returns the number of write keys deleted.
_END_OF_RUN = """
local removed = 0
local ok, found = pcall(redis.call, 'JSON.GET', KEYS[1], '$.checkpoint_id')
if ok and found then
  local current = cjson.decode(found)[1]
  if current then
    local stale = {}
    for _, member in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
      if string.match(member, ':([^:]*):[^:]*:[^:]*$') ~= current then
        stale[#stale + 1] = member
      end
    end
    for i = 1, #stale, 1000 do
      local part = {unpack(stale, i, math.min(i + 999, #stale))}
      redis.call('DEL', unpack(part))
      redis.call('ZREM', KEYS[2], unpack(part))
    end
    removed = #stale
  end
end
if ARGV[1] == '1' then
  redis.call('SET', KEYS[3], '1', 'EX', ARGV[2])
elseif ARGV[1] == '0' then
  redis.call('DEL', KEYS[3])
end
if redis.call('GET', KEYS[4]) == ARGV[3] then
  redis.call('DEL', KEYS[4])
end
return removed
"""


async def end_of_run(
    redis: Redis,
    saver: AsyncShallowRedisSaver,
    lock: SessionLock,
    question_waits: bool | None,
    hint_ttl_seconds: int,
) -> int:
    """Prune stale writes, set the question hint (None: leave it), unlock; one round trip.
    Returns how many write keys went."""
    lock.stop_renewal()
    thread_id = lock.session_id
    keys = [
        checkpoint_key(saver, thread_id),
        write_keys_zset(thread_id),
        redis_keys.graph_question_pending(thread_id),
        redis_keys.session_lock(thread_id),
    ]
    hint = "" if question_waits is None else ("1" if question_waits else "0")
    removed = await redis.register_script(_END_OF_RUN)(keys, [hint, hint_ttl_seconds, lock.token])
    return int(removed)
