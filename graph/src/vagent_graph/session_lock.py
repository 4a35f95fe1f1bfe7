"""One run per session across all graph replicas, in one Redis round trip.

Taking the lock also reads a hint: is a question of this session possibly pending? Only
then does a new message pay for loading the checkpoint to close that question. The hint
is an optimisation: without it, a dangling tool call is still answered as cancelled in
what the LLM sees (history.repair_tool_pairs).

Given the checkpoint's key, the same round trip also reads the checkpoint and refreshes its
TTL, as the checkpointer would right after (locked_read.py serves that read). It is read
after the lock is taken, so it is exactly what the checkpointer would have read.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from redis.asyncio import Redis

from vagent_graph.locked_read import Prefetched
from vagent_shared import redis_keys

#: Returns {0} when busy, else {1 + question hint, checkpoint read?, checkpoint JSON or nil}.
#: One script (EVALSHA) is one command: cheaper than a pipeline on the request path. The
#: read is a pcall: whatever happens there, the caller learns that it holds the lock.
#: KEYS: lock, question hint[, checkpoint]. ARGV: token, lock TTL ms[, checkpoint TTL s].
_ACQUIRE = """
if not redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {0}
end
local taken = 1 + redis.call('exists', KEYS[2])
if not KEYS[3] then
  return {taken, 0}
end
local ok, doc = pcall(redis.call, 'JSON.GET', KEYS[3])
if not ok then
  return {taken, 0}
end
if doc and tonumber(ARGV[3]) > 0 then
  redis.call('expire', KEYS[3], ARGV[3])
end
return {taken, 1, doc}
"""
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


class SessionBusy(Exception):
    pass


@dataclass
class SessionLock:
    redis: Redis
    session_id: str
    token: str
    question_may_be_pending: bool
    #: The checkpoint as read with the lock (when its key was given and the read worked).
    checkpoint: Prefetched | None = None

    @classmethod
    async def acquire(
        cls,
        redis: Redis,
        session_id: str,
        ttl_seconds: float,
        checkpoint_key: str | None = None,
        checkpoint_ttl_seconds: int = 0,
    ) -> SessionLock:
        token = uuid.uuid4().hex
        keys = [redis_keys.session_lock(session_id), redis_keys.graph_question_pending(session_id)]
        args: list[str | int] = [token, int(ttl_seconds * 1000)]
        if checkpoint_key is not None:
            keys.append(checkpoint_key)
            args.append(checkpoint_ttl_seconds)
        reply = await redis.register_script(_ACQUIRE)(keys, args)
        taken = int(reply[0])
        if not taken:
            raise SessionBusy(session_id)
        checkpoint = None
        if checkpoint_key is not None and int(reply[1]):
            doc = reply[2] if len(reply) > 2 else None
            refreshed = doc is not None and checkpoint_ttl_seconds > 0
            checkpoint = Prefetched(checkpoint_key, doc, ttl_refreshed=refreshed)
        return cls(redis, session_id, token, taken == 2, checkpoint)

    async def release(self) -> None:
        """Only our own lock: an expired one may belong to a newer run by now."""
        await self.redis.register_script(_RELEASE)([redis_keys.session_lock(self.session_id)], [self.token])
