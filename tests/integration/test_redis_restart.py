"""Redis restarted with its append-only file between a question and its answer.

The graph service keeps running: while Redis is away /health says so (503) and requests are
refused with 503 redis_unavailable; once Redis is back (same port, same directory, the
append-only file replayed) the answer resumes the parked run, the tool runs once.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import httpx
import pytest
from procutil import free_port, wait_until

from redis_local import RedisServer
from tests.support.factories import message_body, new_session
from tests.support.graph_process import GraphProcess
from tests.support.llm_server import ScriptedLLMServer
from tests.support.records import add_old_record, ask_to_delete, confirm_delete, older

#: `always`: every write is on disk before it is answered, so even kill -9 loses nothing.
AOF = ("--appendonly", "yes", "--appendfsync", "always")


@pytest.fixture(scope="module")
def redis_aof(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(free_port(), tmp_path_factory.mktemp("redis"), extra_args=AOF).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def graph(
    redis_aof: RedisServer, _llm_session: ScriptedLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GraphProcess]:
    """One graph service for both restarts (a start costs seconds): each test checks it is
    still the same process afterwards."""
    g = GraphProcess(redis_aof.url, tmp_path_factory.mktemp("graph"), _llm_session.base_url).start()
    try:
        yield g
    finally:
        g.stop()


@pytest.mark.parametrize("crash", [False, True], ids=["sigterm", "kill-9"])
async def test_a_question_survives_a_redis_restart(
    redis_aof: RedisServer, graph: GraphProcess, llm_server: ScriptedLLMServer, crash: bool
) -> None:
    g = graph
    db = g.data_dir / "records.db"
    pid = g.proc.pid if g.proc else None
    add_old_record(db)
    assert older(db) > 0
    async with httpx.AsyncClient(base_url=g.url, timeout=60) as c:
        sid, q = await ask_to_delete(c, g, llm_server)

        assert redis_aof.proc is not None
        if crash:
            redis_aof.proc.send_signal(signal.SIGKILL)
            redis_aof.proc.wait()
            redis_aof.proc = None
        else:
            redis_aof.stop()  # SIGTERM: a clean shutdown
        assert (await c.get("/health")).status_code == 503  # the outage is reported
        start = time.monotonic()
        refused = await c.post(
            "/api/v1/process_message", json=message_body(new_session(), "hi"), headers=g.headers
        )
        print(f"\nRedis down: a new message is refused after {time.monotonic() - start:.2f}s")
        assert refused.status_code == 503 and refused.json()["error_code"] == "redis_unavailable"

        redis_aof.start()  # same port, same directory: the append-only file is replayed
        assert wait_until(lambda: httpx.get(f"{g.url}/health").status_code == 200, 30)

        await confirm_delete(c, g, llm_server, sid, q)
    assert g.proc is not None and g.proc.poll() is None and g.proc.pid == pid  # the same process all along
