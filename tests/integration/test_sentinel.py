"""REDIS_URL=redis+sentinel://...: a real master, replica and sentinel on loopback.

A question asked before a forced failover is answered after it: the run resumes from the
checkpoint on the new master, the confirmed tool runs once, the next message is answered
once. While the switch happens a probe measures what requests see (printed; the numbers in
docs/deployment.md come from here). The bot's Redis client, built from the same URL, keeps
its pending questions across the switch.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
import redis
from procutil import free_port, wait_until

from tests.support.factories import message_body, new_session
from tests.support.graph_process import GraphProcess
from tests.support.llm_server import ScriptedLLMServer
from tests.support.procs import BIN
from tests.support.records import ask_to_delete, confirm_delete, older
from tests.support.redis_sentinel import SentinelSetup
from tests.support.sse import kinds, post_sse
from tests.support.vagent_cli import run_vagent
from vagent_bot.__main__ import redis_client
from vagent_bot.conversation.hitl_store import HitlStore
from vagent_shared.events import TextFinal
from vagent_shared.hitl import PendingQuestion
from vagent_shared.redis_connect import FollowingSentinelPool
from vagent_shared.settings import BotSettings


@pytest.fixture(scope="module")
def sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelSetup]:
    with SentinelSetup(tmp_path_factory.mktemp("sentinel")) as setup:
        yield setup


@pytest.fixture(scope="module")
def graph(
    sentinel: SentinelSetup, _llm_session: ScriptedLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GraphProcess]:
    """One graph service for the module (a start costs seconds): it lives through every
    failover here, as a deployed one would. Tests use sessions of their own."""
    g = GraphProcess(sentinel.url, tmp_path_factory.mktemp("graph"), _llm_session.base_url).start()
    try:
        yield g
    finally:
        g.stop()


@dataclass
class Probe:
    """Cheap requests that need Redis (a session reset takes the session lock), one after
    the other while the failover runs: how many fail, how long the slowest one waits.

    Each request resets a session of its own: a reset whose lock release died with the
    master leaves that session busy (409) until the lock's TTL, which is the lock doing its
    job, not what this probe measures."""

    outcomes: list[tuple[float, int, float]] = field(default_factory=list)  # (at, status, seconds)

    async def run(self, client: httpx.AsyncClient, headers: dict[str, str], stop: asyncio.Event) -> None:
        while not stop.is_set():
            body = {"session_id": new_session().format()}
            start = time.monotonic()
            try:
                status = (await client.post("/api/v1/reset_session", json=body, headers=headers)).status_code
            except httpx.HTTPError:
                status = 0
            self.outcomes.append((start, status, time.monotonic() - start))
            await asyncio.sleep(0.02)

    def report(self) -> str:
        failed = [o for o in self.outcomes if o[1] != 200]
        span = (failed[-1][0] + failed[-1][2] - failed[0][0]) if failed else 0.0
        slowest = max((o[2] for o in self.outcomes), default=0.0)
        return (
            f"{len(self.outcomes)} requests, {len(failed)} failed "
            f"(statuses {sorted({o[1] for o in failed})}) over {span:.2f}s; slowest {slowest:.2f}s"
        )


async def test_a_question_survives_a_failover(
    sentinel: SentinelSetup, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    g = graph
    db = g.data_dir / "records.db"
    assert older(db) > 0
    async with httpx.AsyncClient(base_url=g.url, timeout=60) as c:
        sid, q = await ask_to_delete(c, g, llm_server)
        assert wait_until(sentinel.in_sync, 20), "the replica never caught up"

        probe, stop = Probe(), asyncio.Event()
        probing = asyncio.create_task(probe.run(c, g.headers, stop))
        await asyncio.sleep(0.3)
        switch = time.monotonic()
        old = await asyncio.to_thread(sentinel.failover)
        switched = time.monotonic() - switch
        # Within CHECK_SECONDS the graph's pool asks the sentinel again and drops its
        # connections to the old master; the rest of the ~10 s until the sentinel demotes
        # it is the same for the graph, so the sentinel is hurried once that has passed.
        await asyncio.sleep(FollowingSentinelPool.CHECK_SECONDS + 1)
        await asyncio.to_thread(sentinel.wait_demoted, old, hurry=True)
        demoted = time.monotonic() - switch
        await asyncio.sleep(1)
        stop.set()
        await probing
        print(
            f"\nfailover: new master named after {switched:.2f}s, old one a replica after "
            f"{demoted:.2f}s (hurried); {probe.report()}"
        )
        assert probe.outcomes and probe.outcomes[-1][1] == 200  # over: requests work again

        await confirm_delete(c, g, llm_server, sid, q)

        asked = len(llm_server.requests)
        llm_server.push_text("Anything else?")
        events = await post_sse(c, "/api/v1/process_message", message_body(sid, "thanks"), g.headers)
        assert kinds(events)[-2:] == ["text_final", "done"]
        assert events[-2] == TextFinal(content="Anything else?", is_final=True)
        assert len(llm_server.requests) == asked + 1  # answered once
        health = await c.get("/health")
        assert health.status_code == 200
    assert "Traceback" not in g.logs()


async def test_the_bots_redis_client_follows_the_master(
    sentinel: SentinelSetup, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIS_URL", sentinel.url)
    redis = redis_client(BotSettings())
    store = HitlStore(redis)
    try:
        sid = new_session().format()
        pending = PendingQuestion(
            session_id=sid,
            room_id="!r:localhost",
            user_id="@alice:localhost",
            question="Delete?",
            interrupt_id="i-1",
            question_event_id="$q1",
        )
        await store.save(pending, 600)
        assert await store.peek(sid) == pending
        assert wait_until(sentinel.in_sync, 20)
        assert await redis.ping()  # type: ignore[misc]  # a pooled connection to the old master
        old = await asyncio.to_thread(sentinel.failover)
        master, _ = sentinel.current()
        # Before the old master is demoted: within about a second the client asks the
        # sentinel again and leaves it (FollowingSentinelPool), so no write is lost there.
        await asyncio.sleep(FollowingSentinelPool.CHECK_SECONDS + 0.2)
        assert (await redis.info("server"))["tcp_port"] == master.port
        assert await store.session_for_question("$q1") == sid
        assert await store.consume(sid) == pending
        assert await store.consume(sid) is None  # once
        assert sentinel.role(old.port) == "master"  # all that happened before the demotion
        await asyncio.to_thread(sentinel.wait_demoted, old, hurry=True)
        assert await store.peek(sid) is None  # the consumption was not lost with the old master
    finally:
        await redis.aclose()



def test_the_audit_cli_reads_through_the_sentinel(sentinel: SentinelSetup) -> None:
    """`vagent audit` with the same REDIS_URL; a bad one is named without its password.
    The installed command once as a process of its own, the failures in this one."""
    master, _ = sentinel.current()
    with redis.Redis(port=master.port) as r:
        r.xadd("audit:sentinel-test", {"not": "an event"})
    env = {**os.environ, "REDIS_URL": sentinel.url, "AUDIT_STREAM": "audit:sentinel-test"}
    ok = subprocess.run(
        [str(BIN / "vagent"), "audit", "export"], env=env, capture_output=True, text=True, timeout=60
    )
    assert ok.returncode == 0, ok.stderr
    assert "skipped 1 stream entry" in ok.stderr

    env["REDIS_URL"] = "redis+sentinel://:hunter2@127.0.0.1:notaport/vagentmaster"
    for args in (["audit", "export"], ["admin", "forget", "@x:localhost"]):
        ran = run_vagent(args, env)
        assert ran.returncode == 2 and "REDIS_URL" in ran.stderr, ran.stderr
        assert "hunter2" not in ran.stderr + ran.stdout
    env["REDIS_URL"] = f"redis+sentinel://:hunter2@127.0.0.1:{free_port()}/vagentmaster"
    ran = run_vagent(["audit", "export"], env)
    assert ran.returncode == 2 and "cannot reach Redis at sentinel 127.0.0.1:" in ran.stderr, ran.stderr
    assert "hunter2" not in ran.stderr + ran.stdout


async def test_what_requests_see_when_the_master_dies(
    sentinel: SentinelSetup, graph: GraphProcess, llm_server: ScriptedLLMServer
) -> None:
    """An unplanned failover (the master killed): requests are refused with 503
    redis_unavailable until the sentinel (down-after-milliseconds 1000 here) has promoted
    the replica, then work again without a restart of the service. Runs last in the module:
    it leaves the set-up with one server."""
    g = graph
    sid = new_session()
    llm_server.push_text("Noted.")
    async with httpx.AsyncClient(base_url=g.url, timeout=60) as c:
        events = await post_sse(c, "/api/v1/process_message", message_body(sid, "remember me"), g.headers)
        assert kinds(events)[-2:] == ["text_final", "done"]
        assert wait_until(sentinel.in_sync, 20)
        old, new = sentinel.current()
        probe, stop = Probe(), asyncio.Event()
        probing = asyncio.create_task(probe.run(c, g.headers, stop))
        await asyncio.sleep(0.3)
        crash = time.monotonic()
        assert old.proc is not None
        old.proc.kill()
        assert await asyncio.to_thread(wait_until, lambda: sentinel.master_port() == new.port, 60, 0.05)
        promoted = time.monotonic() - crash
        ok_again = await asyncio.to_thread(
            wait_until, lambda: bool(probe.outcomes) and probe.outcomes[-1][1] == 200, 60, 0.05
        )
        await asyncio.sleep(0.5)
        stop.set()
        await probing
        print(f"\nmaster killed: replica promoted after {promoted:.2f}s; {probe.report()}")
        assert ok_again
        assert {o[1] for o in probe.outcomes} <= {200, 503}  # refused plainly, never a crash

        llm_server.push_text("Still here.")
        events = await post_sse(c, "/api/v1/process_message", message_body(sid, "and now?"), g.headers)
        assert events[-2] == TextFinal(content="Still here.", is_final=True)
        said = [m["content"] for m in llm_server.requests[-1]["messages"] if m["role"] == "user"]
        assert said == ["remember me", "and now?"]  # the history came through the failover
