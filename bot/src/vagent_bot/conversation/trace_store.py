"""The bot's side of the stored turn traces (docs/traces.md): which turn each of its messages
belongs to, and reading a turn's TurnTrace back for 🔍 / `!why`.

The graph stores the TurnTrace (`trace_turn`) and the session's turns (`trace_session`); only
the bot knows the Matrix event ids of the messages it posted, so it writes the pointer from
each one to its turn (`trace_event`), like `hitl_question` points from a question to its
session. Indexing is best effort: a Redis failure is logged and never breaks the answer
(the account is then unavailable for that message, nothing else).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Final

import structlog
from redis.asyncio import Redis

from vagent_shared import redis_keys
from vagent_shared.traces import TurnTrace, stored_trace

log = structlog.get_logger(__name__)

#: The answer waits at most this long for its index (Redis slow or down: no account, that's all).
INDEX_TIMEOUT_SECONDS: Final = 1.0


def _text(raw: bytes | str | None) -> str | None:
    return raw.decode() if isinstance(raw, bytes) else raw


class TraceStore:
    def __init__(self, redis: Redis, ttl_seconds: int) -> None:
        self.redis, self.ttl_seconds = redis, ttl_seconds

    async def remember(self, turn_id: str, event_ids: Sequence[str]) -> None:
        """Point each of the bot's messages at its turn, for as long as traces are kept. Never raises."""
        if not event_ids:
            return
        try:
            async with asyncio.timeout(INDEX_TIMEOUT_SECONDS), self.redis.pipeline(transaction=False) as p:
                for event_id in event_ids:
                    p.set(redis_keys.trace_event(event_id), turn_id, ex=self.ttl_seconds)
                await p.execute()
        except Exception as exc:  # the answer matters more than its account
            log.warning("trace_index_failed", turn_id=turn_id, error_type=type(exc).__name__)

    async def turn_for_event(self, event_id: str) -> str | None:
        return _text(await self.redis.get(redis_keys.trace_event(event_id)))

    async def last_turn(self, session_id: str) -> str | None:
        """The session's latest turn (the sorted set is scored by start time)."""
        newest = await self.redis.zrevrange(redis_keys.trace_session(session_id), 0, 0)
        first = newest[0] if newest else None
        return _text(first) if isinstance(first, bytes | str) else None

    async def load(self, turn_id: str) -> TurnTrace | None:
        """The stored trace; None when it expired, was forgotten or cannot be read."""
        return stored_trace(await self.redis.get(redis_keys.trace_turn(turn_id)))


class TurnIndex:
    """One answer's messages (`sent`: `Answer.sent_event_ids`, growing while it is written),
    indexed under the turn the graph named (`TurnStarted`) as soon as both are known."""

    def __init__(self, store: TraceStore, sent: list[str]) -> None:
        self.store, self.sent = store, sent
        self.turn_id: str | None = None
        self._indexed = 0

    async def flush(self) -> None:
        """Index the messages sent since the last call (cheap when there are none)."""
        if self.turn_id is None or self._indexed >= len(self.sent):
            return
        new = self.sent[self._indexed :]
        self._indexed = len(self.sent)
        await self.store.remember(self.turn_id, new)
