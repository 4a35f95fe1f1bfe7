"""The demo calendar's pure parts, without HTTP: the seed file, the free-slot search and the
tools' argument checks.

Why: a typo in the seed must fail loudly at start (never quoting a key), the keys must be the
ones the development Credential Registry hands out for `mcp:calendar`, and a bad argument must
be a clear tool error, never a crash or a wrong event.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from vagent_dev.calendar import (
    MAX_ATTENDEES,
    CalendarDB,
    NewEvent,
    SeedError,
    check_attendees,
    check_duration,
    first_free_slot,
    iso,
    load_seed,
    new_event,
    parse_day,
    parse_when,
)
from vagent_dev.credential_registry import load_policy

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "deploy/dev/calendar.yaml"
CREDENTIALS = ROOT / "deploy/dev/credentials.yaml"
KEY = "cal-key-that-must-not-leak-1234"
DAY = date(2026, 11, 16)


def at(hour: int, minute: int = 0, day: date = DAY) -> datetime:
    return datetime(day.year, day.month, day.day, hour, minute, tzinfo=UTC)


# --------------------------------------------------------------------------- the dev seed


def test_dev_seed_keys_are_the_registrys_mcp_calendar_keys() -> None:
    """Every key the registry hands out for mcp:calendar opens that same person's calendar."""
    resource = load_policy(CREDENTIALS).domains["localhost"].resources["mcp:calendar"]
    assert resource.type == "api_key"
    assert set(resource.users) == {"@alice:localhost", "@bob:localhost"}  # carol has none
    known = load_seed(SEED).keys
    assert {owner: key for key, owner in known.items()} == resource.users
    assert len(set(resource.users.values())) == 2


def test_dev_seed_gives_alice_and_bob_their_own_events() -> None:
    seed = load_seed(SEED)
    alice, bob = seed.events["@alice:localhost"], seed.events["@bob:localhost"]
    assert len(alice) >= 3 and len(bob) >= 3
    for e in [*alice, *bob]:
        assert (e.start.year, e.start.month) in {(2026, 11), (2026, 12)}
        assert e.start.tzinfo is not None and e.end > e.start
    assert not {e.title for e in alice} & {e.title for e in bob}


@pytest.mark.parametrize(
    ("seed", "expected"),
    [
        ({"keys": {KEY: "@a:x"}, "events": {"@b:x": []}}, "'@b:x'], who hold no key"),
        ({"keys": {"short": "@a:x"}}, "keys: String should have at least 16 characters"),
        ({"keys": {KEY: "alice"}}, "keys: Value error, 'alice' is not a Matrix user id"),
        ({"events": {}}, "keys: Field required"),
        ({"keys": {KEY: "@a:x"}, "extra": 1}, "extra: Extra inputs are not permitted"),
        (
            {"keys": {KEY: "@a:x"}, "events": {"@a:x": [{"title": "t", "start": "x", "end": "y"}]}},
            "events.@a:x.0.start: Input should be a valid datetime",
        ),
        (
            {"keys": {KEY: "@a:x"}, "events": {"@a:x": [{"title": "t", "start": "2026-11-16T10:00"}]}},
            "events.@a:x.0.end: Field required",
        ),
        (
            {
                "keys": {KEY: "@a:x"},
                "events": {"@a:x": [{"title": "t", "start": "2026-11-16T10:00", "end": "2026-11-16T09:00"}]},
            },
            "end must be after start",
        ),
        (
            {
                "keys": {KEY: "@a:x"},
                "events": {
                    "@a:x": [
                        {
                            "title": "t",
                            "start": "2026-11-16T10:00",
                            "end": "2026-11-16T11:00",
                            "attendees": ["b"],
                        }
                    ]
                },
            },
            "events.@a:x.0.attendees.0",
        ),
        (
            {
                "keys": {KEY: "@a:x"},
                "events": {"@a:x": [{"title": "", "start": "2026-11-16", "end": "2026-11-17"}]},
            },
            "events.@a:x.0.title",
        ),
    ],
)
def test_invalid_seed_files_fail_without_quoting_keys(
    tmp_path: Path, seed: dict[str, Any], expected: str
) -> None:
    path = tmp_path / "calendar.yaml"
    path.write_text(yaml.safe_dump(seed))
    with pytest.raises(SeedError) as err:
        load_seed(path)
    assert expected in str(err.value)
    assert str(path) in str(err.value)
    assert KEY not in str(err.value)


def test_unquoted_yaml_timestamps_and_empty_sections_are_fine(tmp_path: Path) -> None:
    path = tmp_path / "calendar.yaml"
    path.write_text(
        f"keys:\n  {KEY}: '@a:x'\nevents:\n  '@a:x':\n"
        "    - {title: t, start: 2026-11-16 10:00:00, end: 2026-11-16T12:00:00+01:00, attendees:}\n"
    )
    (event,) = load_seed(path).events["@a:x"]
    assert event.attendees == []
    db = CalendarDB(tmp_path / "db" / "calendar.db")
    assert db.init(load_seed(path)) and not db.init(load_seed(path))  # seeded once
    (stored,) = db.events_of("@a:x", None, None)
    assert (stored.start, stored.end) == ("2026-11-16T10:00:00+00:00", "2026-11-16T11:00:00+00:00")


def test_a_missing_seed_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(SeedError, match="cannot read seed file"):
        load_seed(tmp_path / "absent.yaml")


# --------------------------------------------------------------------------- free slots


def test_a_free_day_starts_at_nine() -> None:
    assert first_free_slot(DAY, timedelta(minutes=30), []) == (at(9), at(9, 30))


def test_busy_intervals_push_the_slot_later() -> None:
    busy = [(at(11), at(12)), (at(9), at(10, 30)), (at(10, 45), at(11, 15))]
    assert first_free_slot(DAY, timedelta(minutes=15), busy) == (at(10, 30), at(10, 45))
    assert first_free_slot(DAY, timedelta(minutes=30), busy) == (at(12), at(12, 30))


def test_half_open_intervals_touching_is_free() -> None:
    busy = [(at(9), at(10)), (at(10, 30), at(11))]
    assert first_free_slot(DAY, timedelta(minutes=30), busy) == (at(10), at(10, 30))


def test_overlapping_and_nested_busy_intervals() -> None:
    busy = [(at(9), at(13)), (at(10), at(11)), (at(12), at(14))]
    assert first_free_slot(DAY, timedelta(hours=1), busy) == (at(14), at(15))


def test_events_outside_the_working_day_do_not_matter() -> None:
    busy = [(at(7), at(9)), (at(17), at(19)), (at(22, day=date(2026, 11, 15)), at(9))]
    assert first_free_slot(DAY, timedelta(hours=8), busy) == (at(9), at(17))


def test_no_slot_when_the_day_is_full_or_too_short() -> None:
    assert first_free_slot(DAY, timedelta(hours=8), [(at(16, 59), at(17, 30))]) is None
    assert first_free_slot(DAY, timedelta(minutes=30), [(at(8), at(16, 45))]) is None
    assert first_free_slot(DAY, timedelta(minutes=15), [(at(8), at(16, 45))]) == (at(16, 45), at(17))


# --------------------------------------------------------------------------- arguments


def test_datetimes_are_utc_to_the_second() -> None:
    assert parse_when("start", "2026-11-16T10:00:00+01:00") == at(9)
    assert parse_when("start", "2026-11-16T10:00") == at(10)  # no offset: UTC
    assert parse_when("start", "2026-11-16T10:00:00Z") == at(10)
    assert parse_when("start", " 2026-11-16 ") == at(0)
    assert parse_when("start", "2026-11-16T10:00:00.999") == at(10)
    assert iso(datetime(2026, 11, 16, 10, 0, 0, 500)) == "2026-11-16T10:00:00+00:00"


@pytest.mark.parametrize("value", ["tomorrow", "", "2026-13-01T10:00", "16/11/2026 10:00", "x" * 500])
def test_bad_datetimes_name_the_argument(value: str) -> None:
    with pytest.raises(ValueError, match=r"^end: .* is not an ISO-8601 date-time") as err:
        parse_when("end", value)
    assert len(str(err.value)) < 150


def test_days() -> None:
    assert parse_day("2026-11-16") == DAY
    for bad in ("2026-11-16T10:00", "16.11.2026", "", "2026-02-30"):
        with pytest.raises(ValueError, match="not a date"):
            parse_day(bad)


def test_durations() -> None:
    assert check_duration(30) == timedelta(minutes=30)
    assert check_duration(480) == timedelta(hours=8)
    for bad in (0, -5, 481, True):
        with pytest.raises(ValueError, match="duration_minutes: a whole number from 1 to 480"):
            check_duration(bad)


def test_attendees() -> None:
    assert check_attendees(["@b:x", "@a:x", "@b:x"]) == ["@b:x", "@a:x"]
    assert check_attendees([]) == []
    with pytest.raises(ValueError, match=r"attendees\[1\]: not a Matrix user id"):
        check_attendees(["@a:x", "bob"])
    with pytest.raises(ValueError, match="not one string"):
        check_attendees("@a:x")
    with pytest.raises(ValueError, match=f"at most {MAX_ATTENDEES}"):
        check_attendees([f"@u{i}:x" for i in range(MAX_ATTENDEES + 1)])


def test_a_valid_new_event() -> None:
    assert new_event("  Sprint \n planning ", "2026-11-16T10:00", "2026-11-16T11:00+00:00", ["@b:x"]) == (
        NewEvent("Sprint planning", at(10), at(11), ["@b:x"])
    )


@pytest.mark.parametrize(
    ("title", "start", "end", "attendees", "message"),
    [
        ("", "2026-11-16T10:00", "2026-11-16T11:00", [], "title: must not be empty"),
        ("  ", "2026-11-16T10:00", "2026-11-16T11:00", [], "title: must not be empty"),
        ("x" * 201, "2026-11-16T10:00", "2026-11-16T11:00", [], "title: at most 200 characters"),
        ("t", "noon", "2026-11-16T11:00", [], "start: 'noon' is not an ISO-8601 date-time"),
        ("t", "2026-11-16T10:00", "2026-11-16T10:00", [], "end must be after start"),
        ("t", "2026-11-16T10:00+00:00", "2026-11-16T10:30+01:00", [], "end must be after start"),
        ("t", "2026-11-16T10:00", "2026-11-16T11:00", ["@b:x", "@c"], "attendees[1]: not a Matrix user id"),
    ],
)
def test_invalid_new_events(title: str, start: str, end: str, attendees: list[str], message: str) -> None:
    with pytest.raises(ValueError) as err:
        new_event(title, start, end, attendees)
    assert str(err.value) == message or str(err.value).startswith(message)


def test_the_title_may_be_exactly_200_characters() -> None:
    assert len(new_event("x" * 200, "2026-11-16T10:00", "2026-11-16T11:00").title) == 200


def test_busy_covers_owned_and_attended_events(tmp_path: Path) -> None:
    path = tmp_path / "calendar.yaml"
    events = {
        "@a:x": [
            {"title": "mine", "start": "2026-11-16T09:00", "end": "2026-11-16T10:00", "attendees": ["@c:x"]}
        ],
        "@b:x": [{"title": "bobs", "start": "2026-11-16T11:00", "end": "2026-11-16T12:00"}],
    }
    path.write_text(yaml.safe_dump({"keys": {KEY: "@a:x", KEY + "b": "@b:x"}, "events": events}))
    db = CalendarDB(tmp_path / "calendar.db")
    db.init(load_seed(path))
    assert db.busy(["@c:x"], at(0), at(23)) == [(at(9), at(10))]  # attends only
    assert sorted(db.busy(["@a:x", "@b:x"], at(0), at(23))) == [(at(9), at(10)), (at(11), at(12))]
    assert db.busy(["@d:x"], at(0), at(23)) == []
    assert db.busy(["@a:x"], at(10), at(11)) == []  # half-open on both sides
