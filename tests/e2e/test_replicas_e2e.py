"""Several replicas as a user sees them: two graph replicas behind a round-robin proxy (a
load balancer's stand-in, tests/support/tcp_proxy.py) and two bot processes on the bot's
one account, all on the stack's Redis.

Each message is answered once; when the replica streaming an answer dies, the user is told
once and the next message of the conversation is answered through the other replica.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.conftest import Stack, down
from tests.e2e.test_bot_e2e import bodies, dm_with_bot, said, wait_for_echoes
from tests.support.graph_process import GraphProcess
from tests.support.llm_server import ScriptedLLMServer
from tests.support.matrix_human import HumanClient
from tests.support.tcp_proxy import RoundRobinProxy

INTERRUPTED = "⚠️ My answer was interrupted. Please try again."


@pytest.fixture
def replicas(stack: Stack) -> Iterator[tuple[list[GraphProcess], RoundRobinProxy]]:
    """The stack's graph and a second replica like it, behind a proxy; the stack's graph is
    running again afterwards (a test may kill it)."""
    same = ("CREDENTIAL_REGISTRY_URL", "CREDENTIAL_CACHE_KEY", "TICKETS_URL")
    second = GraphProcess(
        stack.redis_url, stack.tmp / "graph", stack.llm.base_url, **{k: stack.graph.env[k] for k in same}
    )
    graphs = [stack.graph, second]
    proxy = RoundRobinProxy([("127.0.0.1", g.port) for g in graphs])
    try:
        second.start()
        proxy.start()
        yield graphs, proxy
    finally:
        proxy.stop()
        second.stop()
        if stack.graph.proc is None:
            stack.graph.start()


def running(graph: GraphProcess) -> int:
    """How many runs the replica has under way (its /health)."""
    try:
        return int(httpx.get(f"{graph.url}/health", timeout=5).json()["active_sessions"])
    except (httpx.HTTPError, ValueError, KeyError):
        return 0


async def test_two_replicas_two_bots(
    stack: Stack,
    alice: HumanClient,
    llm: ScriptedLLMServer,
    replicas: tuple[list[GraphProcess], RoundRobinProxy],
) -> None:
    graphs, proxy = replicas
    behind_proxy = {"GRAPH_API_ENDPOINT": proxy.url}
    with (
        down(stack.main_bot),
        stack.another_bot("bot", **behind_proxy),  # the main bot's store: the same device
        stack.another_bot("bot2", **behind_proxy),
    ):
        room = await dm_with_bot(alice, stack)
        texts = [f"message {i}" for i in range(4)]
        sent = [await alice.send(room, text) for text in texts]
        await wait_for_echoes(alice, stack, room, texts, timeout=40)
        await asyncio.sleep(2)
        replies = await alice.messages_from(stack.users.bot, room)
        assert sorted(m.in_reply_to or "" for m in replies) == sorted(sent)  # each answered once
        assert {p for p in proxy.routed if p is not None} == {("127.0.0.1", g.port) for g in graphs}

        try:
            await killed_mid_stream(stack, alice, llm, graphs, room)
        finally:
            if stack.graph.proc is None:  # the main bot, started again next, checks it
                stack.graph.start()


async def killed_mid_stream(
    stack: Stack, alice: HumanClient, llm: ScriptedLLMServer, graphs: list[GraphProcess], room: str
) -> None:
    """The replica streaming an answer dies: told once, the next message answered."""
    llm.push_text("slow " * 100, chunks=100, delay=0.1)
    await alice.send(room, "write a lot")
    await alice.wait_for_reply(stack.users.bot, room, lambda m: m.body.startswith("slow"), timeout=30)
    [victim] = [g for g in graphs if await asyncio.to_thread(running, g)]
    victim.kill()
    await alice.wait_for_reply(stack.users.bot, room, lambda m: m.body == INTERRUPTED, timeout=30)

    # The dead run's lock lease runs out within seconds; the bot waits that long for a
    # busy session, so the next message is simply answered (by the other replica).
    await alice.send(room, "still there?")
    await alice.wait_for_reply(stack.users.bot, room, said("still there?"), timeout=60)
    await asyncio.sleep(2)
    answers = await bodies(alice, stack, room)
    assert answers.count(INTERRUPTED) == 1  # told once
    assert answers.count("You said: still there?") == 1
    assert not [b for b in answers if b.startswith("⚠️") and b != INTERRUPTED]
