"""Everything in a Redis, as text: for tests that prove a secret or a user's id is absent."""

from __future__ import annotations

from redis.asyncio import Redis


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, list | tuple):
        return " ".join(_text(v) for v in value)
    if isinstance(value, dict):
        return " ".join(f"{_text(k)}={_text(v)}" for k, v in value.items())
    return str(value)


async def dump_redis(url: str, match: str | None = None) -> dict[str, str]:
    """Every key (or those matching `match`) and its whole value, whatever its type
    (strings, hashes, JSON, sets, sorted sets, lists, streams, FalkorDB graphs by name)."""
    redis = Redis.from_url(url)
    out: dict[str, str] = {}
    try:
        async for key in redis.scan_iter(match=match, count=1000):
            kind = _text(await redis.type(key))
            if kind == "string":
                value: object = await redis.get(key)
            elif kind == "hash":
                value = await redis.hgetall(key)  # type: ignore[misc]
            elif kind == "ReJSON-RL":
                value = await redis.execute_command("JSON.GET", key)  # type: ignore[no-untyped-call]
            elif kind == "set":
                value = await redis.smembers(key)  # type: ignore[misc]
            elif kind == "zset":
                value = await redis.zrange(key, 0, -1)
            elif kind == "list":
                value = await redis.lrange(key, 0, -1)  # type: ignore[misc]
            elif kind == "stream":
                value = [fields for _, fields in (await redis.xrange(key)) or []]
            else:  # e.g. a FalkorDB graph: its name is its key
                value = ""
            out[_text(key)] = _text(value)
    finally:
        await redis.aclose()
    return out
