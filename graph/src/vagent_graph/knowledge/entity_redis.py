"""The entity store's own Redis client: ENTITY_REDIS_URL, or REDIS_URL when it is unset.

Why a server of its own (docs/deployment.md, "The entity Redis"): FalkorDB has crashed the
Redis it lives in (a SIGSEGV on a graph key's DEL); in the Redis that holds the checkpoints,
pending confirmations, session locks and the audit stream, that took every conversation
down with it. Apart, a crash costs entity lookups only, until that Redis is back.

Why a client of its own even when both URLs are the same: its pool is separate, so a hung
graph module cannot hold the connections the checkpointer needs, and it connects with a
short timeout, so a lookup while that Redis is away fails within
`EntityStore.LOOKUP_DEADLINE_S` instead of keeping the user's answer waiting. redis-py drops
a connection that failed and opens a new one on the next command (and pings one idle for
`HEALTH_CHECK_S` first), so nothing stays attached to a dead server: once it is back, the
next lookup works.
"""

from __future__ import annotations

from redis.asyncio import Redis

from vagent_shared import redis_connect
from vagent_shared.settings import GraphSettings

SETTING = "ENTITY_REDIS_URL"
CONNECT_TIMEOUT_S = 2.0
#: A load's write queries may take long; lookups are bounded by their own deadline.
SOCKET_TIMEOUT_S = 30.0
HEALTH_CHECK_S = 30


def connect(settings: GraphSettings) -> Redis:
    """The client of the entity graphs' Redis (nothing is sent yet). A URL that cannot be
    read raises RedisUrlError naming the setting it came from."""
    url = settings.entity_redis_url()
    try:
        return redis_connect.connect(
            url,
            max_connections=settings.REDIS_MAX_CONNECTIONS,
            socket_timeout=SOCKET_TIMEOUT_S,
            socket_connect_timeout=CONNECT_TIMEOUT_S,
            health_check_interval=HEALTH_CHECK_S,
        )
    except redis_connect.RedisUrlError as exc:
        if not settings.ENTITY_REDIS_URL:
            raise
        # redis_connect's messages name REDIS_URL; this one came from ENTITY_REDIS_URL.
        raise redis_connect.RedisUrlError(str(exc).replace("REDIS_URL", SETTING)) from None


def where(settings: GraphSettings) -> str:
    """The entity Redis' address without credentials, naming the setting it came from."""
    name = SETTING if settings.ENTITY_REDIS_URL else "REDIS_URL"
    return f"{redis_connect.where(settings.entity_redis_url())} ({name})"
