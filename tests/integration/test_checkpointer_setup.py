"""Graph replicas starting at the same moment on a new Redis all come up: the checkpointer's
index creation (check, then create) is raced by each of them, and a loser used to exit."""

from __future__ import annotations

import asyncio
from pathlib import Path

from redis.asyncio import Redis

from redis_local import RedisServer, free_port
from vagent_graph.state.checkpointer import open_checkpointer


async def test_replicas_setting_up_together_on_a_new_redis_all_succeed(tmp_path: Path) -> None:
    server = RedisServer(free_port(), tmp_path).start()
    clients = [Redis.from_url(server.url) for _ in range(3)]
    try:
        await asyncio.gather(*(open_checkpointer(c, ttl_minutes=60) for c in clients))
        listed = await clients[0].execute_command("FT._LIST")  # type: ignore[no-untyped-call]
        names = {n.decode() if isinstance(n, bytes) else str(n) for n in listed}
        assert {"checkpoint", "checkpoint_write"} <= names, names
    finally:
        for c in clients:
            await c.aclose()
        server.stop()
