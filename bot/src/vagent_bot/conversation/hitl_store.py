"""Pending questions in Redis: saved with the question's timeout, consumed exactly once.

`hitl_pending:{session_id}` holds the question; `hitl_question:{event_id}` points from the
bot's question message to the session so a reaction can answer it. GETDEL makes the
answer atomic: two messages (or two bot processes) can never submit the same answer.
"""

from __future__ import annotations

from redis.asyncio import Redis

from vagent_shared import redis_keys
from vagent_shared.hitl import PendingQuestion


class HitlStore:
    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    async def save(self, pending: PendingQuestion, ttl_seconds: int) -> None:
        async with self.redis.pipeline(transaction=True) as p:
            p.set(redis_keys.hitl_pending(pending.session_id), pending.model_dump_json(), ex=ttl_seconds)
            if pending.question_event_id:
                p.set(redis_keys.hitl_question(pending.question_event_id), pending.session_id, ex=ttl_seconds)
            await p.execute()

    async def peek(self, session_id: str) -> PendingQuestion | None:
        raw = await self.redis.get(redis_keys.hitl_pending(session_id))
        return PendingQuestion.model_validate_json(raw) if raw else None

    async def consume(self, session_id: str) -> PendingQuestion | None:
        """Take the question; None if it expired or someone else took it first."""
        raw = await self.redis.getdel(redis_keys.hitl_pending(session_id))
        if not raw:
            return None
        pending = PendingQuestion.model_validate_json(raw)
        if pending.question_event_id:
            await self.redis.delete(redis_keys.hitl_question(pending.question_event_id))
        return pending

    async def session_for_question(self, event_id: str) -> str | None:
        raw = await self.redis.get(redis_keys.hitl_question(event_id))
        return raw.decode() if isinstance(raw, bytes) else raw

    async def drop(self, session_id: str) -> None:
        await self.consume(session_id)
