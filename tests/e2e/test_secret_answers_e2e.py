"""A secret-looking answer to the agent's question never leaves the bot, end to end.

The scripted LLM makes the graph ask alice for an API key (`ask_user`); alice pastes one.
The bot warns her once in the same conversation and passes nothing on: the question stays
pending, the graph and the LLM never see the key, and it is in no log of any service and in
no Redis key or value. Her next, harmless answer resumes the run as usual. The same holds for
a yes/no confirmation: a key is refused as a secret, not re-asked "please answer yes or no".
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time

import httpx
import pytest

from tests.e2e.conftest import Stack
from tests.e2e.test_bot_e2e import add_old_record, ask_delete, dm_with_bot, older_than, reads
from tests.support.llm_server import ScriptedLLMServer
from tests.support.matrix_human import HumanClient
from tests.support.redis_dump import dump_redis
from vagent_shared import SessionId, redis_keys
from vagent_shared.hitl import PendingQuestion

pytestmark = pytest.mark.e2e

QUESTION = "Please paste your API key for the ticket service."
WARNING = "🔒 That looks like a password, key or token"


def tool_results(llm: ScriptedLLMServer) -> list[str]:
    return [str(m["content"]) for r in llm.requests for m in r["messages"] if m["role"] == "tool"]


async def pending_question(stack: Stack, sid: str) -> PendingQuestion | None:
    raw = (await dump_redis(stack.redis_url, match=redis_keys.hitl_pending(sid))).get(
        redis_keys.hitl_pending(sid)
    )
    return PendingQuestion.model_validate_json(raw) if raw else None


async def settled(stack: Stack, event_id: str, timeout: float = 15) -> None:  # noqa: ASYNC109
    """Until the bot finished handling `event_id`: its copy of the event (kept while it works
    on it, for a takeover should it die) is gone, and its refusal is in its log."""
    key = redis_keys.event_unfinished(event_id)
    deadline = time.monotonic() + timeout
    while True:
        left = await dump_redis(stack.redis_url, match=key)
        if not left and "hitl_secret_refused" in stack.main_bot.logs():
            return
        assert time.monotonic() < deadline, f"the bot did not finish {event_id}: {left}"
        await asyncio.sleep(0.2)


async def leaks(
    stack: Stack, alice: HumanClient, room: str, llm: ScriptedLLMServer, secret: str
) -> list[str]:
    """Where `secret` appears: the bot's messages, any service's log, the LLM, Redis, metrics."""
    async with httpx.AsyncClient(timeout=10) as c:
        bot_metrics = (await c.get(stack.main_bot.health_url.replace("/health", "/metrics"))).text
        graph_metrics = (await c.get(f"{stack.graph.url}/metrics")).text
    artifacts = {
        "bot messages": json.dumps([m.body for m in await alice.messages_from(stack.users.bot, room)]),
        "bot log": stack.logs(),
        "graph log": stack.graph.logs(),
        "acp log": stack.acp.logs(),
        "llm": json.dumps(llm.requests),
        "redis": json.dumps(await dump_redis(stack.redis_url)),
        "bot metrics": bot_metrics,
        "graph metrics": graph_metrics,
    }
    return [where for where, text in artifacts.items() if secret in text]


async def refused_count(stack: Stack) -> float:
    async with httpx.AsyncClient(timeout=10) as c:
        text = (await c.get(stack.main_bot.health_url.replace("/health", "/metrics"))).text
    for line in text.splitlines():
        if line.startswith('vagent_bot_hitl_total{event="secret_refused"}'):
            return float(line.split()[-1])
    return 0.0


async def test_a_pasted_key_is_refused_and_never_leaves_the_bot(
    stack: Stack, alice: HumanClient, llm: ScriptedLLMServer
) -> None:
    u = stack.users
    room = await dm_with_bot(alice, stack)
    sid = SessionId(room_id=room, user_id=u.alice).format()
    llm.push_tool_calls([("ask_user", {"question": QUESTION})])
    await alice.send(room, "open a ticket: the VPN is down")
    question = await alice.wait_for_reply(u.bot, room, reads(f"❓ {QUESTION}"))
    await stack.question_saved(question.event_id)
    asked = await pending_question(stack, sid)
    assert asked is not None and asked.question == QUESTION
    requests_before, refused_before = len(llm.requests), await refused_count(stack)

    key = "dev-tickets-key-alice-" + secrets.token_hex(8)
    sent = await alice.send(room, key)
    warning = await alice.wait_for_reply(u.bot, room, lambda m: m.body.startswith(WARNING))
    assert warning.in_reply_to == sent and key not in warning.body
    await settled(stack, sent)
    await asyncio.sleep(1.5)  # time for a wrongly submitted answer to reach the graph and the LLM

    assert await pending_question(stack, sid) == asked  # not consumed: she may answer again
    assert len(llm.requests) == requests_before  # the run did not resume
    assert await refused_count(stack) == refused_before + 1
    bot_messages = [m.body for m in await alice.messages_from(u.bot, room)]
    assert bot_messages == [f"❓ {QUESTION}", warning.body]  # one warning, nothing else
    assert await leaks(stack, alice, room, llm, key) == []
    refusals = [r for r in stack.main_bot.log_records() if r.get("event") == "hitl_secret_refused"]
    assert any(r.get("session_id") == sid and r.get("chars") == len(key) for r in refusals)

    llm.push_text("Fine, I will open the ticket without a key.")
    await alice.send(room, "I don't have a key for it")
    await alice.wait_for_reply(u.bot, room, reads("Fine, I will open the ticket without a key."))
    assert await pending_question(stack, sid) is None
    assert tool_results(llm)[-1] == "The user answered: I don't have a key for it"
    assert await leaks(stack, alice, room, llm, key) == []  # nor in the checkpoint of the resumed run


async def test_a_key_sent_to_a_yes_no_question_is_refused_not_reasked(
    stack: Stack, alice: HumanClient, llm: ScriptedLLMServer
) -> None:
    u = stack.users
    room = await dm_with_bot(alice, stack)
    sid = SessionId(room_id=room, user_id=u.alice).format()
    add_old_record(stack, "2017-06-01")
    before = older_than(stack, "2018-01-01")
    await ask_delete(alice, stack, llm, room, "2018-01-01", "delete records older than 2018")
    requests_before = len(llm.requests)

    key = "sk-proj-" + secrets.token_urlsafe(24)
    sent = await alice.send(room, key)
    warning = await alice.wait_for_reply(u.bot, room, lambda m: m.body.startswith(WARNING))
    assert warning.in_reply_to == sent
    await settled(stack, sent)
    await asyncio.sleep(1)
    bodies = [m.body for m in await alice.messages_from(u.bot, room)]
    assert not any(b.startswith("Please answer") for b in bodies)
    assert await pending_question(stack, sid) is not None and len(llm.requests) == requests_before
    assert older_than(stack, "2018-01-01") == before
    assert await leaks(stack, alice, room, llm, key) == []

    llm.push_text("Okay, I did not delete anything.")
    await alice.send(room, "no")
    await alice.wait_for_reply(u.bot, room, reads("Okay, I did not delete anything."))
    assert older_than(stack, "2018-01-01") == before
    assert "The user said no" in tool_results(llm)[-1]
    assert await leaks(stack, alice, room, llm, key) == []
