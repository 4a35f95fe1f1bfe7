"""Two graph replicas on one Redis behind a round-robin proxy (tests/support/tcp_proxy.py),
as a load balancer would put them: every request may land on either.

A question asked through one replica is answered through the other; two messages of one
session sent to both at once run one at a time (the second is refused, 409 session_busy);
a replica killed mid-stream ends that stream with an error once, and the session is usable
through the other replica once the dead run's lock lease has run out (seconds, not the run
timeout).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from httpx_sse import aconnect_sse

from tests.support.factories import message_body, new_session
from tests.support.graph_process import GraphProcess
from tests.support.llm_server import ScriptedLLMServer
from tests.support.records import CUTOFF, older
from tests.support.sse import kinds, post_sse
from tests.support.tcp_proxy import RoundRobinProxy
from vagent_graph.state.session_lock import LEASE_SECONDS
from vagent_shared import parse_sse_event
from vagent_shared.events import HitlRequest, TextChunk, TextFinal, TurnStarted

PM, FB = "/api/v1/process_message", "/api/v1/submit_feedback"


class Replicas:
    def __init__(self, redis_url: str, data_dir: Path, llm_url: str) -> None:
        # One records DB for both, as a shared volume would be.
        self.data_dir = data_dir
        self.a = GraphProcess(redis_url, data_dir, llm_url)
        self.b = GraphProcess(redis_url, data_dir, llm_url)
        self.proxy = RoundRobinProxy([("127.0.0.1", self.a.port), ("127.0.0.1", self.b.port)])
        self.headers = self.a.headers

    def by_port(self, port: int) -> GraphProcess:
        return self.a if port == self.a.port else self.b

    def client(self) -> httpx.AsyncClient:
        """A client of its own: a new connection, so the proxy's next replica."""
        return httpx.AsyncClient(base_url=self.proxy.url, timeout=60)


@pytest.fixture(scope="module")
def _replicas(
    redis_url: str, _llm_session: ScriptedLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replicas]:
    """Started once for the module (a service start costs seconds); the tests use sessions of
    their own and look only at the proxy's latest routes."""
    r = Replicas(redis_url, tmp_path_factory.mktemp("replicas"), _llm_session.base_url)
    try:
        r.a.start()
        r.b.start()
        r.proxy.start()
        yield r
    finally:
        r.proxy.stop()
        r.a.stop()
        r.b.stop()


@pytest.fixture
def replicas(_replicas: Replicas, llm_server: ScriptedLLMServer) -> Replicas:
    """Both replicas up: one a test killed is started again (same port)."""
    for g in (_replicas.a, _replicas.b):
        if not g.running:
            g.start()
    return _replicas


async def test_asked_through_one_replica_answered_through_the_other(
    replicas: Replicas, llm_server: ScriptedLLMServer
) -> None:
    sid = new_session()
    db = replicas.data_dir / "records.db"
    n = older(db)
    llm_server.push_tool_calls([("delete_records", {"older_than": CUTOFF})])
    async with replicas.client() as c:
        events = await post_sse(c, PM, message_body(sid, "delete old records"), replicas.headers)
    assert kinds(events) == ["hitl_request", "done"]
    q = events[0]
    assert isinstance(q, HitlRequest)

    llm_server.push_text("Deleted.")
    async with replicas.client() as c:
        body = {"session_id": sid.format(), "response": "yes", "interrupt_id": q.interrupt_id}
        events = await post_sse(c, FB, body, replicas.headers)
    assert events[-2:] == [TextFinal(content="Deleted.", is_final=True), events[-1]]
    asked_at, answered_at = replicas.proxy.routed[-2:]
    assert asked_at is not None and answered_at is not None and asked_at != answered_at
    assert n > 0 and older(db) == 0
    tool_msgs = [m for m in llm_server.requests[-1]["messages"] if m["role"] == "tool"]
    assert len(tool_msgs) == 1 and "Deleted" in tool_msgs[0]["content"]  # ran once


async def test_one_session_runs_one_message_at_a_time_across_replicas(
    replicas: Replicas, llm_server: ScriptedLLMServer
) -> None:
    sid = new_session()
    llm_server.push_text("first answer " * 10, delay=0.3)  # long enough to overlap the second
    llm_server.push_text("later answer")
    async with replicas.client() as ca, replicas.client() as cb:
        answers = await asyncio.gather(
            ca.post(PM, json=message_body(sid, "one"), headers=replicas.headers),
            cb.post(PM, json=message_body(sid, "two"), headers=replicas.headers),
        )
    assert {r.status_code for r in answers} == {200, 409}, [r.text for r in answers]
    [busy] = [r for r in answers if r.status_code == 409]
    assert busy.json()["error_code"] == "session_busy"
    assert len({p for p in replicas.proxy.routed[-2:]}) == 2  # one on each replica
    assert len(llm_server.requests) == 1  # the refused one never reached the LLM

    [ok] = [r for r in answers if r.status_code == 200]
    accepted = "one" if ok is answers[0] else "two"
    async with replicas.client() as c:
        events = await post_sse(c, PM, message_body(sid, "three"), replicas.headers)
    assert events[-2] == TextFinal(content="later answer", is_final=True)
    said = [(m["role"], m["content"]) for m in llm_server.requests[-1]["messages"] if m["role"] != "system"]
    # the history holds the accepted message and its answer, nothing of the refused one
    assert [role for role, _ in said] == ["user", "assistant", "user"], said
    assert said[0][1] == accepted and said[1][1].startswith("first answer") and said[2][1] == "three"


async def test_a_replica_killed_mid_stream(replicas: Replicas, llm_server: ScriptedLLMServer) -> None:
    sid = new_session()
    llm_server.push_text("word " * 200, delay=0.05)  # about ten seconds of streaming
    seen: list[str] = []
    failures: list[BaseException] = []
    async with replicas.client() as c:
        try:
            async with aconnect_sse(
                c, "POST", PM, json=message_body(sid, "long one"), headers=replicas.headers
            ) as src:
                assert src.response.status_code == 200
                async for sse in src.aiter_sse():
                    if sse.event == TurnStarted.EVENT:  # the turn's id, sent before anything
                        continue
                    seen.append(parse_sse_event(sse.event, sse.data).EVENT)
                    if len(seen) == 1:
                        served = replicas.proxy.routed[-1]
                        assert served is not None
                        victim = replicas.by_port(served[1])
                        victim.kill()
        except httpx.HTTPError as exc:
            failures.append(exc)
    killed_at = time.monotonic()
    assert seen and seen[0] == TextChunk.EVENT
    assert "done" not in seen and "text_final" not in seen
    assert len(failures) == 1  # the stream ended with an error, once
    survivor = replicas.b if victim is replicas.a else replicas.a

    # The dead run's lock expires within its lease; meanwhile the session is busy (409).
    llm_server.clear()
    llm_server.push_text("Back again.")
    busy = 0
    async with httpx.AsyncClient(base_url=replicas.proxy.url, timeout=60) as c:
        while True:
            r = await c.post(PM, json=message_body(sid, "are you there?"), headers=replicas.headers)
            if r.status_code != 409:
                break
            busy += 1
            assert time.monotonic() - killed_at < LEASE_SECONDS + 15, "the dead run's lock never expired"
            await asyncio.sleep(0.5)
    waited = time.monotonic() - killed_at
    print(
        f"\nreplica killed: the session was busy for {waited:.1f}s ({busy} refusals), lease {LEASE_SECONDS}s"
    )
    assert r.status_code == 200
    assert r.text.count("event: text_final") == 1 and "Back again." in r.text
    assert replicas.proxy.routed[-1] == ("127.0.0.1", survivor.port)  # the proxy skipped the dead one
    assert len(llm_server.requests) == 1
