"""The model's `schedule_task` through the real graph service (docs/schedules.md): the model
stand-in calls the tool, the user answers the question exactly as the bot forwards it, and each
test reads what the user was asked, what the model was told, and what Redis holds (the jobs the
bot's scheduler would run). Every test has users of its own.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import cast

import pytest
from redis.asyncio import Redis

from tests.support.factories import ac, new_session
from tests.support.graph_process import GraphProcess
from tests.support.llm_server import ScriptedLLMServer
from tests.support.memory_http import MemoryChat, chat_with, final, running_graph
from vagent_shared import AcContext, SessionId
from vagent_shared.audit import AuditEvent
from vagent_shared.events import HitlRequest
from vagent_shared.schedule_store import ScheduleStore

DOMAIN = "northwind"
#: The packaged agent's tools this test's users are granted (schedule_task on top, or not).
BASE = ["tool:ask_user", "tool:search_documents"]
MAX_PER_USER = 2


@pytest.fixture(scope="module")
def graph(
    redis_url: str, _llm_session: ScriptedLLMServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GraphProcess]:
    """The packaged agent (schedule_task offered to whoever is granted it), at most
    MAX_PER_USER jobs a user, the default minimum interval (15 minutes)."""
    data = tmp_path_factory.mktemp("graph-schedule")
    with running_graph(
        redis_url, data, _llm_session, "schedtool_docs", SCHEDULE_MAX_PER_USER=str(MAX_PER_USER)
    ) as g:
        yield g


@pytest.fixture
async def chat(graph: GraphProcess, llm_server: ScriptedLLMServer) -> AsyncIterator[MemoryChat]:
    async with chat_with(graph, llm_server) as c:
        yield c


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[ScheduleStore]:
    redis = Redis.from_url(redis_url)
    try:
        yield ScheduleStore(redis)
    finally:
        await redis.aclose()


def person(granted: bool = True) -> AcContext:
    grants = [*BASE, "tool:schedule_task"] if granted else BASE
    return ac(f"@sched-{uuid.uuid4().hex[:8]}:x", grants, domain=DOMAIN)


def in_thread(who: AcContext) -> SessionId:
    return new_session(who.user_id, thread=f"$root{uuid.uuid4().hex[:10]}")


async def model_schedules(chat: MemoryChat, sid: SessionId, who: AcContext, **args: str) -> list[object]:
    """A turn in which the model calls schedule_task(**args): the events the user got."""
    chat.llm.push_tool_calls([("schedule_task", args)])
    chat.llm.push_text("Done.")
    return list(await chat.say(sid, "remind me every weekday morning to check my tickets", who))


def tool_result(chat: MemoryChat) -> str:
    """What the model was told by schedule_task in its latest request."""
    for message in reversed(chat.llm.requests[-1]["messages"]):
        if message.get("role") == "tool":
            return str(message["content"])
    raise AssertionError(chat.llm.requests[-1]["messages"])


async def audit_of(redis_url: str, user: str, event_type: str) -> list[AuditEvent]:
    redis = Redis.from_url(redis_url)
    try:
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]], await redis.xrange("vagent:audit"))
    finally:
        await redis.aclose()
    events = [AuditEvent.from_stream(fields) for _, fields in entries]
    return [e for e in events if e.user_id == user and e.event_type == event_type]


async def test_the_model_schedules_only_after_the_user_confirms_what_they_saw(
    chat: MemoryChat, store: ScheduleStore, redis_url: str
) -> None:
    alice = person()
    sid = in_thread(alice)
    task = "List my open tickets"
    events = await model_schedules(chat, sid, alice, task=task, cron="0 9 * * 1-5")
    (asked,) = [e for e in events if isinstance(e, HitlRequest)]
    # the question shows the task, the schedule and the next run (in the user's zone: UTC here)
    assert task in asked.question, asked.question
    assert "every weekday at 09:00" in asked.question and "next run" in asked.question, asked.question
    assert "UTC" in asked.question and sorted(asked.options) == ["no", "yes"]
    assert await store.of_user(alice.user_id) == []  # nothing before the yes

    said = final(await chat.answer(sid, "yes"))
    assert said == "Done."
    (job,) = await store.of_user(alice.user_id)
    assert (job.number, job.task, job.origin) == (1, task, "tool")
    assert (job.room_id, job.thread_root, job.domain) == (sid.room_id, sid.thread_id, DOMAIN)
    assert job.schedule.kind == "cron" and job.schedule.cron == "0 9 * * 1-5"
    assert job.next_due is not None and job.next_due > datetime.now(UTC)
    local = job.next_due.astimezone(UTC)
    assert (local.hour, local.minute, local.weekday() < 5) == (9, 0, True)
    told = tool_result(chat)
    assert told.startswith("Scheduled task 1") and "!unschedule 1" in told and "!schedules" in told, told
    (created,) = await audit_of(redis_url, alice.user_id, "schedule_created")
    assert created.resource == f"schedule:{job.id}" and created.metadata["number"] == 1
    assert task not in created.model_dump_json()  # the record names the job, never its text


async def test_the_question_and_next_run_are_in_the_users_time_zone(
    chat: MemoryChat, store: ScheduleStore
) -> None:
    bob = person()
    await store.set_timezone(bob.user_id, "Europe/Oslo")
    sid = new_session(bob.user_id)
    events = await model_schedules(chat, sid, bob, task="Send me the digest", cron="30 8 * * *")
    (asked,) = [e for e in events if isinstance(e, HitlRequest)]
    assert "Europe/Oslo" in asked.question and " 08:30 CE" in asked.question, asked.question
    final(await chat.answer(sid, "yes"))
    (job,) = await store.of_user(bob.user_id)
    assert job.schedule.tz == "Europe/Oslo" and job.thread_root is None
    assert job.next_due is not None
    assert job.next_due.astimezone(UTC).hour in (7, 6)  # 08:30 in Oslo (CET or CEST)


async def test_no_makes_nothing(chat: MemoryChat, store: ScheduleStore) -> None:
    carol = person()
    sid = new_session(carol.user_id)
    events = await model_schedules(chat, sid, carol, task="Remind me to call Bob", every="2h")
    assert [e for e in events if isinstance(e, HitlRequest)]
    final(await chat.answer(sid, "no"))
    assert await store.of_user(carol.user_id) == []


async def test_a_refused_schedule_is_told_to_the_model_and_nobody_is_asked(
    chat: MemoryChat, store: ScheduleStore
) -> None:
    dave = person()
    sid = new_session(dave.user_id)
    events = await model_schedules(chat, sid, dave, task="Ping me", every="1m")
    assert not [e for e in events if isinstance(e, HitlRequest)], events
    told = tool_result(chat)
    assert told.startswith("Not scheduled:") and "15 minutes" in told, told
    events = await model_schedules(chat, sid, dave, task="Ping me", every="2h", cron="0 9 * * *")
    assert not [e for e in events if isinstance(e, HitlRequest)]
    assert tool_result(chat) == "Not scheduled: Give exactly one of at, every, cron."
    assert await store.of_user(dave.user_id) == []


async def test_without_the_grant_the_call_is_refused_and_nothing_is_stored(
    chat: MemoryChat, store: ScheduleStore
) -> None:
    erin = person(granted=False)
    sid = new_session(erin.user_id)
    events = await model_schedules(chat, sid, erin, task="List my open tickets", every="1d")
    assert not [e for e in events if isinstance(e, HitlRequest)], events
    offered = {t["function"]["name"] for t in chat.llm.requests[0].get("tools", [])}
    assert "schedule_task" not in offered  # never offered ...
    assert tool_result(chat) == "I can't do that here.", tool_result(chat)
    assert await store.of_user(erin.user_id) == []  # ... and refused when called anyway


async def test_a_limit_reached_while_the_question_waited_refuses_the_yes(
    chat: MemoryChat, store: ScheduleStore
) -> None:
    frank = person()
    sid = new_session(frank.user_id)
    events = await model_schedules(chat, sid, frank, task="Weekly report", cron="0 9 * * 1")
    assert [e for e in events if isinstance(e, HitlRequest)]
    now = datetime.now(UTC)
    for n in range(MAX_PER_USER):  # meanwhile, by !schedule (the bot)
        from vagent_shared.schedule_times import parse_schedule_command

        parsed = parse_schedule_command(
            f"every day at 0{n + 1}:00: chore {n}", now, "UTC", min_interval_seconds=900
        )
        assert not hasattr(parsed, "code"), parsed
        made = await store.create(
            owner=frank.user_id,
            room_id=sid.room_id,
            task=parsed.task,  # type: ignore[union-attr]
            schedule=parsed.schedule,  # type: ignore[union-attr]
            next_due=parsed.first_run,  # type: ignore[union-attr]
            max_per_user=MAX_PER_USER,
            now=now,
        )
        assert not hasattr(made, "limit"), made
    final(await chat.answer(sid, "yes"))
    told = tool_result(chat)
    assert told.startswith("Not scheduled:") and f"most allowed is {MAX_PER_USER}" in told, told
    assert [j.task for j in await store.of_user(frank.user_id)] == ["chore 0", "chore 1"]
