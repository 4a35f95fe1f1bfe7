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
        async with redis.pipeline(transaction=False) as p:
            p.set(redis_keys.session_lock(session_id), token, nx=True, px=int(ttl_seconds * 1000))
            p.exists(redis_keys.graph_question_pending(session_id))
            got, pending = await p.execute()
        if not got:
            raise SessionBusy(session_id)
        return cls(redis, session_id, token, bool(pending))

    async def release(self) -> None:
        """Only our own lock: an expired one may belong to a newer run by now."""
        await self.redis.eval(_RELEASE, 1, redis_keys.session_lock(self.session_id), self.token)  # type: ignore[misc]

    async def mark_question(self, pending: bool, ttl_seconds: int) -> None:
        key = redis_keys.graph_question_pending(self.session_id)
        if pending:
            await self.redis.set(key, "1", ex=ttl_seconds)
        else:
            await self.redis.delete(key)
