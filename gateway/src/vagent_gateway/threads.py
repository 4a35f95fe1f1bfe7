"""The thread index in Redis: who owns each gateway thread, and what its values are.

Why a session per thread: a thread is a conversation of its own in the graph, whose only
reader is its owner. Its session id uses a synthetic room id (`!gw_<hex>:gateway.invalid`,
`.invalid` is reserved, so no homeserver can ever have such a room) and no audience, so
the graph applies DM rules: documents, personal results and memory only for the owner.

The values kept are the user's messages and the final answers (never tool calls or their
results), and the pending confirmation, so a thread can be read and resumed from any replica.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final, Literal

from pydantic import BaseModel, Field
from redis.asyncio import Redis

from vagent_shared import redis_keys
from vagent_shared.events import HitlRequest
from vagent_shared.session import SessionId

#: The reserved top-level domain of synthetic rooms (RFC 2606: never resolvable).
ROOM_SERVER: Final = "gateway.invalid"
#: Messages a thread keeps (the oldest are dropped beyond).
MAX_MESSAGES: Final = 500

ThreadStatus = Literal["idle", "busy", "interrupted", "error"]


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


def parse_thread_id(value: str) -> str | None:
    """The canonical form of a thread id (a UUID), or None: anything else is never a thread."""
    try:
        return str(uuid.UUID(value))
    except ValueError:
        return None


def session_for(thread_id: str, owner: str) -> SessionId:
    """The graph session of a thread: its own synthetic room, the main timeline, the owner."""
    return SessionId(room_id=f"!gw_{uuid.UUID(thread_id).hex}:{ROOM_SERVER}", user_id=owner)


class ThreadRecord(BaseModel):
    """One thread as stored under `gateway_thread(thread_id)`."""

    thread_id: str
    owner: str
    tenant: str
    created_at: str = Field(default_factory=now_iso)
    updated_at: str = Field(default_factory=now_iso)
    metadata: dict[str, Any] = Field(default_factory=dict)
    status: ThreadStatus = "idle"
    messages: list[dict[str, Any]] = Field(default_factory=list)
    #: The confirmation waiting for the owner's answer (its interrupt_id goes to submit_feedback).
    pending: HitlRequest | None = None
    #: Changes with every saved change: the `checkpoint_id` clients see.
    checkpoint_id: str = Field(default_factory=lambda: str(uuid.uuid4()))

    @property
    def session(self) -> SessionId:
        return session_for(self.thread_id, self.owner)

    def touch(self) -> None:
        self.updated_at = now_iso()
        self.checkpoint_id = str(uuid.uuid4())
        if len(self.messages) > MAX_MESSAGES:
            del self.messages[: len(self.messages) - MAX_MESSAGES]


def metadata_matches(metadata: Mapping[str, Any], wanted: Mapping[str, Any] | None) -> bool:
    """LangGraph's metadata filter: every wanted key present with an equal value."""
    return all(k in metadata and metadata[k] == v for k, v in (wanted or {}).items())


class ThreadStore:
    """Threads in Redis, always read through their owner: another person's thread is absent."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    async def create(
        self, owner: str, tenant: str, metadata: dict[str, Any], thread_id: str | None = None
    ) -> ThreadRecord:
        """A new thread (with a client's `thread_id`: only if no thread has it, else
        ThreadExists; SET NX makes two creations of one id safe)."""
        record = ThreadRecord(
            thread_id=thread_id or str(uuid.uuid4()), owner=owner, tenant=tenant, metadata=metadata
        )
        if not await self.redis.set(
            redis_keys.gateway_thread(record.thread_id), record.model_dump_json(), nx=True
        ):
            raise ThreadExists(record.thread_id)
        await self.redis.zadd(redis_keys.gateway_threads_of(owner), {record.thread_id: _score(record)})
        return record

    async def exists(self, thread_id: str) -> bool:
        return bool(await self.redis.exists(redis_keys.gateway_thread(thread_id)))

    async def get(self, thread_id: str, owner: str) -> ThreadRecord | None:
        """The thread if `owner` owns it; None if it does not exist or is someone else's."""
        canonical = parse_thread_id(thread_id)
        if canonical is None:
            return None
        raw = await self.redis.get(redis_keys.gateway_thread(canonical))
        if raw is None:
            return None
        record = ThreadRecord.model_validate_json(raw)
        return record if record.owner == owner else None

    async def save(self, record: ThreadRecord) -> None:
        record.touch()
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(redis_keys.gateway_thread(record.thread_id), record.model_dump_json())
        pipe.zadd(redis_keys.gateway_threads_of(record.owner), {record.thread_id: _score(record)})
        await pipe.execute()

    async def delete(self, record: ThreadRecord) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(redis_keys.gateway_thread(record.thread_id))
        pipe.zrem(redis_keys.gateway_threads_of(record.owner), record.thread_id)
        await pipe.execute()

    async def search(
        self,
        owner: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        status: str | None = None,
        ids: list[str] | None = None,
        limit: int = 10,
        offset: int = 0,
    ) -> list[ThreadRecord]:
        """The owner's threads, most recently updated first, filtered, then paged."""
        thread_ids = await self.redis.zrevrange(redis_keys.gateway_threads_of(owner), 0, -1)
        wanted_ids = {parse_thread_id(i) for i in ids} if ids is not None else None
        found: list[ThreadRecord] = []
        for tid in thread_ids:
            tid_s = tid.decode() if isinstance(tid, bytes) else str(tid)
            if wanted_ids is not None and tid_s not in wanted_ids:
                continue
            record = await self.get(tid_s, owner)
            if record is None:
                continue
            if not metadata_matches(record.metadata, metadata) or (status and record.status != status):
                continue
            found.append(record)
        return found[offset : offset + limit]


class ThreadExists(Exception):
    """A thread with that id exists already."""


def _score(record: ThreadRecord) -> float:
    return datetime.fromisoformat(record.updated_at).timestamp()
