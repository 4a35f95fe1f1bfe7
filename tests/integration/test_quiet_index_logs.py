"""A restart is quiet about indexes that are already there: redisvl said "Index already exists,
not overwriting." at INFO for each of the checkpointer's indexes on every start (twice per
restart in `make run`'s console). The graph's own `docs_index_created` still says when an index
is really made. Real Redis, the service's logging at INFO."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from vagent_graph.knowledge import doc_index
from vagent_graph.state.checkpointer import open_checkpointer
from vagent_shared.logs import configure_logging


async def test_indexes_that_exist_are_not_announced_on_each_start(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("INFO", service="test")  # put back by conftest's _logging_put_back
    redis = Redis.from_url(redis_url)
    index = "quiet_index_test"
    try:
        for _ in range(2):  # a start, then a restart
            await open_checkpointer(redis, ttl_minutes=5)
            await doc_index.ensure_index(redis, index, "offline:test", 8, "flat")
        out = capsys.readouterr().out
        assert "Index already exists" not in out, out
        assert out.count("docs_index_created") <= 1, out
    finally:
        await doc_index.drop_definition(redis, index)
        await redis.delete(f"{index}:meta")
        await redis.aclose()
