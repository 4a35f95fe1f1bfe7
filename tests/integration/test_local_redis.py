"""`make run`'s two local Redis servers (scripts/run_local.py, scripts/redis_local.py): the main
one without the graph module, the entity one with it alone, and a main one whose data was
saved while the graph module was loaded (every `make run` before the entities had a Redis of
their own), which Redis cannot read without that module."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from run_local import start_redis

from redis_local import RedisServer, free_port


def modules(port: int) -> set[str]:
    with redis.Redis(port=port) as r:
        return {m[b"name"].decode() for m in r.module_list()}


@pytest.mark.parametrize(
    ("kind", "loaded", "left_out"),
    [("main", {"search", "ReJSON"}, {"graph"}), ("entities", {"graph"}, {"search", "ReJSON"})],
)
def test_each_local_redis_loads_only_its_modules(
    kind: str, loaded: set[str], left_out: set[str], tmp_path: Path
) -> None:
    server = start_redis(free_port(), tmp_path, kind, kind)  # type: ignore[arg-type]
    assert server is not None
    try:
        found = modules(server.port)  # (Redis 8 has its own `vectorset` built in)
        assert loaded <= found and not left_out & found, found
    finally:
        server.stop()


def test_main_data_saved_with_the_graph_module_still_starts(tmp_path: Path) -> None:
    port = free_port()
    old = RedisServer(port, tmp_path, modules="all").start()
    with redis.Redis(port=port) as r:
        r.execute_command("GRAPH.QUERY", "vagent_kg:acme", "CREATE (:Entity {id: 'ana'})")
        r.set("checkpoint", "kept")
        r.save()
    old.stop()
    with pytest.raises(RuntimeError):  # what a plain start without the module does
        RedisServer(port, tmp_path, modules="main").start()
    server = start_redis(port, tmp_path, "main", "search + JSON")
    assert server is not None
    try:
        with redis.Redis(port=port) as r:
            assert r.get("checkpoint") == b"kept"  # nothing of the conversations is lost
        assert "graph" in modules(port)
    finally:
        server.stop()
