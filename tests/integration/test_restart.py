"""A confirmation survives the graph process: ask, kill the service, restart, answer."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.graph_process import GraphProcess
from tests.support.llm_server import ScriptedLLMServer
from tests.support.records import CUTOFF, ask_to_delete, older
from tests.support.sse import kinds, post_sse
from vagent_shared.events import TextFinal


@pytest.fixture(scope="module")
def _graph(
    redis_url: str, _llm_session: ScriptedLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GraphProcess, Path]]:
    """One service for the module (each test stops and starts it itself), and a copy of its
    freshly seeded records database."""
    data = tmp_path_factory.mktemp("restart")
    with GraphProcess(redis_url, data, _llm_session.base_url) as g:
        pristine = data / "records-pristine.db"
        shutil.copy(data / "records.db", pristine)
        yield g, pristine


@pytest.fixture
def graph(_graph: tuple[GraphProcess, Path]) -> GraphProcess:
    """The module's service, running, its records as freshly seeded (a test deletes some)."""
    g, pristine = _graph
    with sqlite3.connect(pristine) as src, sqlite3.connect(g.data_dir / "records.db") as dst:
        src.backup(dst)
    if not g.running:  # a test that failed half-way may have left it stopped
        g.start()
    return g


@pytest.mark.parametrize("answer,crash", [("yes", False), ("no", False), ("yes", True)])
async def test_confirmation_survives_a_restart(
    graph: GraphProcess, llm_server: ScriptedLLMServer, answer: str, crash: bool
) -> None:
    g = graph
    db = g.data_dir / "records.db"
    n = older(db)
    assert n > 0
    async with httpx.AsyncClient(base_url=g.url, timeout=30) as c:
        sid, q = await ask_to_delete(c, g, llm_server)
    assert q.question == f"Delete {n} records older than {CUTOFF}?"

    g.kill() if crash else g.stop()  # nothing is held in memory while the human thinks
    g.start()

    llm_server.push_text("Deleted." if answer == "yes" else "Cancelled, nothing deleted.")
    async with httpx.AsyncClient(base_url=g.url, timeout=30) as c:
        events = await post_sse(
            c,
            "/api/v1/submit_feedback",
            {"session_id": sid.format(), "response": answer, "interrupt_id": q.interrupt_id},
            g.headers,
        )
        assert kinds(events)[-2:] == ["text_final", "done"]
        assert isinstance(events[-2], TextFinal)
        assert older(db) == (0 if answer == "yes" else n)
        # the question is consumed: answering twice is refused
        again = await c.post(
            "/api/v1/submit_feedback",
            json={"session_id": sid.format(), "response": "yes"},
            headers=g.headers,
        )
        assert again.status_code == 409
    tool_msg = next(m for m in llm_server.requests[-1]["messages"] if m["role"] == "tool")
    assert ("Deleted" in tool_msg["content"]) == (answer == "yes")
