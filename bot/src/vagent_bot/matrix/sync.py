"""Matrix sync in: each timeline event reaches the bot once, and only if it was said to it.

Per sync response: claim every event exactly once across restarts and processes (Redis
SET NX), fetch back what a `limited` sync left out, drop what was said before the bot
joined (and all history on the very first start), keep undecryptable events until their
room key arrives, then save the sync token. What to do with an event is `on_event`'s call.

A claim is also a lease: the claimed event (with its content) stays in Redis until the bot
says it is `finished` with it, and the bot renews the lease while it works. A bot killed
before it finished leaves the event behind; once the lease runs out, whichever bot runs
next takes it over and handles it again (`keep_leases`). What it had already sent is not
sent twice (matrix.handling: the same transaction ids).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine
from typing import Any

import structlog
from nio import AsyncClient, MegolmEvent, MessageDirection, RoomMessagesResponse, SyncResponse
from nio.events import Event
from redis.asyncio import Redis

from vagent_bot.matrix.tenants import Tenants
from vagent_bot.observability import metrics
from vagent_shared import redis_keys
from vagent_shared.settings import BotSettings

log = structlog.get_logger(__name__)

BACKFILL_PAGES = 10
UNDECRYPTED_KEEP_SECONDS = 600
UNDECRYPTED_MAX = 500
#: Events that can be for the bot: only these are kept until finished.
LEASED_TYPES = frozenset({"m.room.message", "m.reaction", "m.room.encrypted"})
TAKEOVER_BATCH = 50

# KEYS: the unfinished set, then (seen marker, stored event) per event. ARGV: dedup TTL, lease
# seconds, then (event id, event JSON or "" for an event nobody needs to finish) per event.
_CLAIM = """
local t = redis.call('TIME')
local lease_until = tonumber(t[1]) + tonumber(t[2]) / 1000000 + tonumber(ARGV[2])
local out = {}
for i = 1, (#KEYS - 1) / 2 do
  if redis.call('SET', KEYS[2 * i], '1', 'NX', 'EX', ARGV[1]) then
    out[i] = 1
    if ARGV[2 * i + 2] ~= '' then
      redis.call('ZADD', KEYS[1], lease_until, ARGV[2 * i + 1])
      redis.call('SET', KEYS[2 * i + 1], ARGV[2 * i + 2], 'EX', ARGV[1])
    end
  else
    out[i] = 0
  end
end
return out
"""
# KEYS: the unfinished set. ARGV: lease seconds, then the event ids still being worked on.
_RENEW = """
local t = redis.call('TIME')
local lease_until = tonumber(t[1]) + tonumber(t[2]) / 1000000 + tonumber(ARGV[1])
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], 'XX', lease_until, ARGV[i])
end
return 0
"""
# KEYS: the unfinished set. ARGV: lease seconds, stored-event key prefix, batch size.
# Takes over events whose lease ran out: (event id, event JSON) pairs.
_TAKE_OVER = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))
local out = {}
for _, eid in ipairs(due) do
  local body = redis.call('GET', ARGV[2] .. eid)
  if body then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), eid)
    table.insert(out, eid)
    table.insert(out, body)
  else
    redis.call('ZREM', KEYS[1], eid)
  end
end
return out
"""

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
        self.settings, self.client, self.redis, self.tenants = settings, client, redis, tenants
        self._on_event, self._on_invite, self._spawn = on_event, on_invite, spawn
        self.last_sync = 0.0
        self._skip_history = False
        self._undecrypted: list[tuple[str, MegolmEvent, float]] = []
        #: Claimed (or taken over) events this process has not finished: it renews their lease.
        self.held: set[str] = set()
        self._claim_script = redis.register_script(_CLAIM)
        self._renew_script = redis.register_script(_RENEW)
        self._take_over_script = redis.register_script(_TAKE_OVER)

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
                claimed = await self._claim(room_id, events)
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
        given_up: list[str] = []
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
            else:
                given_up.append(event.event_id)
        given_up += [e.event_id for _, e, _ in self._undecrypted[:-UNDECRYPTED_MAX]]
        del self._undecrypted[:-UNDECRYPTED_MAX]
        for event_id in given_up:
            self._spawn(self.finished(event_id))

    async def _claim(self, room_id: str, events: list[Any]) -> list[bool]:
        """Exactly once across restarts and processes: the first SET NX wins. An event that
        can be for the bot is kept (with its lease) until `finished`."""
        if not events:
            return []
        keys = [redis_keys.events_unfinished(self.me)]
        args: list[Any] = [self.settings.EVENT_DEDUP_TTL_SECONDS, self.settings.EVENT_LEASE_SECONDS]
        leased: set[str] = set()
        for event in events:
            src: dict[str, Any] = getattr(event, "source", {}) or {}
            keep = src.get("type") in LEASED_TYPES and src.get("sender") != self.me
            if keep:
                leased.add(event.event_id)
            keys += [redis_keys.event_seen(event.event_id), redis_keys.event_unfinished(event.event_id)]
            args += [event.event_id, json.dumps({"room_id": room_id, "source": src}) if keep else ""]
        mine = [bool(r) for r in await self._claim_script(keys=keys, args=args)]
        self.held.update(
            e.event_id for e, ok in zip(events, mine, strict=True) if ok and e.event_id in leased
        )
        return mine

    async def finished(self, event_id: str) -> None:
        """The bot is done with `event_id` (answered, refused or ignored): nobody takes it over."""
        if event_id not in self.held:
            return
        self.held.discard(event_id)
        async with self.redis.pipeline(transaction=True) as p:
            p.zrem(redis_keys.events_unfinished(self.me), event_id)
            p.delete(redis_keys.event_unfinished(event_id))
            await p.execute()

    async def keep_leases(self) -> None:
        """Forever: renew the leases of the events this process works on, and once synced,
        take over the events of bots that died before finishing theirs."""
        interval = self.settings.EVENT_LEASE_SECONDS / 3
        while True:
            try:
                if self.held:
                    await self._renew_script(
                        keys=[redis_keys.events_unfinished(self.me)],
                        args=[self.settings.EVENT_LEASE_SECONDS, *self.held],
                    )
                if self.last_sync:
                    await self._take_over()
            except Exception as exc:  # Redis away: the next round tries again
                log.warning("event_leases_failed", error_type=type(exc).__name__)
            await asyncio.sleep(interval)

    async def _take_over(self) -> None:
        flat = await self._take_over_script(
            keys=[redis_keys.events_unfinished(self.me)],
            args=[self.settings.EVENT_LEASE_SECONDS, redis_keys.event_unfinished(""), TAKEOVER_BATCH],
        )
        for raw_id, raw in zip(flat[::2], flat[1::2], strict=True):
            event_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
            if event_id in self.held:  # still ours (a renewal came late): the lease is renewed
                continue
            stored = json.loads(raw)
            event = Event.parse_event(stored["source"])
            if isinstance(event, MegolmEvent):
                event.room_id = stored["room_id"]
                try:
                    decrypted = self.client.decrypt_event(event)
                except Exception:
                    decrypted = None
                if decrypted is not None and not isinstance(decrypted, MegolmEvent):
                    event = decrypted
            self.held.add(event_id)
            metrics.EVENTS.labels("taken_over").inc()
            log.warning("event_taken_over", room_id=stored["room_id"], event_id=event_id)
            self._deliver(stored["room_id"], event)

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
