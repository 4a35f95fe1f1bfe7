"""The bot's schedule commands through its real parts (router -> access check -> the commands ->
`ScheduleStore` in a real Redis -> a real nio client against tests/integration/test_bot_media.py's
stand-in for the homeserver, the access provider and the graph): create, list, unschedule,
pause, resume, the per-user limit, another member's number refused without revealing it, the
user's time zone in the answers, every answer a reply to the command (in its thread), nothing
sent to the model, a denied user answered with silence, the audit trail."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from tests.integration import test_bot_media as harness
from tests.integration.test_bot_media import Bot, BotFactory
from vagent_shared.audit import AuditEvent
from vagent_shared.audit_trail import AuditTrail
from vagent_shared.schedule_store import ScheduleStore

pytestmark = pytest.mark.timeout(60)

# the harness' fixtures, used here by name
outside = harness.outside
make_bot = harness.make_bot


def text(body: str, **content: Any) -> dict[str, Any]:
    return {"msgtype": "m.text", "body": body, **content}


def in_thread(body: str, root: str) -> dict[str, Any]:
    return text(body, **{"m.relates_to": {"rel_type": "m.thread", "event_id": root, "is_falling_back": True}})


def replies(bot: Bot, room: str) -> list[tuple[str, dict[str, Any]]]:
    """The bot's messages in `room`: (body, relation)."""
    return [(str(c["body"]), c.get("m.relates_to") or {}) for c in bot.outside.shown(room)]


async def said(bot: Bot, room: str, body: str, **kw: Any) -> str:
    """Sends `body`, returns the one reply it got (and checks it is a reply to that command)."""
    before = len(bot.outside.shown(room))
    event_id = await bot.handle(room, text(body), **kw)
    new = replies(bot, room)[before:]
    assert len(new) == 1, new
    answer, relation = new[0]
    assert relation.get("m.in_reply_to", {}).get("event_id") == event_id
    return answer


def member(bot: Bot) -> str:
    other = f"@o{uuid.uuid4().hex[:10]}:localhost"
    bot.outside.allowed.add(other)
    return other


async def test_create_list_and_unschedule_answered_by_the_bot_never_the_model(make_bot: BotFactory) -> None:
    bot = await make_bot()
    created = await said(bot, bot.group, "!ai !schedule in 1h: remind me to call Bob")
    assert re.fullmatch(
        r"⏰ Scheduled task 1: “remind me to call Bob”, once — "
        r"next run \w{3} \d+ \w{3} \d{4} \d\d:\d\d UTC\.",
        created,
    ), created
    [job] = await ScheduleStore(bot.redis).of_user(bot.user)
    assert job.room_id == bot.group and job.thread_root is None and job.origin == "command"
    assert job.domain == "localhost"  # the room's tenant, as the access check had it
    assert job.next_due is not None
    assert abs((job.next_due - datetime.now(UTC)) - timedelta(hours=1)) < timedelta(minutes=1)

    listed = await said(bot, bot.group, "!ai !schedules")
    lines = listed.splitlines()
    assert lines[0].startswith("⏰ Your scheduled tasks in this room")
    [line] = [ln for ln in lines if ln[:1].isdigit()]
    assert line.startswith("1. “remind me to call Bob” — once, ") and "last: not run yet" in line

    assert (
        await said(bot, bot.group, "!ai !unschedule 1")
        == "🗑️ Deleted scheduled task 1: “remind me to call Bob”."
    )
    assert await ScheduleStore(bot.redis).of_user(bot.user) == []
    assert "no scheduled tasks in this room" in await said(bot, bot.group, "!ai !schedules")
    assert bot.outside.graph_requests == []  # none of it went to the model


async def test_another_members_number_is_refused_without_revealing_it(make_bot: BotFactory) -> None:
    bot = await make_bot()
    other = member(bot)
    await said(bot, bot.group, "!ai !schedule every 2h: post the digest")
    for command in ("!ai !unschedule 1", "!ai !schedule pause 1", "!ai !schedule resume 1"):
        assert await said(bot, bot.group, command, sender=other) == "You have no scheduled task 1."
    assert "no scheduled tasks" in await said(bot, bot.group, "!ai !schedules", sender=other)
    [job] = await ScheduleStore(bot.redis).of_user(bot.user)
    assert not job.paused and job.next_due is not None  # untouched
    assert "post the digest" in await said(bot, bot.group, "!ai !schedules")


async def test_pause_and_resume_and_a_passed_one_off_cannot_be_resumed(make_bot: BotFactory) -> None:
    bot = await make_bot()
    store = ScheduleStore(bot.redis)
    await said(bot, bot.dm, "!schedule every 2h: post the digest")
    paused = await said(bot, bot.dm, "!schedule pause 1")
    assert paused.startswith("⏸️ Paused task 1: “post the digest”")
    job = await store.by_number(bot.user, 1)
    assert job is not None and job.paused and job.next_due is None
    assert "next run: paused" in await said(bot, bot.dm, "!schedules")
    assert "already paused" in await said(bot, bot.dm, "!schedule pause 1")

    resumed = await said(bot, bot.dm, "!schedule resume 1")
    assert resumed.startswith("▶️ Resumed task 1: “post the digest” — next run ")
    job = await store.by_number(bot.user, 1)
    assert (
        job is not None and not job.paused and job.next_due is not None and job.next_due > datetime.now(UTC)
    )
    assert await said(bot, bot.dm, "!schedule resume 1") == "Task 1 is not paused."

    await said(bot, bot.dm, "!schedule in 1h: call Bob")
    await said(bot, bot.dm, "!schedule pause 2")
    later = datetime.now(UTC) + timedelta(hours=2)
    bot.router.schedules.clock = lambda: later
    refused = await said(bot, bot.dm, "!schedule resume 2")
    assert "has passed, so it cannot be resumed" in refused
    job = await store.by_number(bot.user, 2)
    assert job is not None and job.paused


async def test_the_per_user_limit_is_named_and_holds(make_bot: BotFactory) -> None:
    bot = await make_bot(SCHEDULE_MAX_PER_USER=2)
    await said(bot, bot.dm, "!schedule in 1h: a")
    await said(bot, bot.dm, "!schedule in 2h: b")
    assert await said(bot, bot.dm, "!schedule in 3h: c") == (
        "You have 2 scheduled tasks, the most allowed; remove one with `!unschedule N`."
    )
    assert len(await ScheduleStore(bot.redis).of_user(bot.user)) == 2
    await said(bot, bot.dm, "!unschedule 1")
    assert (await said(bot, bot.dm, "!schedule in 3h: c")).startswith("⏰ Scheduled task 3: “c”")


async def test_refusals_are_one_sentence_and_store_nothing(make_bot: BotFactory) -> None:
    bot = await make_bot()
    refusals = {
        "!schedule every 1m: spam": "Recurring jobs may run at most once every 15 minutes.",
        "!schedule in 2s: x": "A one-off job must be at least 10 seconds ahead.",
        "!schedule whenever: x": "I don't understand the time “whenever”: try `in 20m`",
        "!schedule at 2030-01-01 10:00: x": "year",
        "!schedule": "Write `!schedule WHEN: TASK`",
        "!schedule pause x": "Write `!schedule pause N`",
    }
    for command, sentence in refusals.items():
        answer = await said(bot, bot.dm, command)
        assert sentence in answer and "\n" not in answer, (command, answer)
    assert await ScheduleStore(bot.redis).of_user(bot.user) == []


async def test_a_lowered_minimum_interval_allows_every_30s(make_bot: BotFactory) -> None:
    bot = await make_bot(SCHEDULE_MIN_INTERVAL_SECONDS=30)
    answer = await said(bot, bot.dm, "!schedule every 30s: ping")
    assert answer.startswith("⏰ Scheduled task 1: “ping”, every 30 seconds — next run ")


async def test_the_users_time_zone_is_honoured_in_the_answers(make_bot: BotFactory) -> None:
    bot = await make_bot()
    assert (await said(bot, bot.dm, "!timezone")).startswith("🕘 Your time zone is UTC")
    assert "not a time zone" in await said(bot, bot.dm, "!timezone Mars/Olympus")
    assert (await said(bot, bot.dm, "!timezone europe/oslo")).startswith(
        "🕘 Your time zone is now Europe/Oslo"
    )
    assert (await said(bot, bot.dm, "!timezone")).startswith("🕘 Your time zone is Europe/Oslo")

    created = await said(bot, bot.dm, "!schedule every day at 14:00: the digest")
    assert re.search(r"next run \w{3} \d+ \w{3} \d{4} 14:00 CES?T\.$", created), created
    [job] = await ScheduleStore(bot.redis).of_user(bot.user)
    assert job.next_due is not None and job.next_due.astimezone(ZoneInfo("Europe/Oslo")).hour == 14
    assert job.schedule.tz == "Europe/Oslo"
    assert re.search(r"next run: \w{3} \d+ \w{3} \d{4} 14:00 CES?T", await said(bot, bot.dm, "!schedules"))


async def test_in_a_thread_the_job_belongs_to_it_and_the_answer_stays_in_it(make_bot: BotFactory) -> None:
    bot = await make_bot()
    root = f"${uuid.uuid4().hex}"
    before = len(bot.outside.shown(bot.dm))
    event_id = await bot.handle(bot.dm, in_thread("!schedule in 20m: x", root))
    [(answer, relation)] = replies(bot, bot.dm)[before:]
    assert answer.startswith("⏰ Scheduled task 1: “x”")
    assert relation["rel_type"] == "m.thread" and relation["event_id"] == root
    assert relation["m.in_reply_to"]["event_id"] == event_id
    [job] = await ScheduleStore(bot.redis).of_user(bot.user)
    assert job.thread_root == root


async def test_in_a_dm_the_listing_has_every_room_and_in_a_room_only_that_room(make_bot: BotFactory) -> None:
    bot = await make_bot()
    await said(bot, bot.group, "!ai !schedule in 1h: from the group")
    await said(bot, bot.dm, "!schedule in 1h: from the dm")
    in_dm = await said(bot, bot.dm, "!schedules")
    assert "from the group" in in_dm and "from the dm" in in_dm
    in_group = await said(bot, bot.group, "!ai !schedules")
    assert "from the group" in in_group and "from the dm" not in in_group


async def test_a_denied_user_gets_silence_and_an_unaddressed_command_is_ignored(make_bot: BotFactory) -> None:
    bot = await make_bot()
    stranger = f"@s{uuid.uuid4().hex[:10]}:localhost"  # not allowed by the access provider
    await bot.handle(bot.dm, text("!schedule in 1h: x"), sender=stranger)
    await bot.handle(bot.group, text("!schedule in 1h: x"))  # a group room without prefix or mention
    assert bot.outside.shown(bot.dm) == [] and bot.outside.shown(bot.group) == []
    assert await ScheduleStore(bot.redis).of_user(stranger) == []
    assert await ScheduleStore(bot.redis).of_user(bot.user) == []


async def test_created_paused_and_deleted_are_audited_without_the_task_text(make_bot: BotFactory) -> None:
    bot = await make_bot()
    stream = f"audit:test:{uuid.uuid4().hex[:8]}"
    trail = AuditTrail("bot", bot.redis, stream)
    trail.start()
    bot.router.schedules.audit = trail
    try:
        await said(bot, bot.dm, "!schedule every 2h: my secret plan")
        await said(bot, bot.dm, "!schedule pause 1")
        await said(bot, bot.dm, "!unschedule 1")
        await trail.flush()
    finally:
        await trail.aclose()
    entries = await bot.redis.xrange(stream)
    events = [AuditEvent.from_stream(fields or {}) for _, fields in entries or []]
    assert [e.event_type for e in events] == ["schedule_created", "schedule_paused", "schedule_deleted"]
    for event in events:
        assert event.user_id == bot.user and event.domain == "localhost"
        assert event.metadata["number"] == 1 and event.metadata["kind"] == "every"
        assert event.resource == f"schedule:{event.metadata['job_id']}"
    assert "my secret plan" not in str([e.model_dump() for e in events])
