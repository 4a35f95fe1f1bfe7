"""What the `vagent` commands share besides output: their settings, a synchronous Redis
client (a one-shot command needs no event loop), and one asyncio run on Redis whose failures
end as one line and an exit code."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import typer
from pydantic import ValidationError
from redis import Redis
from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from vagent_graph.cli.output import complain, printable, unreachable
from vagent_graph.observability.audit_reader import FOLLOW_BLOCK_MS
from vagent_shared import redis_connect
from vagent_shared.redis_connect import RedisUrlError
from vagent_shared.settings import CommonSettings

T = TypeVar("T")
S = TypeVar("S", bound=CommonSettings)


def load_settings(prog: str, kind: type[S]) -> S:
    """The settings (`kind`: CommonSettings, or GraphSettings for commands that open the
    graph's stores); a bad one is a usage error (exit 2) that names it."""
    try:
        return kind()
    except ValidationError as exc:
        first = exc.errors()[0]
        complain(prog, f"invalid setting {first['loc'][0]}: {first['msg']}")
        raise typer.Exit(2) from None


def connect(url: str) -> Redis:
    """A client that has answered a PING; raises RedisError when Redis cannot be reached
    (RedisUrlError when REDIS_URL cannot be read). Its timeout outlasts a follow's XREAD."""
    redis = redis_connect.connect_sync(
        url, socket_timeout=FOLLOW_BLOCK_MS / 1000 + 10, socket_connect_timeout=5
    )
    try:
        redis.ping()
    except RedisError:
        redis.close()
        raise
    return redis


def on_redis(prog: str, url: str, work: Callable[[AsyncRedis], Awaitable[T]], *, timeout: float = 30) -> T:
    """Run `work` on an asyncio client that has answered a PING; an unreadable URL or an
    unreachable Redis is a usage error (exit 2), a refused command exit 1, each one line."""

    async def run() -> T:
        redis = redis_connect.connect(url, socket_timeout=timeout, socket_connect_timeout=5)
        try:
            await redis.ping()  # type: ignore[misc]
            return await work(redis)
        finally:
            await redis.aclose()

    try:
        return asyncio.run(run())
    except RedisUrlError as exc:
        complain(prog, str(exc))
        raise typer.Exit(2) from None
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        complain(prog, unreachable(url, exc))
        raise typer.Exit(2) from None
    except RedisError as exc:
        complain(prog, f"Redis refused: {type(exc).__name__}: {printable(str(exc))[:200]}")
        raise typer.Exit(1) from None
