"""The demo records database as the graph's `delete_records` tool sees it: tests ask for a
delete of everything older than CUTOFF and count what is left."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx

from tests.support.factories import message_body, new_session
from tests.support.graph_process import GraphProcess
from tests.support.llm_server import ScriptedLLMServer
from tests.support.sse import kinds, post_sse
from vagent_shared import SessionId
from vagent_shared.events import HitlRequest, TextFinal

CUTOFF = "2020-01-01"


def older(db: Path) -> int:
    """Records created before CUTOFF."""
    with sqlite3.connect(db) as c:
        return int(c.execute("SELECT COUNT(*) FROM records WHERE created_at < ?", (CUTOFF,)).fetchone()[0])


def add_old_record(db: Path) -> None:
    """One record the test's delete has to remove (a test before may have removed the seeded ones)."""
    with sqlite3.connect(db) as c:
        c.execute("INSERT INTO records (customer, amount, created_at) VALUES ('Old Co', 1.0, '2019-06-01')")


async def ask_to_delete(
    c: httpx.AsyncClient, graph: GraphProcess, llm: ScriptedLLMServer
) -> tuple[SessionId, HitlRequest]:
    """A new session asks for the delete (the scripted model calls `delete_records`): the
    graph's confirmation question, with nothing deleted yet."""
    sid = new_session()
    llm.push_tool_calls([("delete_records", {"older_than": CUTOFF})])
    events = await post_sse(c, "/api/v1/process_message", message_body(sid, "delete old"), graph.headers)
    assert kinds(events) == ["hitl_request", "done"]
    question = events[0]
    assert isinstance(question, HitlRequest)
    return sid, question


async def confirm_delete(
    c: httpx.AsyncClient, graph: GraphProcess, llm: ScriptedLLMServer, sid: SessionId, q: HitlRequest
) -> None:
    """"yes" to `q`: the run resumes, the delete runs exactly once and everything older is gone."""
    llm.push_text("Deleted.")
    events = await post_sse(
        c,
        "/api/v1/submit_feedback",
        {"session_id": sid.format(), "response": "yes", "interrupt_id": q.interrupt_id},
        graph.headers,
    )
    assert kinds(events)[-2:] == ["text_final", "done"], events
    assert events[-2] == TextFinal(content="Deleted.", is_final=True)
    assert older(graph.data_dir / "records.db") == 0
    tool_msgs = [m for m in llm.requests[-1]["messages"] if m["role"] == "tool"]
    assert len(tool_msgs) == 1 and "Deleted" in tool_msgs[0]["content"]
