"""Scheduled tasks' times (issue 32): every `!schedule` form and the model's `schedule_task`
arguments parse to the schedule and first run a user expects, every limit is refused with a
sentence, runs stay at their wall-clock time across daylight-saving changes, and the
missed-run policy never bursts."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vagent_shared.schedule_times import (
    MissedDecision,
    ParsedSchedule,
    ScheduleRefusal,
    describe,
    due_after_missed,
    human_interval,
    next_due,
    parse_duration,
    parse_schedule_command,
    schedule_from_tool,
    valid_timezone,
    when_text,
)
from vagent_shared.schedules import TASK_MAX_CHARS, Schedule

OSLO = "Europe/Oslo"
#: Monday 30 Nov 2026, 09:00 in Oslo (CET, UTC+1).
NOW = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
MIN = 900


def parse(text: str, now: datetime = NOW, tz: str = OSLO, min_interval: int = MIN) -> ParsedSchedule:
    result = parse_schedule_command(text, now, tz, min_interval_seconds=min_interval)
    assert isinstance(result, ParsedSchedule), result
    return result


def refuse(text: str, now: datetime = NOW, tz: str = OSLO, min_interval: int = MIN) -> ScheduleRefusal:
    result = parse_schedule_command(text, now, tz, min_interval_seconds=min_interval)
    assert isinstance(result, ScheduleRefusal), result
    return result


def local(dt: datetime, tz: str = OSLO) -> str:
    return dt.astimezone(ZoneInfo(tz)).strftime("%Y-%m-%d %H:%M %Z")


def runs(schedule: Schedule, after: datetime, count: int) -> list[datetime]:
    out: list[datetime] = []
    for _ in range(count):
        nxt = next_due(schedule, after)
        assert nxt is not None
        out.append(nxt)
        after = nxt
    return out


# ---- every form of the issue ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "first_local", "task"),
    [
        ("in 90s: stretch", "2026-11-30 09:01 CET", "stretch"),
        ("in 20m: remind me to call Bob", "2026-11-30 09:20 CET", "remind me to call Bob"),
        ("in 2h: x", "2026-11-30 11:00 CET", "x"),
        ("in 1d: x", "2026-12-01 09:00 CET", "x"),
        ("in 1h30m: x", "2026-11-30 10:30 CET", "x"),
        ("in 1 hour 30 minutes: x", "2026-11-30 10:30 CET", "x"),
        ("at 2026-12-01 14:00: call Bob", "2026-12-01 14:00 CET", "call Bob"),
        ("at 14:00: x", "2026-11-30 14:00 CET", "x"),
        ("at 08:00: x", "2026-12-01 08:00 CET", "x"),  # 08:00 has passed today: tomorrow's
        ("at 9pm: x", "2026-11-30 21:00 CET", "x"),
        ("tomorrow at 9: x", "2026-12-01 09:00 CET", "x"),
        ("tomorrow 9am: x", "2026-12-01 09:00 CET", "x"),
        ("at dec 24 18:00: x", "2026-12-24 18:00 CET", "x"),
        ("at 2026-12-01T14:00:00Z: x", "2026-12-01 15:00 CET", "x"),
    ],
)
def test_one_off_forms_run_once_at_the_time_meant_in_the_users_zone(
    text: str, first_local: str, task: str
) -> None:
    parsed = parse(text)
    assert parsed.schedule.kind == "at"
    assert parsed.task == task
    assert local(parsed.first_run) == first_local
    assert parsed.schedule.at == parsed.first_run
    assert parsed.schedule.text == text.split(": ")[0]  # the WHEN as written
    assert next_due(parsed.schedule, NOW) == parsed.first_run
    assert next_due(parsed.schedule, parsed.first_run) is None  # once


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("every 2h: x", 7200), ("every 1d: x", 86400), ("every 30m: x", 1800), ("every hour: x", 3600)],
)
def test_intervals_repeat_from_now_plus_the_interval(text: str, seconds: int) -> None:
    parsed = parse(text)
    assert parsed.schedule.kind == "every"
    assert parsed.schedule.every_seconds == seconds
    assert parsed.first_run == NOW + timedelta(seconds=seconds) == parsed.schedule.anchor
    assert runs(parsed.schedule, NOW, 3) == [NOW + timedelta(seconds=seconds * k) for k in (1, 2, 3)]


@pytest.mark.parametrize(
    ("text", "cron", "first_local", "described"),
    [
        ("every day at 08:30: x", "30 8 * * *", "2026-12-01 08:30 CET", "every day at 08:30"),
        (
            "every weekday at 09:00: list my open tickets",
            "0 9 * * 1-5",
            "2026-12-01 09:00 CET",  # Monday 09:00 is now: not strictly after it
            "every weekday at 09:00",
        ),
        ("every monday at 10:00: x", "0 10 * * 1", "2026-11-30 10:00 CET", "every Monday at 10:00"),
        ("every friday at 17:30: x", "30 17 * * 5", "2026-12-04 17:30 CET", "every Friday at 17:30"),
        (
            "every mon and fri at 9am: x",
            "0 9 * * 1,5",
            "2026-12-04 09:00 CET",
            "every Monday, Friday at 09:00",
        ),
        ("every weekend at noon: x", "0 12 * * 0,6", "2026-12-05 12:00 CET", "every weekend day at 12:00"),
        ("cron 0 9 * * 1-5: digest", "0 9 * * 1-5", "2026-12-01 09:00 CET", "every weekday at 09:00"),
        ("cron 15 6 1 * *: rent", "15 6 1 * *", "2026-12-01 06:15 CET", "cron 15 6 1 * *"),
    ],
)
def test_wall_clock_forms_become_cron_in_the_users_zone(
    text: str, cron: str, first_local: str, described: str
) -> None:
    parsed = parse(text)
    assert parsed.schedule.kind == "cron"
    assert parsed.schedule.cron == cron
    assert parsed.schedule.tz == OSLO
    assert local(parsed.first_run) == first_local
    assert describe(parsed.schedule) == f"{described} (Europe/Oslo)"


def test_the_when_ends_at_the_first_colon_that_ends_a_valid_time() -> None:
    assert parse("at 2026-12-01 14:00: call Bob: about the invoice").task == "call Bob: about the invoice"
    assert parse("in 20m: note: buy milk").task == "note: buy milk"
    assert parse("cron 0 9 * * 1-5:   digest  ").task == "digest"
    # "remind me" is no time: the WHEN is the longer prefix ending at a later colon
    parsed = parse("every weekday at 9: standup")
    assert parsed.schedule.cron == "0 9 * * 1-5" and parsed.task == "standup"


def test_every_30s_is_refused_at_the_default_minimum_and_accepted_at_a_lower_one() -> None:
    refusal = refuse("every 30s: ping")
    assert refusal.code == "too_often"
    assert "15 minutes" in refusal.message
    parsed = parse("every 30s: ping", min_interval=10)
    assert parsed.schedule.every_seconds == 30


# ---- refusals -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "code", "words"),
    [
        ("in 20m call Bob", "no_task", "WHEN: TASK"),
        ("in 20m:", "no_task", "what to do"),
        ("in 20m:    ", "no_task", "what to do"),
        (": call Bob", "no_task", "WHEN: TASK"),
        ("whenever you like: x", "unknown_when", "every weekday at 09:00"),
        ("in a while: x", "unknown_when", "in 20m"),
        ("every blue moon: x", "unknown_when", "cron 0 9 * * 1-5"),
        ("in 5s: x", "too_soon", "10 seconds"),
        ("in 0s: x", "in_past", "passed"),
        ("at 2020-01-01 10:00: x", "in_past", "already passed"),
        ("at 2028-01-01 10:00: x", "too_far", "a year"),
        ("in 400d: x", "too_far", "a year"),
        ("every 5m: x", "too_often", "15 minutes"),
        ("cron */5 * * * *: x", "too_often", "15 minutes"),
        ("cron 0,10 9 * * *: x", "too_often", "15 minutes"),  # two runs 10 min apart each day
        ("cron 0 9 * *: x", "bad_cron", "5 fields"),
        ("cron 0 25 * * *: x", "bad_cron", "hour field “25”"),
        ("cron 61 9 * * *: x", "bad_cron", "minute field “61”"),
        ("cron 0 9 * * funday: x", "bad_cron", "day of week field"),
        ("cron 0 9 30 2 *: x", "bad_cron", "never runs"),
    ],
)
def test_each_refusal_is_one_clear_sentence(text: str, code: str, words: str) -> None:
    refusal = refuse(text)
    assert refusal.code == code
    assert words in refusal.message
    assert refusal.message.endswith(".")


def test_a_task_too_long_and_an_unknown_zone_are_refused() -> None:
    assert refuse("in 20m: " + "x" * (TASK_MAX_CHARS + 1)).code == "task_too_long"
    assert parse("in 20m: " + "x" * TASK_MAX_CHARS).task == "x" * TASK_MAX_CHARS
    refusal = refuse("in 20m: x", tz="Mars/Olympus_Mons")
    assert refusal.code == "bad_timezone" and "!timezone" in refusal.message


def test_a_one_off_at_least_10s_and_at_most_a_year_ahead_is_accepted() -> None:
    assert parse("in 10s: x").first_run == NOW + timedelta(seconds=10)
    assert local(parse("at 2027-11-29 09:00: x").first_run) == "2027-11-29 09:00 CET"


def test_a_naive_now_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        parse_schedule_command("in 20m: x", NOW.replace(tzinfo=None), OSLO, min_interval_seconds=MIN)


# ---- daylight saving (Europe/Oslo 2026: forward on 29 March, back on 25 October) -----------


def test_every_day_at_0230_runs_once_on_the_spring_forward_day() -> None:
    schedule = parse("every day at 02:30: x", now=datetime(2026, 3, 27, 12, tzinfo=UTC)).schedule
    got = [local(t) for t in runs(schedule, datetime(2026, 3, 27, 12, tzinfo=UTC), 4)]
    # 02:30 does not exist on 29 March: it runs once that night, at the first minute that does
    assert got == [
        "2026-03-28 02:30 CET",
        "2026-03-29 03:00 CEST",
        "2026-03-30 02:30 CEST",
        "2026-03-31 02:30 CEST",
    ]


def test_every_day_at_0900_stays_at_0900_local_across_both_changes() -> None:
    schedule = parse("every day at 09:00: x", now=datetime(2026, 3, 26, 12, tzinfo=UTC)).schedule
    spring = runs(schedule, datetime(2026, 3, 26, 12, tzinfo=UTC), 5)
    autumn = runs(schedule, datetime(2026, 10, 22, 12, tzinfo=UTC), 5)
    for t in spring + autumn:
        assert t.astimezone(ZoneInfo(OSLO)).strftime("%H:%M") == "09:00"
    # the instants move by the hour the clocks did
    assert spring[2] - spring[1] == timedelta(hours=23)  # 28 -> 29 March
    assert autumn[2] - autumn[1] == timedelta(hours=25)  # 24 -> 25 October


def test_a_cron_at_0230_runs_once_in_the_fall_back_night() -> None:
    schedule = parse("cron 30 2 * * *: x", now=datetime(2026, 10, 23, 12, tzinfo=UTC)).schedule
    got = runs(schedule, datetime(2026, 10, 23, 12, tzinfo=UTC), 4)
    on_the_night = [t for t in got if t.astimezone(ZoneInfo(OSLO)).date().isoformat() == "2026-10-25"]
    assert [local(t) for t in on_the_night] == ["2026-10-25 02:30 CEST"]
    assert [local(t) for t in got] == [
        "2026-10-24 02:30 CEST",
        "2026-10-25 02:30 CEST",
        "2026-10-26 02:30 CET",
        "2026-10-27 02:30 CET",
    ]


def test_a_one_off_in_the_fall_back_hour_is_its_first_occurrence() -> None:
    parsed = parse("at 2026-10-25 02:30: x", now=datetime(2026, 10, 24, 12, tzinfo=UTC))
    assert local(parsed.first_run) == "2026-10-25 02:30 CEST"


# ---- next runs and the missed-run policy ----------------------------------------------------


def test_next_due_is_strictly_after() -> None:
    at = Schedule(kind="at", at=NOW + timedelta(hours=1))
    assert next_due(at, NOW) == NOW + timedelta(hours=1)
    assert next_due(at, NOW + timedelta(hours=1)) is None
    every = Schedule(kind="every", every_seconds=3600, anchor=NOW)
    assert next_due(every, NOW - timedelta(days=1)) == NOW
    assert next_due(every, NOW) == NOW + timedelta(hours=1)
    assert next_due(every, NOW + timedelta(minutes=59)) == NOW + timedelta(hours=1)
    cron = Schedule(kind="cron", cron="0 9 * * *", tz=OSLO)
    assert local(next_due(cron, NOW) or NOW) == "2026-12-01 09:00 CET"  # NOW is 09:00 itself
    assert local(next_due(cron, NOW - timedelta(seconds=1)) or NOW) == "2026-11-30 09:00 CET"
    never = Schedule(kind="cron", cron="0 9 30 2 *", tz=OSLO)
    assert next_due(never, NOW) is None


def test_a_one_off_missed_while_no_bot_ran_runs_late_within_grace_else_is_missed() -> None:
    once = Schedule(kind="at", at=NOW)
    assert due_after_missed(once, NOW, NOW, 3600) == MissedDecision(run_now=True, missed=False, next_due=None)
    late = NOW + timedelta(seconds=3600)
    assert due_after_missed(once, NOW, late, 3600) == MissedDecision(
        run_now=True, missed=False, next_due=None
    )
    too_late = late + timedelta(seconds=1)
    assert due_after_missed(once, NOW, too_late, 3600) == MissedDecision(
        run_now=False, missed=True, next_due=None
    )


def test_a_recurring_job_that_missed_5_occurrences_runs_once_and_next_is_in_the_future() -> None:
    every = Schedule(kind="every", every_seconds=3600, anchor=NOW)
    now = NOW + timedelta(hours=5, minutes=10)  # due at NOW, +1h, ..., +5h all passed
    decision = due_after_missed(every, NOW, now, 60)
    assert decision.run_now and not decision.missed
    assert decision.next_due == NOW + timedelta(hours=6)
    # the scheduler claims that next due; it is not due yet, so nothing runs in a burst
    assert next_due(every, now) == decision.next_due
    assert decision.next_due is not None
    assert due_after_missed(every, decision.next_due, now, 60).run_now is False

    cron = Schedule(kind="cron", cron="0 9 * * *", tz=OSLO)
    later = NOW + timedelta(days=5, hours=2)  # five 09:00 runs passed
    decision = due_after_missed(cron, NOW, later, 60)
    assert decision.run_now and not decision.missed
    assert decision.next_due is not None and local(decision.next_due) == "2026-12-06 09:00 CET"


def test_a_run_not_yet_due_does_not_run() -> None:
    once = Schedule(kind="at", at=NOW + timedelta(minutes=1))
    decision = due_after_missed(once, NOW + timedelta(minutes=1), NOW, 3600)
    assert decision == MissedDecision(run_now=False, missed=False, next_due=NOW + timedelta(minutes=1))


# ---- the model's schedule_task --------------------------------------------------------------


def tool(
    at: str | None = None, every: str | None = None, cron: str | None = None, tz: str = OSLO
) -> ParsedSchedule | ScheduleRefusal:
    return schedule_from_tool("remind me to stretch", at, every, cron, NOW, tz, MIN)


@pytest.mark.parametrize(
    "args",
    [{}, {"at": "2026-12-01T14:00:00Z", "every": "2h"}, {"every": "2h", "cron": "0 9 * * *"}, {"at": "  "}],
)
def test_the_tool_takes_exactly_one_of_at_every_cron(args: dict[str, str]) -> None:
    result = tool(**args)
    assert isinstance(result, ScheduleRefusal)
    assert result.code == "tool_arguments"
    assert result.message == "Give exactly one of at, every, cron."


@pytest.mark.parametrize(
    ("at", "first_local"),
    [
        ("2026-12-01T14:00:00Z", "2026-12-01 15:00 CET"),
        ("2026-12-01T14:00:00+01:00", "2026-12-01 14:00 CET"),
        ("2026-12-01T14:00:00-05:00", "2026-12-01 20:00 CET"),
        ("2026-12-01T14:00:00", "2026-12-01 14:00 CET"),  # naive: the user's zone
        ("2026-12-01 14:00", "2026-12-01 14:00 CET"),
    ],
)
def test_the_tools_at_is_iso_8601_with_z_offsets_or_naive_in_the_users_zone(
    at: str, first_local: str
) -> None:
    result = tool(at=at)
    assert isinstance(result, ParsedSchedule)
    assert result.schedule.kind == "at" and local(result.first_run) == first_local
    assert result.task == "remind me to stretch"


def test_the_tools_every_and_cron() -> None:
    every = tool(every="1h30m")
    assert isinstance(every, ParsedSchedule) and every.schedule.every_seconds == 5400
    assert every.first_run == NOW + timedelta(minutes=90)
    cron = tool(cron="0 8 * * 1-5")
    assert isinstance(cron, ParsedSchedule) and cron.schedule.cron == "0 8 * * 1-5"
    assert local(cron.first_run) == "2026-12-01 08:00 CET"
    assert describe(cron.schedule) == "every weekday at 08:00 (Europe/Oslo)"


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        ({"at": "next tuesday"}, "tool_arguments", "ISO 8601"),
        ({"at": "2020-01-01T00:00:00Z"}, "in_past", "passed"),
        ({"at": "2030-01-01T00:00:00Z"}, "too_far", "a year"),
        ({"every": "often"}, "tool_arguments", "30m, 2h or 1d"),
        ({"every": "30s"}, "too_often", "15 minutes"),
        ({"cron": "0 9 * *"}, "bad_cron", "5 fields"),
        ({"cron": "*/5 * * * *"}, "too_often", "15 minutes"),
    ],
)
def test_the_tool_refuses_with_the_same_limits(args: dict[str, str], code: str, words: str) -> None:
    result = tool(**args)
    assert isinstance(result, ScheduleRefusal)
    assert result.code == code and words in result.message


def test_the_tool_refuses_an_empty_task() -> None:
    result = schedule_from_tool("  ", None, "2h", None, NOW, OSLO, MIN)
    assert isinstance(result, ScheduleRefusal) and result.code == "no_task"


# ---- human text, zones ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (900, "15 minutes"),
        (7200, "2 hours"),
        (93600, "1 day 2 hours"),
        (90, "1 minute 30 seconds"),
        (1, "1 second"),
    ],
)
def test_human_interval(seconds: int, text: str) -> None:
    assert human_interval(seconds) == text


def test_when_text_is_short_and_names_the_zone() -> None:
    assert when_text(NOW, OSLO) == "Mon 30 Nov 2026 09:00 CET"
    assert when_text(datetime(2026, 7, 1, 7, tzinfo=UTC), OSLO) == "Wed 1 Jul 2026 09:00 CEST"
    assert when_text(NOW, "UTC") == "Mon 30 Nov 2026 08:00 UTC"
    # a zone whose abbreviation is only an offset also gets its name
    assert when_text(NOW, "America/Sao_Paulo") == "Mon 30 Nov 2026 05:00 -03 (America/Sao_Paulo)"


def test_describe_each_kind() -> None:
    assert describe(parse("every 2h: x").schedule) == "every 2 hours"
    assert describe(parse("at 2026-12-01 14:00: x").schedule) == "once, Tue 1 Dec 2026 14:00 CET"
    assert describe(parse("cron 0 9 1 * *: x").schedule) == "cron 0 9 1 * * (Europe/Oslo)"


@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        ("Europe/Oslo", "Europe/Oslo"),
        ("europe/oslo", "Europe/Oslo"),
        (" America/New_York ", "America/New_York"),
        ("utc", "UTC"),
        ("Mars/Olympus_Mons", None),
        ("../../etc/passwd", None),
        ("", None),
    ],
)
def test_valid_timezone(name: str, canonical: str | None) -> None:
    assert valid_timezone(name) == canonical


def test_parse_duration() -> None:
    assert parse_duration("1h30m") == 5400
    assert parse_duration("2 hours and 5 minutes") == 7500
    assert parse_duration("week") == 604800
    assert parse_duration("soon") is None
    assert parse_duration("1 hours30") is None


# ---- properties -----------------------------------------------------------------------------

ZONES = st.sampled_from(["Europe/Oslo", "America/New_York", "Australia/Lord_Howe", "UTC", "Asia/Kolkata"])
INSTANTS = st.datetimes(
    min_value=datetime(2026, 1, 1), max_value=datetime(2027, 12, 31), timezones=st.just(UTC)
)


@settings(max_examples=60, deadline=None)
@given(
    tz=ZONES,
    start=INSTANTS,
    minute=st.sampled_from(["0", "30", "15,45", "*/20"]),
    hour=st.sampled_from(["0", "1", "2", "3", "9", "1-3", "*"]),
    dow=st.sampled_from(["*", "1-5", "0,6"]),
)
def test_cron_runs_strictly_increase_and_each_wall_time_runs_once(
    tz: str, start: datetime, minute: str, hour: str, dow: str
) -> None:
    schedule = Schedule(kind="cron", cron=f"{minute} {hour} * * {dow}", tz=tz)
    got = runs(schedule, start, 30)
    assert got[0] > start
    assert all(a < b for a, b in itertools.pairwise(got))
    walls = [t.astimezone(ZoneInfo(tz)).replace(tzinfo=None, fold=0) for t in got]
    assert len(set(walls)) == len(walls)  # never the same wall time twice (fall back)
    for t in got:  # never a wall time that does not exist (spring forward)
        wall = t.astimezone(ZoneInfo(tz))
        assert wall.replace(fold=0).astimezone(UTC) == t or wall.replace(fold=1).astimezone(UTC) == t


@settings(max_examples=100, deadline=None)
@given(
    anchor=INSTANTS,
    seconds=st.integers(min_value=1, max_value=10 * 86400),
    offset=st.integers(min_value=-86400 * 30, max_value=86400 * 400),
)
def test_interval_next_due_is_the_first_occurrence_strictly_after(
    anchor: datetime, seconds: int, offset: int
) -> None:
    schedule = Schedule(kind="every", every_seconds=seconds, anchor=anchor)
    after = anchor + timedelta(seconds=offset)
    nxt = next_due(schedule, after)
    assert nxt is not None and nxt > after
    assert (nxt - anchor).total_seconds() % seconds == 0
    assert nxt == anchor or nxt - timedelta(seconds=seconds) <= after


@settings(max_examples=60, deadline=None)
@given(now=INSTANTS, count=st.integers(min_value=1, max_value=200), unit=st.sampled_from(["m", "h", "d"]))
def test_every_form_keeps_the_interval_written(now: datetime, count: int, unit: str) -> None:
    seconds = count * {"m": 60, "h": 3600, "d": 86400}[unit]
    result = parse_schedule_command(f"every {count}{unit}: x", now, OSLO, min_interval_seconds=MIN)
    if seconds < MIN:
        assert isinstance(result, ScheduleRefusal) and result.code == "too_often"
    else:
        assert isinstance(result, ParsedSchedule)
        assert result.schedule.every_seconds == seconds
        first = now + timedelta(seconds=seconds)
        assert timedelta(0) <= result.first_run - first < timedelta(seconds=1)  # whole seconds


def test_a_zone_in_any_letter_case_is_stored_by_its_canonical_name() -> None:
    parsed = parse("every day at 09:00: x", tz="europe/oslo")
    assert parsed.schedule.tz == "Europe/Oslo"
    assert local(parsed.first_run) == "2026-12-01 09:00 CET"


def test_relative_times_are_whole_seconds_never_early() -> None:
    now = NOW + timedelta(microseconds=250_000)
    once = parse("in 90s: x", now=now)
    assert once.first_run == NOW + timedelta(seconds=91) and once.first_run.microsecond == 0
    every = parse("every 2h: x", now=now)
    assert every.schedule.anchor == NOW + timedelta(hours=2, seconds=1)
