"""🔍 "Why did it answer that?" end to end: alice asks in a group room, reacts 🔍 to the answer
and reads in its thread how it came about (the tool, tokens, time); bob, another member with
agent access, reacts 🔍 and replies `!why` to the same answer and gets nothing (audited as
denied); alice's own `!why` reply works like her 🔍, and once the details expired she is told so."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis

from tests.e2e.conftest import Stack
from tests.e2e.test_audit_e2e import trail_since
from tests.e2e.test_bot_e2e import group, reads
from tests.support.llm_server import ScriptedLLMServer
from tests.support.matrix_human import HumanClient, Msg
from vagent_bot.why import IN_PROGRESS_NOTICE
from vagent_shared import redis_keys

pytestmark = pytest.mark.e2e
SQL = "SELECT COUNT(*) AS n FROM records"
HEAD = "🔍 **How this answer came about:** ✅ answered"
GONE = "🔍 I no longer have the details of that answer (they are kept 7 days)."


async def turn_of(stack: Stack, event_id: str) -> str:
    """The turn the bot indexed its message under."""
    redis = Redis.from_url(stack.redis_url, decode_responses=True)
    try:
        turn_id = await redis.get(redis_keys.trace_event(event_id))
    finally:
        await redis.aclose()
    assert isinstance(turn_id, str)
    return turn_id


async def denials(stack: Stack, start: datetime, user_id: str, expected: int) -> int:
    """How many of the user's 🔍 / `!why` on another's answer are audited (waits for `expected`)."""
    deadline = time.monotonic() + 10
    while True:
        found = [
            e
            for e in await trail_since(stack, start, {user_id})
            if e.event_type == "access_denied" and e.reason == "asked why about another user's answer"
        ]
        if len(found) >= expected or time.monotonic() > deadline:
            return len(found)
        await asyncio.sleep(0.2)


def account_of(answer: Msg, other_than: str = "") -> Callable[[Msg], bool]:
    """The bot's account in the answer's thread (another one than `other_than`)."""
    return lambda m: m.thread_root == answer.event_id and m.body.startswith(HEAD) and m.event_id != other_than


async def test_only_the_asker_sees_how_an_answer_came_about(
    stack: Stack, alice: HumanClient, bob: HumanClient, llm: ScriptedLLMServer
) -> None:
    u = stack.users
    start = datetime.now(UTC)
    room = await group(alice, stack, "why")
    llm.push_tool_calls([("database_query", {"sql": SQL})])
    llm.push_text("I counted the records.")
    await alice.send(room, "!ai how many records are there?")
    answer = await alice.wait_for_reply(u.bot, room, reads("I counted the records."))

    await alice.react(room, answer.event_id, "🔍")
    shown = await alice.wait_for_reply(u.bot, room, lambda m: m.thread_root == answer.event_id)
    body = shown.body
    assert body.startswith(HEAD), body
    assert "`database_query` (built-in) · done" in body  # the tool and its outcome
    assert body.count("🧠 ") == 2  # the model call that chose the tool, the one that answered
    total = re.fullmatch(
        r"\*\*Total:\*\* ([\d,]+) in / ([\d,]+) out tokens · 2 model calls · 1 tool call · .+",
        body.splitlines()[-1],
    )
    assert total is not None and int(total[1].replace(",", "")) > 0  # the usage the model reported
    assert SQL not in body  # what happened, never with what

    # bob may use the agent, but it was alice's answer: his 🔍 and his `!why` get nothing
    await bob.react(room, answer.event_id, "🔍")
    await bob.send(room, "!why", reply_to=answer.event_id)
    await alice.assert_no_message_from(u.bot, room, within=2.5)
    assert await denials(stack, start, u.bob, expected=2) == 2

    await alice.send(room, "!why", reply_to=answer.event_id)
    again = await alice.wait_for_reply(u.bot, room, account_of(answer, other_than=shown.event_id))
    assert again.body == body

    # a pointer without its trace: the turn is still being answered (the trace comes at its end)
    turn_id = await turn_of(stack, answer.event_id)
    await stack.redis_delete(redis_keys.trace_turn(turn_id))
    await alice.react(room, answer.event_id, "🔍\ufe0f")  # (her plain 🔍 is taken: one per key)
    await alice.wait_for_reply(u.bot, room, reads(IN_PROGRESS_NOTICE))
    # once the details expired, she is told so (and only she would be)
    await stack.redis_delete(redis_keys.trace_event(answer.event_id))
    await alice.react(room, answer.event_id, "🔎")
    await alice.wait_for_reply(u.bot, room, reads(GONE))
