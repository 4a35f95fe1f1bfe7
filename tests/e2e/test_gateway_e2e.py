"""The gateway end to end: a demo user's own Matrix access token, issued by a real Synapse,
works from `langgraph_sdk` as its documentation shows (`get_client(url=..., api_key=token)`).

The stack of tests/e2e/conftest.py (Synapse, Redis, the graph on the scripted LLM, the
development AccessControlProvider) with a gateway process in front of its graph. alice is an
operator; carol is known to the provider without agent access: 403, and once she logs out on
Synapse and the token cache time passes, 401.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client

from tests.e2e.conftest import Stack
from tests.support.gateway_process import GatewayProcess
from tests.support.graph_process import TOKEN as GRAPH_TOKEN
from tests.support.llm_server import ScriptedLLMServer
from tests.support.records import CUTOFF, add_old_record, older

pytestmark = pytest.mark.e2e
AGENT = "vagent"
CACHE_SECONDS = 1


@pytest.fixture(scope="module")
def gateway(stack: Stack) -> Iterator[GatewayProcess]:
    with GatewayProcess(
        stack.redis_url,
        stack.tmp / "gateway",
        homeserver=stack.synapse.url,
        graph_url=stack.graph.url,
        graph_token=GRAPH_TOKEN,
        acp_url=stack.acp_url,
        GATEWAY_TOKEN_CACHE_SECONDS=str(CACHE_SECONDS),
        FLOOD_MAX_MESSAGES="1000",
    ) as gw:
        yield gw


async def login(stack: Stack, user_id: str) -> str:
    """A fresh access token of `user_id` from Synapse (a new device, as a web client gets)."""
    body = {
        "type": "m.login.password",
        "identifier": {"type": "m.id.user", "user": user_id},
        "password": stack.users.passwords[user_id],
        "initial_device_display_name": "gateway e2e",
    }
    async with httpx.AsyncClient(base_url=stack.synapse.url, timeout=30) as c:
        r = await c.post("/_matrix/client/v3/login", json=body)
        r.raise_for_status()
        token: str = r.json()["access_token"]
        return token


async def logout(stack: Stack, token: str) -> None:
    async with httpx.AsyncClient(base_url=stack.synapse.url, timeout=30) as c:
        r = await c.post("/_matrix/client/v3/logout", json={}, headers={"Authorization": f"Bearer {token}"})
        r.raise_for_status()


@pytest.fixture
async def tokens(stack: Stack, gateway: GatewayProcess) -> AsyncIterator[list[str]]:
    """Tokens the test logs in; after it, none of them is in the gateway's log, and all are
    logged out (a second logout of one already out is refused, and that is fine)."""
    issued: list[str] = []
    yield issued
    logs = gateway.logs()
    for token in issued:
        assert token not in logs
        try:
            await logout(stack, token)
        except httpx.HTTPStatusError:
            pass


async def collect(stream: AsyncIterator[Any]) -> list[tuple[str, Any]]:
    return [(part.event, part.data) async for part in stream]


async def status_of(call: Any) -> int:
    with pytest.raises(httpx.HTTPStatusError) as info:
        await call
    return info.value.response.status_code


def said(text: str) -> Any:
    """A run's input: one human message."""
    return {"messages": [{"type": "human", "content": text}]}


def texts(values: dict[str, Any]) -> list[tuple[str, str]]:
    return [(m["type"], m["content"]) for m in values["messages"]]


async def test_a_synapse_token_streams_an_answer_and_approves_a_confirmation(
    stack: Stack, gateway: GatewayProcess, llm: ScriptedLLMServer, tokens: list[str]
) -> None:
    tokens.append(alice_token := await login(stack, stack.users.alice))
    alice = get_client(url=gateway.url, api_key=alice_token)
    answer = "The gateway answers with the graph"
    llm.push_text(answer, delay=0.06)  # ~0.3 s: several STREAM_COALESCE_MS windows
    thread = await alice.threads.create(metadata={"from": "e2e"})
    parts = await collect(
        alice.runs.stream(
            thread["thread_id"],
            AGENT,
            input=said("Who answers?"),
            stream_mode=["values", "messages-tuple"],
        )
    )
    assert parts[0][0] == "metadata" and parts[-1][0] == "end"
    chunks = [data for event, data in parts if event == "messages"]
    assert len(chunks) >= 3 and "".join(c[0]["content"] for c in chunks) == answer
    final = [data for event, data in parts if event == "values"][-1]
    assert texts(final) == [("human", "Who answers?"), ("ai", answer)]
    found = await alice.threads.search(metadata={"from": "e2e"}, limit=100)
    assert thread["thread_id"] in [t["thread_id"] for t in found]

    # a confirmation: the interrupt, then approve deletes what was asked
    records = stack.graph.data_dir / "records.db"
    add_old_record(records)
    llm.push_tool_calls([("delete_records", {"older_than": CUTOFF})])
    asked = await alice.runs.wait(thread["thread_id"], AGENT, input=said("delete old records"))
    assert isinstance(asked, dict)
    (interrupt,) = asked["__interrupt__"]
    assert CUTOFF in interrupt["value"]["action_requests"][0]["description"]
    assert older(records) > 0
    llm.push_text("Deleted.")
    done = await alice.runs.wait(
        thread["thread_id"], AGENT, command={"resume": {"decisions": [{"type": "approve"}]}}
    )
    assert isinstance(done, dict) and texts(done)[-1] == ("ai", "Deleted.")
    assert older(records) == 0

    # another operator's own Synapse token does not see alice's thread
    tokens.append(bob_token := await login(stack, stack.users.bob))
    bob = get_client(url=gateway.url, api_key=bob_token)
    assert await status_of(bob.threads.get(thread["thread_id"])) == 404


async def test_no_agent_access_403_then_logged_out_401(
    stack: Stack, gateway: GatewayProcess, tokens: list[str]
) -> None:
    tokens.append(carol_token := await login(stack, stack.users.carol))
    carol = get_client(url=gateway.url, api_key=carol_token)
    assert await status_of(carol.threads.create()) == 403  # a real person, without agent access
    assert await status_of(carol.threads.search()) == 403
    await logout(stack, carol_token)
    await asyncio.sleep(CACHE_SECONDS + 0.5)  # GATEWAY_TOKEN_CACHE_SECONDS
    assert await status_of(carol.threads.search()) == 401
    forged = get_client(url=gateway.url, api_key=carol_token[:-2] + "xx")
    assert await status_of(forged.threads.search()) == 401
