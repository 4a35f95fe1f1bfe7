"""Matrix sync in: each timeline event reaches the bot once, and only if it was said to it.

Per sync response: claim every event exactly once across restarts and processes (Redis
SET NX), fetch back what a `limited` sync left out, drop what was said before the bot
joined (and all history on the very first start), keep undecryptable events until their
room key arrives, then save the sync token. What to do with an event is `on_event`'s call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from typing import Any

import structlog
from nio import AsyncClient, MegolmEvent, MessageDirection, RoomMessagesResponse, SyncResponse
from redis.asyncio import Redis

from vagent_bot import metrics
from vagent_bot.tenants import Tenants
from vagent_shared import redis_keys
from vagent_shared.settings import BotSettings

log = structlog.get_logger(__name__)

BACKFILL_PAGES = 10
UNDECRYPTED_KEEP_SECONDS = 600
UNDECRYPTED_MAX = 500

Spawn = Callable[[Coroutine[Any, Any, Any]], None]
OnEvent = Callable[[str, Any], None]
OnInvite = Callable[[str, list[Any]], Coroutine[Any, Any, None]]


def joined_at(events: list[Any], user_id: str) -> int | None:
    """Index of `user_id`'s own (newest) join in `events`; profile changes do not count."""
    for i in range(len(events) - 1, -1, -1):
        src = getattr(events[i], "source", {}) or {}
        if src.get("type") != "m.room.member" or src.get("state_key") != user_id:
            continue
        prev = ((src.get("unsigned") or {}).get("prev_content") or {}).get("membership")
        if (src.get("content") or {}).get("membership") == "join" and prev != "join":
            return i
    return None


class SyncHandler:
    """`on_sync` is nio's SyncResponse callback; `on_event` gets the events that are for the bot
    (not its own, decrypted), `on_invite` each invite; `spawn` runs a background task."""

    def __init__(
        self,
        settings: BotSettings,
        client: AsyncClient,
        redis: Redis,
        tenants: Tenants,
        *,
        on_event: OnEvent,
        on_invite: OnInvite,
        spawn: Spawn,
    ) -> None:
        self.s, self.client, self.redis, self.tenants = settings, client, redis, tenants
        self._on_event, self._on_invite, self._spawn = on_event, on_invite, spawn
        self.last_sync = 0.0
        self._skip_history = False
        self._undecrypted: list[tuple[str, MegolmEvent, float]] = []

    @property
    def me(self) -> str:
        return str(self.client.user_id)

    def alive(self, max_age: float) -> bool:
        return time.time() - self.last_sync < max_age

    async def resume_token(self) -> str | None:
        """Where the last sync ended; None on the first ever start, whose history is skipped."""
        since = await self.redis.get(redis_keys.sync_token(self.me))
        self._skip_history = since is None
        if self._skip_history:
            log.info("first_start", note="old history is not answered")
        if since is None:
            return None
        return since.decode() if isinstance(since, bytes) else str(since)

    async def on_sync(self, resp: SyncResponse) -> None:
        started = time.perf_counter()
        for room_id, info in resp.rooms.invite.items():
            self._spawn(self._on_invite(room_id, info.invite_state))
        if self._skip_history:
            self._skip_history = False
            for room_id, room in resp.rooms.join.items():
                self.tenants.learn(room_id, [*room.state, *room.timeline.events])
        else:
            for room_id, room in resp.rooms.join.items():
                events = list(room.timeline.events)
                if room.timeline.limited and room.timeline.prev_batch and joined_at(events, self.me) is None:
                    events = await self._backfill(room_id, room.timeline.prev_batch) + events
                self.tenants.learn(room_id, [*room.state, *events])
                joined = joined_at(events, self.me)
                if joined is not None:  # what was said before the bot joined is not for it
                    events = events[joined + 1 :]
                claimed = await self._claim([e.event_id for e in events])
                for event, mine in zip(events, claimed, strict=True):
                    if mine:
                        self._deliver(room_id, event)
                    else:
                        metrics.EVENTS.labels("duplicate").inc()
        self._retry_decryption()
        await self.redis.set(redis_keys.sync_token(self.me), resp.next_batch)
        self.last_sync = time.time()
        metrics.LAST_SYNC.set(self.last_sync)
        metrics.SYNC_SECONDS.observe(time.perf_counter() - started)

    def _deliver(self, room_id: str, event: Any) -> None:
        src: dict[str, Any] = getattr(event, "source", {}) or {}
        if src.get("sender") == self.me:
            metrics.EVENTS.labels("own").inc()
            return
        if isinstance(event, MegolmEvent):
            # its room key may arrive later (nio never retries): keep it and ask for the key
            metrics.EVENTS.labels("undecryptable").inc()
            log.warning("undecryptable_event", room_id=room_id, event_id=event.event_id)
            self._undecrypted.append((room_id, event, time.time()))
            self._spawn(self.client.request_room_key(event))
            return
        self._on_event(room_id, event)

    def _retry_decryption(self) -> None:
        """Events whose room key came with a later sync are handled then (for 10 minutes)."""
        waiting, self._undecrypted = self._undecrypted, []
        for room_id, event, since in waiting:
            try:
                decrypted = self.client.decrypt_event(event)
            except Exception:
                decrypted = None
            if decrypted is not None and not isinstance(decrypted, MegolmEvent):
                log.info("decrypted_late", room_id=room_id, event_id=event.event_id)
                self._deliver(room_id, decrypted)
            elif time.time() - since < UNDECRYPTED_KEEP_SECONDS:
                self._undecrypted.append((room_id, event, since))
        del self._undecrypted[:-UNDECRYPTED_MAX]

    async def _claim(self, event_ids: list[str]) -> list[bool]:
        """Exactly once across restarts and processes: the first SET NX wins."""
        if not event_ids:
            return []
        async with self.redis.pipeline(transaction=False) as p:
            for eid in event_ids:
                p.set(redis_keys.event_seen(eid), "1", nx=True, ex=self.s.EVENT_DEDUP_TTL_SECONDS)
            return [bool(r) for r in await p.execute()]

    async def _backfill(self, room_id: str, prev_batch: str) -> list[Any]:
        """A `limited` sync skipped events: fetch them back until one we have already seen."""
        older: list[Any] = []
        token: str | None = prev_batch
        for _ in range(BACKFILL_PAGES):
            if not token:
                break
            resp = await self.client.room_messages(
                room_id, start=token, direction=MessageDirection.back, limit=100
            )
            if not isinstance(resp, RoomMessagesResponse) or not resp.chunk:
                break
            seen = await self.redis.exists(*[redis_keys.event_seen(e.event_id) for e in resp.chunk])
            older = list(reversed(resp.chunk)) + older
            if seen or joined_at(older, self.me) is not None:
                break
            token = resp.end
        log.info("backfilled", room_id=room_id, events=len(older))
        return older
