"""Two gateway replicas on one Redis behave as one, driven with the real `langgraph_sdk`: the
per-person run limit counts the runs of both, a cancel sent to one stops a run streaming on the
other (and the graph stops being asked), a second run of a busy thread on the other replica is
refused, and a replica that dies stops counting once its runs' leases run out.

Real parts: Redis, the graph as a process with the scripted LLM, the development
AccessControlProvider, two `vagent-gateway` processes, the whoami stand-in homeserver.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient
from redis.asyncio import Redis
from vagent_gateway.replicas import RunLeases, RunRef

from tests.support.gateway_process import GatewayProcess, WhoamiStandIn, demo_acp
from tests.support.graph_process import TOKEN as GRAPH_TOKEN
from tests.support.graph_process import GraphProcess
from tests.support.llm_server import ScriptedLLMServer
from vagent_shared import redis_keys

ALICE, BOB = "@alice:localhost", "@bob:localhost"
ALICE_TOKEN = f"syt_a_{secrets.token_urlsafe(24)}"
BOB_TOKEN = f"syt_b_{secrets.token_urlsafe(24)}"
AGENT = "vagent"
MAX_STREAMS = 2
SLOW = "a slow answer written one word at a time so there is time to act"


@pytest.fixture(scope="module")
def replicas(
    redis_url: str, _llm_session: ScriptedLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GatewayProcess, GatewayProcess]]:
    tmp = tmp_path_factory.mktemp("gw-replicas")
    (tmp / "acp").mkdir()
    with (
        WhoamiStandIn({ALICE_TOKEN: ALICE, BOB_TOKEN: BOB}) as whoami,
        demo_acp(tmp / "acp") as acp,
        GraphProcess(redis_url, tmp / "graph", _llm_session.base_url) as graph,
    ):
        common: dict[str, Any] = {
            "homeserver": whoami.url,
            "graph_url": graph.url,
            "graph_token": GRAPH_TOKEN,
            "acp_url": acp.base_url,
            "GATEWAY_MAX_STREAMS_PER_USER": str(MAX_STREAMS),
            "FLOOD_MAX_MESSAGES": "1000",
        }
        with (
            GatewayProcess(redis_url, tmp / "a", **common) as a,
            GatewayProcess(redis_url, tmp / "b", **common) as b,
        ):
            yield a, b
        for gw in (a, b):
            for token in (ALICE_TOKEN, BOB_TOKEN):
                assert token not in gw.logs()
        _ = acp  # kept running until both replicas stopped


def on(gw: GatewayProcess, token: str = ALICE_TOKEN) -> LangGraphClient:
    return get_client(url=gw.url, api_key=token)


def said(text: str) -> Any:
    return {"messages": [{"role": "user", "content": text}]}


async def error_of(call: Any) -> tuple[int, str]:
    with pytest.raises(httpx.HTTPStatusError) as info:
        await call
    return info.value.response.status_code, info.value.response.json().get("error_code", "")


class Streaming:
    """A run streamed in the background; `answering` is set at its first chunk of text."""

    def __init__(self, client: LangGraphClient, thread_id: str) -> None:
        self.parts: list[tuple[str, Any]] = []
        self.run_id = ""
        self.answering = asyncio.Event()
        self.task = asyncio.create_task(self._run(client, thread_id))

    async def _run(self, client: LangGraphClient, thread_id: str) -> None:
        async for part in client.runs.stream(
            thread_id, AGENT, input=said("tell me slowly"), stream_mode=["messages-tuple", "values"]
        ):
            self.parts.append((part.event, part.data))
            if part.event == "metadata":
                self.run_id = part.data["run_id"]
            if part.event == "messages":
                self.answering.set()

    async def started(self) -> Streaming:
        await asyncio.wait_for(self.answering.wait(), 30)
        return self

    @property
    def events(self) -> list[str]:
        return [e for e, _ in self.parts]


async def test_the_limit_counts_the_runs_of_both_replicas(
    replicas: tuple[GatewayProcess, GatewayProcess], llm_server: ScriptedLLMServer
) -> None:
    a, b = replicas
    threads = [(await on(a).threads.create())["thread_id"] for _ in range(MAX_STREAMS + 1)]
    for _ in range(MAX_STREAMS):
        llm_server.push_text(SLOW, delay=0.25)
    running = [await Streaming(on(a), t).started() for t in threads[:MAX_STREAMS]]
    # the (N+1)th run of the same person, on the other replica: refused
    refused = await error_of(on(b).runs.wait(threads[-1], AGENT, input=said("one more")))
    assert refused == (429, "too_many_runs")
    # another person is not counted with her
    llm_server.push_text("Hi Bob.")
    bobs = (await on(b, BOB_TOKEN).threads.create())["thread_id"]
    answered: Any = await on(b, BOB_TOKEN).runs.wait(bobs, AGENT, input=said("hi"))
    assert answered["messages"][-1]["content"] == "Hi Bob."
    await asyncio.wait_for(asyncio.gather(*(r.task for r in running)), 60)
    assert all(r.events[-1] == "end" for r in running)
    # the runs ended on A: B admits hers again at once
    llm_server.push_text("Now there is room.")
    result: Any = await on(b).runs.wait(threads[-1], AGENT, input=said("one more"))
    assert result["messages"][-1]["content"] == "Now there is room."


async def test_a_cancel_sent_to_the_other_replica_stops_the_run(
    replicas: tuple[GatewayProcess, GatewayProcess], llm_server: ScriptedLLMServer
) -> None:
    a, b = replicas
    llm_server.push_text(SLOW, delay=0.5)
    thread_id = (await on(a).threads.create())["thread_id"]
    run = await Streaming(on(a), thread_id).started()
    # not hers: another person, or a run id of nothing, is a 404 on B as on A
    assert (await error_of(on(b, BOB_TOKEN).runs.cancel(thread_id, run.run_id)))[0] == 404
    assert (await error_of(on(b).runs.cancel(thread_id, secrets.token_hex(16))))[0] == 404
    assert not run.task.done()

    began = time.monotonic()
    await on(b).runs.cancel(thread_id, run.run_id)
    await asyncio.wait_for(run.task, 5)
    assert time.monotonic() - began < 3  # at once, not at the next lease renewal
    assert run.events[-2:] == ["error", "end"]
    assert next(d for e, d in run.parts if e == "error")["error"] == "cancelled"
    text = "".join(d[0]["content"] for e, d in run.parts if e == "messages")
    assert text and len(text) < len(SLOW)  # stopped part-way
    # the graph stopped being asked: the model's stream was dropped, not finished
    assert await asyncio.to_thread(llm_server.wait_for_streams, disconnected=1, timeout=10)
    assert llm_server.completed_streams == 0
    assert (await on(b).threads.get(thread_id))["status"] == "idle"


async def test_a_busy_thread_is_busy_on_the_other_replica(
    replicas: tuple[GatewayProcess, GatewayProcess], llm_server: ScriptedLLMServer
) -> None:
    a, b = replicas
    llm_server.push_text(SLOW, delay=0.25)
    thread_id = (await on(a).threads.create())["thread_id"]
    run = await Streaming(on(a), thread_id).started()
    assert await error_of(on(b).runs.wait(thread_id, AGENT, input=said("me too"))) == (409, "thread_busy")
    await asyncio.wait_for(run.task, 60)
    assert run.events[-1] == "end" and "error" not in run.events  # the refused run harmed nothing
    values: Any = (await on(b).threads.get(thread_id))["values"]
    assert [m["content"] for m in values["messages"]] == ["tell me slowly", SLOW]


async def test_deleting_on_the_other_replica_stops_the_run(
    replicas: tuple[GatewayProcess, GatewayProcess], llm_server: ScriptedLLMServer
) -> None:
    a, b = replicas
    llm_server.push_text(SLOW, delay=0.5)
    thread_id = (await on(a).threads.create())["thread_id"]
    run = await Streaming(on(a), thread_id).started()
    await on(b).threads.delete(thread_id)
    await asyncio.wait_for(run.task, 5)
    assert run.events[-2:] == ["error", "end"]
    assert await asyncio.to_thread(llm_server.wait_for_streams, disconnected=1, timeout=10)
    assert (await error_of(on(a).threads.get(thread_id)))[0] == 404


async def test_a_dead_replicas_runs_stop_counting_when_their_lease_ends(redis_url: str) -> None:
    """What a replica killed mid-run leaves (never renewed, never released): it counts until
    the lease runs out, then not; and the keys expire on their own (no erasure needed)."""
    redis = Redis.from_url(redis_url)
    try:
        leases = RunLeases(redis, max_per_user=2, lease_seconds=1.0)
        owner = f"@dead{secrets.token_hex(4)}:localhost"
        runs = [RunRef(str(i) + secrets.token_hex(8), owner, secrets.token_hex(8)) for i in range(3)]
        assert await leases.acquire(runs[0]) and await leases.acquire(runs[1])
        assert not await leases.acquire(runs[2])
        for key in (redis_keys.gateway_runs_of(owner), redis_keys.gateway_run(runs[0].run_id)):
            assert 0 < await redis.pttl(key) <= 1000
        assert await leases.find(runs[0].run_id) == runs[0]
        assert await leases.running_on(runs[1].thread_id, owner) == runs[1]
        await asyncio.sleep(1.2)
        assert await leases.acquire(runs[2])  # the dead ones no longer count
        assert await redis.zrange(redis_keys.gateway_runs_of(owner), 0, -1) == [runs[2].run_id.encode()]
        assert await leases.find(runs[0].run_id) is None
        # a renewed run keeps counting past its first lease; a cancel flag reaches the renewal
        await asyncio.sleep(0.6)
        assert await leases.renew([runs[2]]) == set()
        assert await leases.request_cancel(runs[2].run_id)
        await asyncio.sleep(0.6)
        assert await leases.renew([runs[2]]) == {runs[2].run_id}
        await leases.release(runs[2])
        assert not await redis.exists(redis_keys.gateway_run(runs[2].run_id))
        assert not await leases.request_cancel(runs[2].run_id)  # nothing live: no record re-made
        assert not await redis.exists(redis_keys.gateway_run(runs[2].run_id))
        await asyncio.sleep(1.1)
        assert not await redis.exists(redis_keys.gateway_runs_of(owner))  # expired on its own
    finally:
        await redis.aclose()
