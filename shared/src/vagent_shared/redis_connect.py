"""One way to turn REDIS_URL into a client, for both services, the checkpointer and the CLIs.

Besides Redis' own forms (redis://, rediss://, unix://) REDIS_URL may name Redis Sentinel,
in the form redisvl and other clients of the ecosystem read:

    redis+sentinel://[user:pass@]host1:port1[,host2:port2,...][/service_name][/db]

(port 26379 and service "mymaster" when left out; IPv6 hosts in brackets). The client then
asks the sentinels for the master and asks again whenever its connection breaks, so it
follows a failover. The user and password are used for the sentinels and for Redis alike
(as redisvl does). Messages name the address with `where`, never the password.

The asyncio clients keep at most `max_connections` connections (REDIS_MAX_CONNECTIONS) and,
when all are in use, a command WAITS for one to come free, up to `POOL_TIMEOUT_SECONDS`,
then fails with `PoolExhaustedError` (a redis ConnectionError naming the setting). redis-py's
default pool instead fails at once beyond its cap (100 since redis-py 8: `MaxConnectionsError`),
which a burst of requests with their lock renewals and pipelines can reach.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

SENTINEL_SCHEME = "redis+sentinel"
DEFAULT_SENTINEL_PORT = 26379
DEFAULT_SERVICE = "mymaster"
#: The pool size when the caller gives none (CommonSettings.REDIS_MAX_CONNECTIONS' default).
DEFAULT_MAX_CONNECTIONS = 200
#: How long a command waits for a free connection before PoolExhaustedError.
POOL_TIMEOUT_SECONDS = 5.0


def command_retry() -> Retry:
    """redis-py's own retry, for connection errors and timeouts: 3 more tries within about a
    second. Without it (the asyncio default is none), the first command on a connection that
    Redis dropped (a restart, a failover) failed the user's run although Redis was back."""
    return Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), 3)


class RedisUrlError(ValueError):
    """REDIS_URL cannot be read. The message never contains the password."""


class PoolExhaustedError(redis.ConnectionError):
    """Every connection of the pool stayed in use for the pool timeout."""


class _WaitingPool(redis.asyncio.BlockingConnectionPool):
    """redis-py's BlockingConnectionPool (a command waits for a free connection instead of
    failing), whose timeout error names the cap and the setting that sets it."""

    async def get_connection(self, *args: Any, **options: Any) -> Any:
        started = time.monotonic()
        try:
            return await super().get_connection(*args, **options)  # type: ignore[no-untyped-call]
        except redis.ConnectionError as exc:
            # BlockingConnectionPool: ConnectionError("No connection available.") from the
            # TimeoutError of its wait; failing to connect raises ConnectionErrors too.
            waited = time.monotonic() - started
            timeout = self.timeout
            if isinstance(exc.__cause__, TimeoutError) and timeout is not None and waited >= 0.9 * timeout:
                raise PoolExhaustedError(
                    f"no free Redis connection within {timeout:g} s: all {self.max_connections}"
                    " are in use (REDIS_MAX_CONNECTIONS)"
                ) from exc
            raise


@dataclass(frozen=True)
class SentinelUrl:
    sentinels: list[tuple[str, int]]
    service: str
    db: int | None = None
    username: str | None = None
    password: str | None = None


def is_sentinel(url: str) -> bool:
    return url.split("://", 1)[0].lower() == SENTINEL_SCHEME


def _host_port(text: str) -> tuple[str, int]:
    if text.startswith("["):  # [IPv6]:port
        host, bracket, rest = text[1:].partition("]")
        if not bracket or not host or (rest and not rest.startswith(":")):
            raise RedisUrlError(f"bad sentinel address {text!r} in REDIS_URL")
        port = rest[1:]
    else:
        host, _, port = text.partition(":")
        if not host:
            raise RedisUrlError("REDIS_URL names an empty sentinel address")
    if not port:
        return host, DEFAULT_SENTINEL_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise RedisUrlError(f"bad sentinel port {port!r} in REDIS_URL")
    return host, int(port)


def parse_sentinel_url(url: str) -> SentinelUrl:
    """The sentinels, service, db and credentials of a redis+sentinel:// URL."""
    if not is_sentinel(url):
        raise RedisUrlError(f"REDIS_URL is not a {SENTINEL_SCHEME}:// URL")
    rest = url.split("://", 1)[1].split("?", 1)[0].split("#", 1)[0]
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if not at:
        hosts, userinfo = netloc, ""
    if not hosts:
        raise RedisUrlError("REDIS_URL names no sentinel (redis+sentinel://host:port,.../service/db)")
    sentinels = [_host_port(h) for h in hosts.split(",")]
    username = password = None
    if userinfo:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    parts = path.split("/") if path else []
    if len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
        raise RedisUrlError("REDIS_URL: after the sentinels comes /service_name[/db], db a number")
    service = unquote(parts[0]) if parts and parts[0] else DEFAULT_SERVICE
    db = int(parts[1]) if len(parts) == 2 else None
    return SentinelUrl(sentinels, service, db, username, password)


def where(url: str) -> str:
    """The Redis address without credentials, for messages and logs."""
    try:
        if is_sentinel(url):
            s = parse_sentinel_url(url)
            hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in s.sentinels)
            return f"sentinel {hosts} service {s.service}"
        parts = urlsplit(url)
        if parts.scheme == "unix":
            return parts.path
        return f"{parts.hostname or '127.0.0.1'}:{parts.port or 6379}"
    except (RedisUrlError, ValueError):
        return "(unreadable REDIS_URL)"


def _sentinel_args(url: str, kwargs: dict[str, Any]) -> tuple[SentinelUrl, dict[str, Any], dict[str, Any]]:
    s = parse_sentinel_url(url)
    conn = dict(kwargs)
    for key, value in (("username", s.username), ("password", s.password), ("db", s.db)):
        if value is not None:
            conn[key] = value
    # The sentinels get the same socket timeouts and credentials (redis-py's own default
    # keeps only the socket_* options).
    shared = ("username", "password")
    sentinel_kwargs = {k: v for k, v in conn.items() if k.startswith("socket_") or k in shared}
    return s, conn, sentinel_kwargs


class FollowingSentinelPool(redis.asyncio.sentinel.SentinelConnectionPool, _WaitingPool):
    """Asks the sentinels for the master at most once a `CHECK_SECONDS` before handing out a
    connection, and drops connections to a master that is no longer one. Waits for a free
    connection like `_WaitingPool` (the MRO puts redis-py's SentinelConnectionPool, which
    defines no get_connection of its own, before BlockingConnectionPool).

    Why: redis-py asks only when it opens a connection. After a forced failover
    (`SENTINEL FAILOVER`) the old master keeps accepting writes until a sentinel turns it
    into a replica, up to about 10 s later; pooled connections would write there, and those
    writes are lost when it resyncs. With this check a connection is handed out to the old
    master for at most CHECK_SECONDS after the sentinels switched.
    """

    CHECK_SECONDS = 1.0

    def __init__(self, service_name: str, sentinel_manager: Any, **kwargs: Any) -> None:
        super().__init__(service_name, sentinel_manager, **kwargs)  # type: ignore[no-untyped-call]
        self._checked = 0.0

    async def get_connection(self, *args: Any, **options: Any) -> Any:
        now = time.monotonic()
        if now - self._checked >= self.CHECK_SECONDS:
            self._checked = now
            # A sentinel that cannot be asked just now is no reason to fail the request:
            # the connections keep going where they went.
            with contextlib.suppress(redis.RedisError, OSError):
                await self.get_master_address()  # type: ignore[no-untyped-call]
        return await super().get_connection(*args, **options)  # type: ignore[no-untyped-call]


@contextlib.contextmanager
def _readable(url: str) -> Iterator[None]:
    """redis-py's ValueError for a URL it cannot read (an unknown scheme, a bad port) as a
    RedisUrlError, which every caller reports in one line; the message names no password."""
    try:
        yield
    except ValueError as exc:
        if isinstance(exc, RedisUrlError):
            raise
        raise RedisUrlError(
            f"REDIS_URL ({where(url)}) cannot be read: use redis://, rediss://, unix:// or "
            f"{SENTINEL_SCHEME}://"
        ) from None


def connect(
    url: str,
    *,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    pool_timeout: float = POOL_TIMEOUT_SECONDS,
    **client_kwargs: Any,
) -> redis.asyncio.Redis:
    """An asyncio client for REDIS_URL (Redis.from_url's URL forms, or the Sentinel's master
    client) on a pool of at most `max_connections` that waits up to `pool_timeout` seconds
    for a free connection."""
    pool_kwargs = {"max_connections": max_connections, "timeout": pool_timeout}
    client_kwargs.setdefault("retry", command_retry())
    if not is_sentinel(url):
        with _readable(url):
            pool = _WaitingPool.from_url(url, **client_kwargs, **pool_kwargs)
        return redis.asyncio.Redis.from_pool(pool)
    s, conn, sentinel_kwargs = _sentinel_args(url, client_kwargs)
    sentinel = redis.asyncio.sentinel.Sentinel(s.sentinels, sentinel_kwargs=sentinel_kwargs, **conn)  # type: ignore[no-untyped-call]
    client: redis.asyncio.Redis = sentinel.master_for(
        s.service,
        redis_class=redis.asyncio.Redis,
        connection_pool_class=FollowingSentinelPool,
        **conn,
        **pool_kwargs,
    )  # type: ignore[no-untyped-call]
    return client


def connect_sync(url: str, **client_kwargs: Any) -> redis.Redis:
    """The same as `connect`, for the synchronous CLIs."""
    if not is_sentinel(url):
        with _readable(url):
            return redis.Redis.from_url(url, **client_kwargs)
    s, conn, sentinel_kwargs = _sentinel_args(url, client_kwargs)
    sentinel = redis.sentinel.Sentinel(s.sentinels, sentinel_kwargs=sentinel_kwargs, **conn)  # type: ignore[no-untyped-call]
    client: redis.Redis = sentinel.master_for(s.service, redis_class=redis.Redis, **conn)  # type: ignore[no-untyped-call]
    return client
