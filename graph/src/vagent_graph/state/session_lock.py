"""One run per session across all graph replicas, in one Redis round trip.

Taking the lock also reads a hint: is a question of this session possibly pending? Only
then does a new message pay for loading the checkpoint to close that question. The hint
is an optimisation: without it, a dangling tool call is still answered as cancelled in
what the LLM sees (history.repair_tool_pairs).

The lock is a lease: it expires LEASE_SECONDS after it was last renewed, and a task renews it
while the run goes on (up to the run's own bound, `ttl_seconds`). So when a replica dies
mid-run its session is free again within LEASE_SECONDS, not after the run's whole timeout;
the renewal ends by itself once the lock is no longer ours (released, or end_of_run).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field

import structlog
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
#: 1 when the lock was still ours and now lives ARGV[2] ms longer, else 0.
_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0
"""

#: How long a lock outlives its holder: a dead replica's session is busy at most this long.
LEASE_SECONDS = 10.0
#: Renewed this often: two renewals may fail (Redis slow, a failover) before the lease ends.
RENEW_EVERY_SECONDS = LEASE_SECONDS / 3

log = structlog.get_logger(__name__)


class SessionBusy(Exception):
    pass


@dataclass
class SessionLock:
    redis: Redis
    session_id: str
    token: str
    question_may_be_pending: bool
    _renewal: asyncio.Task[None] | None = field(default=None, repr=False, compare=False)

    @classmethod
    async def acquire(cls, redis: Redis, session_id: str, ttl_seconds: float) -> SessionLock:
        """Take the lock for at most `ttl_seconds` (the run's bound), held as a renewed lease."""
        token = uuid.uuid4().hex
        lease = min(ttl_seconds, LEASE_SECONDS)
        keys = [redis_keys.session_lock(session_id), redis_keys.graph_question_pending(session_id)]
        taken = int(await redis.register_script(_ACQUIRE)(keys, [token, int(lease * 1000)]))
        if not taken:
            raise SessionBusy(session_id)
        lock = cls(redis, session_id, token, taken == 2)
        if ttl_seconds > lease:
            lock._renewal = asyncio.create_task(lock._renew(time.monotonic() + ttl_seconds))
        return lock

    async def _renew(self, deadline: float) -> None:
        """Extend the lease until the lock is not ours any more; never past `deadline`."""
        renew = self.redis.register_script(_RENEW)
        keys = [redis_keys.session_lock(self.session_id)]
        while True:
            await asyncio.sleep(RENEW_EVERY_SECONDS)
            lease = min(LEASE_SECONDS, deadline - time.monotonic())
            if lease <= 0:
                return
            try:
                if not int(await renew(keys, [self.token, int(lease * 1000)])):
                    return  # released (or lost: it expired while Redis could not be reached)
            except Exception as exc:  # Redis away for a moment: the next renewal may work
                log.warning("session_lock_renewal_failed", error_type=type(exc).__name__)

    async def release(self) -> None:
        """Only our own lock: an expired one may belong to a newer run by now."""
        self.stop_renewal()
        await self.redis.register_script(_RELEASE)([redis_keys.session_lock(self.session_id)], [self.token])

    def stop_renewal(self) -> None:
        if self._renewal is not None:
            self._renewal.cancel()
            self._renewal = None
