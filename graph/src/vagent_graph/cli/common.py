"""What `vagent audit` and `vagent admin` share besides output: their settings and a
synchronous Redis client (a one-shot command needs no event loop)."""

from __future__ import annotations

import typer
from pydantic import ValidationError
from redis import Redis
from redis.exceptions import RedisError

from vagent_graph.audit_reader import FOLLOW_BLOCK_MS
from vagent_graph.cli.output import complain
from vagent_shared import redis_connect
from vagent_shared.settings import CommonSettings


def load_settings(prog: str) -> CommonSettings:
    """The settings; a bad one is a usage error (exit 2) that names it."""
    try:
        return CommonSettings()
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
