"""Where TurnTraces live (docs/traces.md): one JSON key per turn, and three sorted-set
indexes scored by the turn's start (its session, its user, all turns), every one of them
expiring after TRACE_TTL_SECONDS. The bot adds `trace:event:{event}` -> turn id pointers
for its messages; `resolve` follows them.

Why sorted sets and not SCAN: `vagent trace list --user` and `/admin/v1/traces` read one
user's (or everyone's) newest turns in one ZRANGE, and a set's members older than the TTL
(whose traces have expired) are trimmed on every write, so an index never grows beyond a
TTL's worth of turns. Storing is best effort: a trace that cannot be written is logged and
lost; the request it describes never fails because of it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import cast

import structlog
from redis.asyncio import Redis

from vagent_shared import redis_keys
from vagent_shared.traces import TurnOutcome, TurnTrace, stored_trace

log = structlog.get_logger(__name__)

#: A turn id as the graph makes them (uuid4 hex); anything else is looked up as an event id.
_TURN_ID = re.compile(r"[0-9a-f]{32}")
#: Most traces one list returns.
MAX_LIMIT = 1000


def is_turn_id(text: str) -> bool:
    return _TURN_ID.fullmatch(text) is not None


@dataclass(frozen=True)
class TraceFilter:
    """What `list` returns: a user's (or everyone's) turns from `since` on, of one outcome,
    the newest `limit` of them."""

    user: str | None = None
    since: datetime | None = None
    outcome: TurnOutcome | None = None
    limit: int = 50

    def matches(self, trace: TurnTrace) -> bool:
        return (self.user is None or trace.user_id == self.user) and (
            self.outcome is None or trace.outcome == self.outcome
        )


def index_keys(trace: TurnTrace) -> tuple[str, str, str]:
    """The sorted sets a trace is indexed in: its session's, its user's, everyone's."""
    session, user = redis_keys.trace_session(trace.session_id), redis_keys.trace_user(trace.user_id)
    return session, user, redis_keys.TRACES_ALL


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class TraceStore:
    """TurnTraces in Redis (async: the API, the admin API and `vagent trace` use it)."""

    def __init__(self, redis: Redis, ttl_seconds: int) -> None:
        self.redis, self.ttl = redis, ttl_seconds

    async def save(self, trace: TurnTrace) -> bool:
        """Write (or overwrite) the trace and index it; False (logged) when Redis failed."""
        score = trace.started_at.timestamp()
        oldest = time.time() - self.ttl
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.set(redis_keys.trace_turn(trace.turn_id), trace.model_dump_json(), ex=self.ttl)
            for key in index_keys(trace):
                pipe.zadd(key, {trace.turn_id: score})
                pipe.zremrangebyscore(key, "-inf", f"({oldest}")
                pipe.expire(key, self.ttl)
            await pipe.execute()
        except Exception as exc:  # the trace is lost; the turn it describes is not
            log.warning("trace_save_failed", turn_id=trace.turn_id, error_type=type(exc).__name__)
            return False
        return True

    async def load(self, turn_id: str) -> TurnTrace | None:
        return stored_trace(await self.redis.get(redis_keys.trace_turn(turn_id)))

    async def resolve(self, ref: str) -> TurnTrace | None:
        """The trace of a turn id, or of the bot's Matrix event id (its answer or question)."""
        if is_turn_id(ref):
            found = await self.load(ref)
            if found is not None:
                return found
        turn = await self.redis.get(redis_keys.trace_event(ref))
        return None if turn is None else await self.load(_text(turn))

    async def recent(self, flt: TraceFilter) -> list[TurnTrace]:
        """The newest matching traces first. The outcome is checked on the traces read, so
        with --outcome more ids are read (in pages) until `limit` match or none are left."""
        key = redis_keys.trace_user(flt.user) if flt.user else redis_keys.TRACES_ALL
        low = f"{flt.since.timestamp()}" if flt.since else "-inf"
        limit = max(1, min(flt.limit, MAX_LIMIT))
        found: list[TurnTrace] = []
        offset, page = 0, limit if flt.outcome is None else max(limit, 100)
        while len(found) < limit:
            ids = cast(
                "list[bytes]", await self.redis.zrevrangebyscore(key, "+inf", low, start=offset, num=page)
            )
            if not ids:
                break
            offset += len(ids)
            found += [t for t in await self._many(ids) if flt.matches(t)]
            if len(ids) < page:
                break
        return found[:limit]

    async def _many(self, ids: Sequence[bytes | str]) -> list[TurnTrace]:
        raws = await self.redis.mget([redis_keys.trace_turn(_text(i)) for i in ids])
        return [t for t in (stored_trace(r) for r in raws) if t is not None]


def turn_ids(members: Iterable[bytes | str]) -> list[str]:
    """Sorted-set members as turn ids (erasure reads them)."""
    return [_text(m) for m in members]
