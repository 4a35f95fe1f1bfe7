"""One run per session across all graph replicas, in one Redis round trip.

Taking the lock also reads a hint: is a question of this session possibly pending? Only
then does a new message pay for loading the checkpoint to close that question. The hint
is an optimisation: without it, a dangling tool call is still answered as cancelled in
what the LLM sees (history.repair_tool_pairs).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from redis.asyncio import Redis

from vagent_shared import redis_keys

#: Returns 0 when busy, else 1 + question hint. One script (EVALSHA) is one command.
#: KEYS: lock, question hint. ARGV: token, lock TTL ms.
_ACQUIRE = """
if not redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 0
end
return 1 + redis.call('exists', KEYS[2])
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

    @classmethod
    async def acquire(cls, redis: Redis, session_id: str, ttl_seconds: float) -> SessionLock:
        token = uuid.uuid4().hex
        keys = [redis_keys.session_lock(session_id), redis_keys.graph_question_pending(session_id)]
        taken = int(await redis.register_script(_ACQUIRE)(keys, [token, int(ttl_seconds * 1000)]))
        if not taken:
            raise SessionBusy(session_id)
        return cls(redis, session_id, token, taken == 2)

    async def release(self) -> None:
        """Only our own lock: an expired one may belong to a newer run by now."""
        await self.redis.register_script(_RELEASE)([redis_keys.session_lock(self.session_id)], [self.token])
