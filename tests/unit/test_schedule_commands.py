"""The schedule commands' words (vagent_bot.schedules.commands): every form of `!schedule`,
`!schedules`, `!unschedule`, `!timezone` parsed after the bot's usual addressing, malformed
ones answered with how to write them, and the answers' text (number, schedule, next run in the
user's zone; listing lines; the limit; "no such task" that never tells whose it is)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from vagent_bot.conversation.commands import help_text, parse_command
from vagent_bot.conversation.routing import parse_message, should_answer
from vagent_bot.schedules.commands import (
    USAGE_PAUSE,
    USAGE_RESUME,
    USAGE_SCHEDULE,
    USAGE_UNSCHEDULE,
    CreateJob,
    DeleteJob,
    ListJobs,
    PauseJob,
    ResumeJob,
    ScheduleCommand,
    SetTimezone,
    ShowTimezone,
    Usage,
    created_text,
    job_line,
    limit_text,
    list_text,
    no_such_job,
    parse_schedule_command_words,
)
from vagent_shared.schedule_store import LimitReached
from vagent_shared.schedules import Schedule, ScheduledJob

NOW = datetime(2026, 11, 30, 13, 0, tzinfo=UTC)


def words(text: str) -> ScheduleCommand | None:
    command = parse_command(text)
    return None if command is None else parse_schedule_command_words(command)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("!schedule in 20m: x", CreateJob("in 20m: x")),
        ("!schedule in 20m: remind me to call Bob", CreateJob("in 20m: remind me to call Bob")),
        (
            "!SCHEDULE every weekday at 09:00: list my open tickets",
            CreateJob("every weekday at 09:00: list my open tickets"),
        ),
        ("!schedule cron 0 9 * * 1-5: digest", CreateJob("cron 0 9 * * 1-5: digest")),
        ("!schedule at 2026-12-01 14:00: call Bob", CreateJob("at 2026-12-01 14:00: call Bob")),
        ("!schedule pause 2", PauseJob(2)),
        ("!schedule Pause #2", PauseJob(2)),
        ("!schedule resume 2", ResumeJob(2)),
        ("!schedule resume 2.", ResumeJob(2)),
        ("!unschedule 3", DeleteJob(3)),
        ("!unschedule  #3 ", DeleteJob(3)),
        ("!schedules", ListJobs()),
        ("!Schedules please", ListJobs()),
        ("!schedule list", ListJobs()),
        ("!timezone", ShowTimezone()),
        ("!timezone Europe/Oslo", SetTimezone("Europe/Oslo")),
        ("!timezone  europe/oslo ", SetTimezone("europe/oslo")),
        # "pause" as the start of a task's WHEN: the time parser judges it, not this one
        ("!schedule pause at 9: think", CreateJob("pause at 9: think")),
    ],
)
def test_every_form_is_parsed(text: str, expected: ScheduleCommand) -> None:
    assert words(text) == expected


@pytest.mark.parametrize(
    "text,usage",
    [
        ("!schedule", USAGE_SCHEDULE),
        ("!schedule   ", USAGE_SCHEDULE),
        ("!schedule pause", USAGE_PAUSE),
        ("!schedule pause two", USAGE_PAUSE),
        ("!schedule pause 0", USAGE_PAUSE),
        ("!schedule resume", USAGE_RESUME),
        ("!schedule resume -1", USAGE_RESUME),
        ("!unschedule", USAGE_UNSCHEDULE),
        ("!unschedule all", USAGE_UNSCHEDULE),
        ("!unschedule 1 2", USAGE_UNSCHEDULE),
    ],
)
def test_malformed_commands_get_a_usage_sentence(text: str, usage: str) -> None:
    assert words(text) == Usage(usage)
    assert "`!" in usage  # it shows how to write it


@pytest.mark.parametrize(
    "text", ["!help", "!reset", "!why", "!remember x", "!schedul in 1h: x", "schedule in 1h: x"]
)
def test_other_messages_are_no_schedule_commands(text: str) -> None:
    assert words(text) is None


def routed_text(body: str) -> tuple[bool, str]:
    """What routing makes of `body` in a group room with prefix `!ai`."""
    m = parse_message(
        {
            "type": "m.room.message",
            "event_id": "$e",
            "sender": "@a:example.org",
            "content": {"msgtype": "m.text", "body": body},
        },
        "!r:example.org",
    )
    assert m is not None
    d = should_answer(
        m,
        bot_user_id="@vagent:example.org",
        bot_display_name="vagent",
        is_dm=False,
        prefix="!ai",
        replied_to_sender=None,
        bot_in_thread=False,
    )
    return d.answer, d.text


def test_in_a_group_room_they_need_the_prefix_or_a_mention_like_every_command() -> None:
    assert routed_text("!ai !schedules") == (True, "!schedules")
    answer, text = routed_text("vagent: !unschedule 2")
    assert answer and words(text) == DeleteJob(2)
    answer, _ = routed_text("!schedule in 20m: x")
    assert not answer


def job(number: int = 3, **fields: object) -> ScheduledJob:
    values: dict[str, object] = {
        "id": "j1",
        "number": number,
        "owner": "@a:example.org",
        "room_id": "!r:example.org",
        "task": "remind me to call Bob",
        "schedule": Schedule(kind="at", at=NOW + timedelta(minutes=20), tz="Europe/Oslo", text="in 20m"),
        "created_at": NOW,
        "next_due": NOW + timedelta(minutes=20),
    }
    values.update(fields)
    return ScheduledJob.model_validate(values)


def test_the_answer_names_the_number_and_the_next_run_in_the_users_zone() -> None:
    assert created_text(job(), "Europe/Oslo") == (
        "⏰ Scheduled task 3: “remind me to call Bob”, once — next run Mon 30 Nov 2026 14:20 CET."
    )
    weekly = job(
        4,
        schedule=Schedule(kind="cron", cron="0 9 * * 1-5", tz="Europe/Oslo", text="every weekday at 09:00"),
        next_due=datetime(2026, 12, 1, 8, 0, tzinfo=UTC),
    )
    text = created_text(weekly, "Europe/Oslo")
    assert text.startswith("⏰ Scheduled task 4: “remind me to call Bob”, ")
    assert "(Europe/Oslo)" in text and text.endswith("next run Tue 1 Dec 2026 09:00 CET.")


def test_a_listing_line_starts_with_the_number_and_says_schedule_next_run_and_last_result() -> None:
    every = Schedule(kind="every", every_seconds=7200, anchor=NOW, tz="UTC", text="every 2h")
    line = job_line(job(1, schedule=every, last_outcome="ran", last_result="ran"), "UTC")
    assert line.startswith("1. “remind me to call Bob” — every 2 hours — next run: Mon 30 Nov 2026 13:20 UTC")
    assert line.endswith("last: ran")
    assert "next run: paused" in job_line(job(1, paused=True, next_due=None), "UTC")
    assert "next run: missed" in job_line(job(1, next_due=None, last_outcome="missed"), "UTC")
    assert "next run: done" in job_line(job(1, next_due=None, last_outcome="ran"), "UTC")
    assert "last: not run yet" in job_line(job(1), "UTC")
    skipped = job(1, last_outcome="skipped", last_result="skipped: you are no longer in this room")
    assert job_line(skipped, "UTC").endswith("last: skipped: you are no longer in this room")


def test_a_long_task_is_cut_on_one_line() -> None:
    line = job_line(job(2, task="word " * 100), "UTC")
    assert "\n" not in line and "…”" in line and len(line) < 250


def test_the_listing_has_one_line_per_job_and_an_empty_one_says_how_to_create() -> None:
    text = list_text([job(1), job(2, task="digest")], "Europe/Oslo", is_dm=False)
    lines = text.splitlines()
    assert [ln[:3] for ln in lines if ln[:1].isdigit()] == ["1. ", "2. "]
    assert "in this room" in lines[0] and "Europe/Oslo" in lines[0]
    empty_here = list_text([], "UTC", is_dm=False)
    assert "no scheduled tasks in this room" in empty_here and "`!schedule WHEN: TASK`" in empty_here
    assert "in this room" not in list_text([], "UTC", is_dm=True)


def test_the_limit_is_named() -> None:
    assert limit_text(LimitReached(limit=10, live=10)) == (
        "You have 10 scheduled tasks, the most allowed; remove one with `!unschedule N`."
    )
    assert "the most allowed is 5" in limit_text(LimitReached(limit=5, live=7))


def test_no_such_task_never_says_whose() -> None:
    assert no_such_job(1) == "You have no scheduled task 1."


def test_help_lists_the_schedule_commands_and_the_time_zone() -> None:
    text = help_text("!ai", default_tz="Europe/Berlin")
    for needle in (
        "`!schedule WHEN: TASK`",
        "`!schedules`",
        "`!unschedule N`",
        "`!schedule pause N`",
        "`!schedule resume N`",
        "`!timezone Europe/Oslo`",
        "Europe/Berlin until you set one",
        "⏰ Scheduled",
    ):
        assert needle in text, needle
