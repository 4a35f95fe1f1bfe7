"""Per-user credentials end to end in Matrix: alice and bob each see their own tickets,
alice creates one after confirming, and no key reaches a Matrix message, a log of any
service, Redis, the LLM or the metrics. (No key, a denied user and a registry that is down:
tests/integration/test_credentials_flow.py.)"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.e2e.conftest import Stack
from tests.e2e.test_bot_e2e import dm_with_bot
from tests.support.llm_server import ScriptedLLMServer
from tests.support.matrix_human import HumanClient
from tests.support.redis_dump import dump_redis

pytestmark = pytest.mark.e2e


async def text_of(url: str) -> str:
    async with httpx.AsyncClient() as c:
        return (await c.get(url)).text


def tool_results(llm: ScriptedLLMServer) -> list[str]:
    return [str(m["content"]) for r in llm.requests for m in r["messages"] if m["role"] == "tool"]


async def test_each_user_acts_with_their_own_key_and_no_key_leaks(
    stack: Stack, alice: HumanClient, bob: HumanClient, llm: ScriptedLLMServer
) -> None:
    u = stack.users
    for human, mine, theirs in (
        (alice, "Alice's VPN", "Bob's monitor"),
        (bob, "Bob's monitor", "Alice's VPN"),
    ):
        room = await dm_with_bot(human, stack)
        llm.push_tool_calls([("list_my_tickets", {"status": "open"})])
        llm.push_text("Here are your tickets.")
        await human.send(room, "what are my open tickets?")
        await human.wait_for_reply(u.bot, room, lambda m: m.body == "Here are your tickets.")
        listed = tool_results(llm)[-1]
        assert mine in listed and theirs not in listed

    room = await dm_with_bot(alice, stack)
    llm.push_tool_calls([("create_ticket", {"title": "Coffee machine leaks", "priority": "low"})])
    await alice.send(room, "open a ticket: the coffee machine leaks")
    await alice.wait_for_reply(
        u.bot, room, lambda m: "Coffee machine leaks" in m.body and m.body.startswith("❓")
    )
    llm.push_text("Ticket created.")
    await alice.send(room, "yes")
    await alice.wait_for_reply(u.bot, room, lambda m: m.body == "Ticket created.")
    assert tool_results(llm)[-1].startswith("Created ticket T-")

    received = json.loads(await text_of(stack.tickets.health_url.replace("/health", "/debug/requests")))[
        "requests"
    ]
    owners = [(r["method"], r["owner"]) for r in received]
    assert owners == [("GET", u.alice), ("GET", u.bob), ("POST", u.alice)]

    seen = [m.body for m in await alice.messages_from(u.bot, room)]
    assert any("Coffee machine leaks" in body for body in seen)
    artifacts = {
        "matrix": json.dumps(seen),
        "bot log": stack.logs(),
        "graph log": stack.graph.logs(),
        "llm": json.dumps(llm.requests),
        "redis": json.dumps(await dump_redis(stack.redis_url)),
        "graph metrics": await text_of(f"{stack.graph.url}/metrics"),
    }
    leaks = [where for where, text in artifacts.items() for key in stack.ticket_keys.values() if key in text]
    assert leaks == []
