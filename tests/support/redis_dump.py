"""Everything in a Redis, as text: for tests that prove a secret or a user's id is absent."""

from __future__ import annotations

import base64
import re

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


def _unblob(doc: str) -> str:
    """A checkpointer document with its base64 `blob` fields decoded too."""
    extra = []
    for blob in re.findall(r'"blob"\s*:\s*"([A-Za-z0-9+/=]+)"', doc):
        try:
            extra.append(base64.b64decode(blob).decode("utf-8", "replace"))
        except ValueError:
            pass
    return doc + " " + " ".join(extra)


async def dump_all(redis: Redis) -> dict[str, str]:
    """EVERY key of the database and its whole value as text, finer than `dump_redis` for
    erasure tests: a day of token usage counter by counter, a stream entry by entry (as
    `key #field`), checkpoint blobs decoded, sets sorted, sorted sets with their scores."""
    out: dict[str, str] = {}
    async for raw in redis.scan_iter(count=1000):
        key = raw.decode("utf-8", "surrogateescape")
        kind = _text(await redis.type(raw))
        if kind == "string":
            value = _text(await redis.get(raw))
        elif kind == "hash" and key.startswith("usage:"):  # a day of token usage: every user's counters
            counters = await redis.hgetall(raw)  # type: ignore[misc]
            for name, count in counters.items():
                out[f"{key} #{_text(name)}"] = _text(count)
            value = f"hash of {len(counters)}"
        elif kind == "hash":
            value = _text(await redis.hgetall(raw))  # type: ignore[misc]
        elif kind == "ReJSON-RL":
            value = _unblob(_text(await redis.execute_command("JSON.GET", raw)))  # type: ignore[no-untyped-call]
        elif kind == "set":
            value = _text(sorted(await redis.smembers(raw)))  # type: ignore[misc]
        elif kind == "zset":
            value = _text(await redis.zrange(raw, 0, -1, withscores=True))
        elif kind == "list":
            value = _text(await redis.lrange(raw, 0, -1))  # type: ignore[misc]
        elif kind == "stream":
            entries = await redis.xrange(raw) or []
            for entry_id, fields in entries:
                out[f"{key} #{_text(entry_id)}"] = _text(fields)
            value = f"stream of {len(entries)}"
        elif kind == "none":  # expired meanwhile
            continue
        else:  # a FalkorDB graph, a vector set: only their names can mention anyone
            value = kind
        out[key] = value
    return out
