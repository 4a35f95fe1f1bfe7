"""Runs counted and stopped across gateway replicas, in Redis: several replicas behave as one.

Why this shape:
- **The per-person limit** (GATEWAY_MAX_STREAMS_PER_USER) is a sorted set per person
  (`gateway_runs_of`): run id -> lease expiry, in Redis's own clock (no skew between replicas).
  A run is admitted by one script (trim the expired, count, add), so two replicas never both
  admit the last place. The replica running it renews the lease every third of it and removes
  it when the run ends; a replica that dies leaves entries that stop counting once their lease
  runs out. The key expires with its last lease, so erasure never needs to know it.
- **A run's record** (`gateway_run`: owner, thread; same lease) lets any replica find whose
  run an id is (another person's is a 404, like none at all) and which run a thread has.
- **Cancel** sets `cancel` in that record *and* publishes the run id on `gateway:cancel`, which
  every replica listens on. The message alone is at most once (a replica that is reconnecting
  misses it); a polled key alone costs a Redis call per run per poll and adds the poll's delay.
  Together: the message stops the run at once, and the flag, read at every lease renewal,
  stops it within a third of the lease even when the message was lost.
- **A thread busy on another replica** needs nothing here: the graph's session lock refuses
  the second run (409 `session_busy`), which the gateway answers as 409 `thread_busy`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Final

import structlog
from redis.asyncio import Redis

from vagent_shared import redis_keys

log = structlog.get_logger(__name__)

#: A run counts this long after its replica last renewed it (renewed every third of it).
LEASE_SECONDS: Final = 30.0
#: A cancel sent to another replica waits at most this long for the run to end.
CANCEL_WAIT_SECONDS: Final = 5.0

# KEYS: the person's runs, the run's record. ARGV: run id, limit, lease ms, owner, thread.
_ACQUIRE: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[1], lease)
redis.call('HSET', KEYS[2], 'owner', ARGV[4], 'thread', ARGV[5])
redis.call('PEXPIRE', KEYS[2], lease)
return 1
"""

# KEYS: the person's runs, the run's record. ARGV: run id, lease ms, owner, thread.
# Returns 1 when the run was asked to stop.
_RENEW: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], lease)
redis.call('HSET', KEYS[2], 'owner', ARGV[3], 'thread', ARGV[4])
redis.call('PEXPIRE', KEYS[2], lease)
if redis.call('HGET', KEYS[2], 'cancel') then
  return 1
end
return 0
"""

# KEYS: the run's record. ARGV: channel, run id. Only a live run is flagged (never a record
# without a TTL, never one re-created after the run ended).
_CANCEL: Final = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'cancel', '1')
  redis.call('PUBLISH', ARGV[1], ARGV[2])
  return 1
end
return 0
"""


@dataclass(frozen=True)
class RunRef:
    """A live run on some replica."""

    run_id: str
    owner: str
    thread_id: str


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RunLeases:
    """The Redis side of runs: admission under the per-person limit, leases, cancel requests."""

    def __init__(self, redis: Redis, max_per_user: int, lease_seconds: float = LEASE_SECONDS) -> None:
        self.redis, self.max_per_user = redis, max_per_user
        self.lease_seconds = lease_seconds
        self._lease_ms = max(1, int(lease_seconds * 1000))
        self._acquire = redis.register_script(_ACQUIRE)
        self._renew = redis.register_script(_RENEW)
        self._cancel = redis.register_script(_CANCEL)

    async def acquire(self, run: RunRef) -> bool:
        """Count `run` for its owner if fewer than the limit live on all replicas."""
        keys = [redis_keys.gateway_runs_of(run.owner), redis_keys.gateway_run(run.run_id)]
        args: list[str | int] = [run.run_id, self.max_per_user, self._lease_ms, run.owner, run.thread_id]
        return bool(await self._acquire(keys=keys, args=args))

    async def renew(self, runs: Iterable[RunRef]) -> set[str]:
        """Extend the leases of this replica's runs (one round trip); the ids asked to stop."""
        runs = list(runs)
        if not runs:
            return set()
        pipe = self.redis.pipeline(transaction=False)
        for run in runs:
            keys = [redis_keys.gateway_runs_of(run.owner), redis_keys.gateway_run(run.run_id)]
            await self._renew(
                keys=keys, args=[run.run_id, self._lease_ms, run.owner, run.thread_id], client=pipe
            )
        flags = await pipe.execute()
        return {run.run_id for run, flag in zip(runs, flags, strict=True) if flag}

    async def release(self, run: RunRef) -> None:
        """The run ended: it counts no more, and no replica finds it."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.zrem(redis_keys.gateway_runs_of(run.owner), run.run_id)
        pipe.delete(redis_keys.gateway_run(run.run_id))
        await pipe.execute()

    async def find(self, run_id: str) -> RunRef | None:
        """The live run of that id on any replica, or None."""
        raw = await self.redis.hgetall(redis_keys.gateway_run(run_id))
        fields = {_s(k): _s(v) for k, v in raw.items()}
        if "owner" not in fields or "thread" not in fields:
            return None
        return RunRef(run_id, fields["owner"], fields["thread"])

    async def running_on(self, thread_id: str, owner: str) -> RunRef | None:
        """The owner's live run of the thread on any replica (a scan of at most their limit's
        worth of runs: no thread -> run key to keep in step)."""
        members = await self.redis.zrange(redis_keys.gateway_runs_of(owner), 0, -1)
        for member in members:
            if not isinstance(member, bytes | str):
                continue
            ref = await self.find(_s(member))
            if ref is not None and ref.thread_id == thread_id and ref.owner == owner:
                return ref
        return None

    async def request_cancel(self, run_id: str) -> bool:
        """Ask the replica running `run_id` to stop it; False when it is not live anymore."""
        keys = [redis_keys.gateway_run(run_id)]
        args = [redis_keys.gateway_cancel_channel(), run_id]
        return bool(await self._cancel(keys=keys, args=args))

    async def wait_ended(self, run_id: str, within: float = CANCEL_WAIT_SECONDS) -> bool:
        """Wait (at most `within` s) until the run's record is gone: its replica released it."""
        deadline = time.monotonic() + within
        while await self.redis.exists(redis_keys.gateway_run(run_id)):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    async def listen(self, on_cancel: Callable[[str], Awaitable[None]]) -> None:
        """Forever: every run id published on `gateway:cancel` goes to `on_cancel` (which
        ignores ids not of this replica). Reconnects after a Redis failure; what was missed
        meanwhile is caught by the lease renewal's flag."""
        channel = redis_keys.gateway_cancel_channel()
        delay = 0.5
        while True:
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(channel)
                delay = 0.5
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5.0)
                    if message is not None and message.get("type") == "message":
                        await on_cancel(_s(message["data"]))
            except Exception as exc:  # Redis down, or anything else: listen again, never die
                log.warning("cancel_channel_lost", error_type=type(exc).__name__)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)
