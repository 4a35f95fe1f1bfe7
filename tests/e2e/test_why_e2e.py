"""🔍 "Why did it answer that?" end to end: alice asks in a group room, reacts 🔍 to the answer
and reads in its thread how it came about (the tool, tokens, time); bob, another member with
agent access, reacts 🔍 and replies `!why` to the same answer and gets nothing (audited as
denied); alice's own `!why` reply works like her 🔍, and once the details expired she is told so.

The account is read by whoever is in the room when it is asked for: a confidential document
found alone in a DM, or with bob (who may read it too) in a group room, is named while they
are the readers, and only counted once carol (public documents only) has joined."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis

from tests.e2e.conftest import DOMAIN, Stack
from tests.e2e.test_audit_e2e import trail_since
from tests.e2e.test_bot_e2e import dm_with_bot, group, reads
from tests.e2e.test_history_audience_e2e import invite_and_join
from tests.support.knowledge import doc_store, ingest
from tests.support.llm_server import ScriptedLLMServer
from tests.support.matrix_human import HumanClient, Msg
from vagent_bot.why.account import IN_PROGRESS_NOTICE
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


# ---- the readers are those of the room when the account is asked for ----------------------------


@pytest.fixture
async def layoffs(stack: Stack) -> AsyncIterator[tuple[str, str]]:
    """A confidential finance document in the stack's index (alice and bob may read it, carol
    not): its id and title."""
    mark = uuid.uuid4().hex[:8]
    doc_id, title = f"layoff-plan-{mark}", f"Layoff plan Q3 {mark} (confidential)"
    text = f"# {title}\n\nThe layoff plan {mark} for the third quarter names the teams concerned.\n"
    async with doc_store(stack.redis_url, index="vagent_docs") as store:
        await ingest(
            store, doc_id, text, domain=DOMAIN, category="finance", tags=("confidential",), title=title
        )
        try:
            yield doc_id, title
        finally:
            await store.delete(DOMAIN, doc_id)


async def search_and_account(
    stack: Stack, alice: HumanClient, llm: ScriptedLLMServer, room: str, ask: str, doc: tuple[str, str]
) -> tuple[Msg, Msg]:
    """Alice asks, the model searches and finds the document; her 🔍 names it while only
    readers of it are in the room. Returns the answer and that account."""
    doc_id, title = doc
    llm.push_tool_calls([("search_documents", {"query": f"layoff plan {doc_id.rsplit('-', 1)[1]}"})])
    llm.push_text("There is a plan for the quarter [1].")
    asked = await alice.send(room, ask)
    answer = await alice.wait_for_reply(
        stack.users.bot, room, lambda m: m.in_reply_to == asked and "Sources:" in m.body
    )
    assert title in answer.body  # the answer cited it: its readers then may read it
    await alice.react(room, answer.event_id, "🔍")
    named = await alice.wait_for_reply(stack.users.bot, room, account_of(answer))
    assert f"{title} (`{doc_id}`)" in named.body and "`search_documents` (built-in) · done" in named.body
    assert "Withheld" not in named.body
    return answer, named


async def assert_withheld_once_carol_joined(
    stack: Stack,
    alice: HumanClient,
    carol: HumanClient,
    room: str,
    answer: Msg,
    named: Msg,
    doc: tuple[str, str],
) -> None:
    doc_id, title = doc
    await invite_and_join(alice, carol, room)
    await alice.react(room, answer.event_id, "🔎")
    withheld = await alice.wait_for_reply(
        stack.users.bot, room, account_of(answer, other_than=named.event_id)
    )
    body = withheld.body
    assert title not in body and doc_id not in body and "Layoff" not in body, body
    assert "search_documents" not in body  # its result was derived from the document
    assert "🔒 Withheld here: 1 step and 1 source not everyone in this room may see." in body
    assert "2 model calls · 1 tool call" in body.splitlines()[-1]  # the totals stay
    seen = await carol.wait_for_reply(stack.users.bot, room, lambda m: m.event_id == withheld.event_id)
    assert title not in seen.body and doc_id not in seen.body


async def test_a_dm_that_gained_a_member_gets_no_hidden_title(
    stack: Stack,
    alice: HumanClient,
    carol: HumanClient,
    llm: ScriptedLLMServer,
    layoffs: tuple[str, str],
) -> None:
    room = await dm_with_bot(alice, stack)
    answer, named = await search_and_account(stack, alice, llm, room, "Is there a layoff plan?", layoffs)
    await assert_withheld_once_carol_joined(stack, alice, carol, room, answer, named, layoffs)


async def test_a_lower_clearance_newcomer_in_a_group_room_gets_no_hidden_title(
    stack: Stack,
    alice: HumanClient,
    bob: HumanClient,
    carol: HumanClient,
    llm: ScriptedLLMServer,
    layoffs: tuple[str, str],
) -> None:
    room = await group(alice, stack, "why-newcomer")  # bob may read finance documents too
    answer, named = await search_and_account(stack, alice, llm, room, "!ai is there a layoff plan?", layoffs)
    await assert_withheld_once_carol_joined(stack, alice, carol, room, answer, named, layoffs)
