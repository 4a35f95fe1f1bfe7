"""The audit trail end to end: one conversation in Matrix that uses a tool, is denied a
tool, asks for a confirmation that another member tries to give and the asker gives, and a
member without access; every decision of both services is in the Redis stream, in order."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis

from tests.e2e.conftest import Stack
from tests.e2e.test_bot_e2e import add_old_record, dm_with_bot, group
from tests.support.llm_server import ScriptedLLMServer
from tests.support.matrix_human import HumanClient
from vagent_shared.audit import AuditEvent
from vagent_shared.settings import CommonSettings

pytestmark = pytest.mark.e2e
SQL = "SELECT COUNT(*) AS n FROM records"


async def trail_since(stack: Stack, start: datetime, users: set[str]) -> list[AuditEvent]:
    redis = Redis.from_url(stack.redis_url)
    try:
        entries = await redis.xrange(CommonSettings().AUDIT_STREAM)
    finally:
        await redis.aclose()
    events = [AuditEvent.from_stream(fields or {}) for _, fields in entries or []]
    return sorted(
        (e for e in events if e.timestamp >= start and e.user_id in users), key=lambda e: e.timestamp
    )


def brief(e: AuditEvent) -> tuple[str, str, str, str, str]:
    return (e.service, e.event_type, e.user_id, e.resource, e.decision)


def in_order(
    events: list[AuditEvent], expected: list[tuple[str, str, str, str, str]]
) -> list[tuple[str, ...]]:
    """`expected` as a subsequence of the trail; what could not be matched, in order."""
    seen = iter([brief(e) for e in events])
    return [want for want in expected if not any(got == want for got in seen)]


async def test_every_decision_of_a_conversation_is_on_record_in_order(
    stack: Stack, alice: HumanClient, bob: HumanClient, carol: HumanClient, llm: ScriptedLLMServer
) -> None:
    u = stack.users
    start = datetime.now(UTC)
    room = await group(alice, stack, "audit")

    llm.push_tool_calls([("database_query", {"sql": SQL})])
    llm.push_tool_calls([("lookup_entities", {"query": "the secret project"})])  # never offered
    llm.push_text("Counted them.")
    await alice.send(room, "!ai how many records are there?")
    await alice.wait_for_reply(u.bot, room, lambda m: m.body == "Counted them.")

    add_old_record(stack, "2015-03-01")
    llm.push_tool_calls([("delete_records", {"older_than": "2015-06-01"})])
    await alice.send(room, "!ai delete records older than 2015-06-01")
    q = await alice.wait_for_reply(u.bot, room, lambda m: m.body.startswith("❓ Delete"))
    await bob.react(room, q.event_id, "✅")  # not his question
    await asyncio.sleep(1)
    llm.push_text("Deleted.")
    await alice.send(room, "yes")
    await alice.wait_for_reply(u.bot, room, lambda m: m.body == "Deleted.")

    dm = await dm_with_bot(carol, stack)
    await carol.send(dm, "hello?")
    await carol.assert_no_message_from(u.bot, dm, within=2)
    await asyncio.sleep(1)  # the writers drain their queues in the background

    events = await trail_since(stack, start, {u.alice, u.bob, u.carol})
    agent = "agent:vagent"
    missing = in_order(
        events,
        [
            ("bot", "agent_access", u.alice, agent, "allowed"),
            ("graph", "tool_offered", u.alice, agent, "allowed"),
            ("graph", "tool_access", u.alice, "tool:database_query", "allowed"),
            ("graph", "access_denied", u.alice, "tool:lookup_entities", "denied"),
            ("bot", "agent_access", u.alice, agent, "allowed"),
            ("graph", "tool_offered", u.alice, agent, "allowed"),
            ("bot", "access_denied", u.bob, f"question:{q.event_id}", "denied"),
            ("bot", "agent_access", u.alice, agent, "allowed"),
            ("graph", "tool_access", u.alice, "tool:delete_records", "allowed"),
            ("bot", "agent_access", u.carol, agent, "denied"),
        ],
    )
    assert missing == [], [brief(e) for e in events]
    decision = next(e for e in events if e.event_type == "hitl_decision")
    assert (decision.service, decision.user_id, decision.decision) == ("bot", u.alice, "approved")
    offered = next(e for e in events if e.event_type == "tool_offered")
    assert (
        "lookup_entities" not in offered.metadata["tools"] and "database_query" in offered.metadata["tools"]
    )
    query = next(e for e in events if e.resource == "tool:database_query")
    assert query.metadata["arguments"] == {"sql": f"[omitted: {len(SQL)} chars]"}  # free text: its length
    assert all(e.session_id for e in events if e.service == "graph")
    hitl_at = events.index(decision)
    assert brief(events[hitl_at + 1])[1:4] == ("tool_access", u.alice, "tool:delete_records")
