"""Per-user flood control: at most N messages per sliding window, shared by all replicas of
every door into the agent (the bot and the gateway use this one class and the same Redis key,
`redis_keys.flood(user_id)`, so a person's Matrix and API messages count in one window).

One Redis sorted set per user (member = one accepted message, score = its time), checked
and updated by one Lua script so concurrent messages cannot both take the last slot.

Rejected messages are NOT recorded. A user who keeps spamming stays limited (they get at
most `max_messages` through per window, as old ones age out), and one who stops is
allowed again as soon as their oldest accepted message is `window_seconds` old: refused
attempts never extend the ban. It also keeps the set at most `max_messages` long.

Only what the user starts counts. In the bot, the router asks here for a new request (and a
`!why`), never for an answer to the agent's own pending question (`event_router` takes those
first), so a `yes` to a confirmation is neither counted nor refused. Each refusal is one
WARNING line (`flood_limited`, without the message), so an operator sees why someone was
refused.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable
from typing import Any, ClassVar

import structlog
from redis.asyncio import Redis

from vagent_shared import redis_keys

# KEYS[1] = the user's set. ARGV = now (seconds; "" = Redis server time), window, max, member, ttl_ms.
# A message counts during [t, t + window): entries with score <= now - window are dropped.
_SCRIPT = """
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  return 0
end
redis.call('ZADD', KEYS[1], now, ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return 1
"""


def _count_nothing() -> None:
    """The default refusal hook."""


class FloodControl:
    """`await flood.allow(user_id)` before handing a message to the agent.

    `on_rejected` is called once per refused message: the service's metric (each service has
    its own). Log lines carry the logger name of `log`, which a service's subclass may rename.
    """

    log: ClassVar[Any] = structlog.get_logger(__name__)

    def __init__(
        self,
        redis: Redis,
        max_messages: int,
        window_seconds: float,
        *,
        on_rejected: Callable[[], None] = _count_nothing,
    ) -> None:
        if max_messages < 1 or window_seconds <= 0:
            raise ValueError("need max_messages >= 1 and window_seconds > 0")
        self.max_messages = max_messages
        self.window_seconds = window_seconds
        self._on_rejected = on_rejected
        self._script = redis.register_script(_SCRIPT)
        # The set disappears once its newest entry has left the window.
        self._ttl_ms = math.ceil(window_seconds * 1000)

    async def allow(self, user_id: str, now: float | None = None, *, room_id: str = "") -> bool:
        """True when the message may go through (and is counted); False = refused (and
        logged once, naming `room_id`, where the refusal is posted).

        `now` is for tests; by default the Redis server's clock is used, so all replicas
        agree on the window whatever their own clocks say.
        """
        member = secrets.token_hex(8)  # unique, so two messages in the same instant both count
        args: list[str | int] = [
            "" if now is None else repr(float(now)),
            repr(float(self.window_seconds)),
            self.max_messages,
            member,
            self._ttl_ms,
        ]
        allowed = bool(await self._script(keys=[redis_keys.flood(user_id)], args=args))
        if not allowed:
            self._on_rejected()
            self.log.warning(
                "flood_limited",
                user_id=user_id,
                room_id=room_id,
                limit=self.max_messages,
                window=self.window_seconds,
            )
        return allowed
