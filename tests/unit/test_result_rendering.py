"""Structured tool results read as short Markdown, filtered by the dates the question names."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from vagent_graph.models.result_rendering import (
    Period,
    created_event,
    period_in,
    render_data,
    render_events,
    render_result,
)

ROOT = Path(__file__).resolve().parents[2]
#: Wednesday 18 Nov 2026, noon UTC: inside the demo calendar's busy week.
NOW = datetime(2026, 11, 18, 12, 0, tzinfo=UTC)


def demo_events(owner: str = "@alice:localhost") -> list[dict[str, object]]:
    """The demo calendar's events of `owner` (deploy/dev/calendar.yaml) as list_events returns them."""
    seed = yaml.safe_load((ROOT / "deploy/dev/calendar.yaml").read_text())["events"][owner]
    return [
        {
            "id": f"E-{1001 + i}",
            "title": e["title"],
            "start": e["start"],
            "end": e["end"],
            "attendees": e.get("attendees", []),
        }
        for i, e in enumerate(seed)
    ]


@pytest.mark.parametrize(
    ("text", "start", "end", "label"),
    [
        ("What is on my calendar today?", "2026-11-18", "2026-11-19", "today"),
        ("anything tomorrow?", "2026-11-19", "2026-11-20", "tomorrow"),
        ("what is on my calendar this week?", "2026-11-16", "2026-11-23", "this week"),
        ("and next week?", "2026-11-23", "2026-11-30", "next week"),
        ("what is on my calendar on 2026-12-01?", "2026-12-01", "2026-12-02", "on Tue 1 Dec"),
        ("what about 3 Dec?", "2026-12-03", "2026-12-04", "on Thu 3 Dec"),
        ("December 1st, 2027 please", "2027-12-01", "2027-12-02", "on Wed 1 Dec 2027"),
    ],
)
def test_the_dates_a_question_names(text: str, start: str, end: str, label: str) -> None:
    period = period_in(text, NOW)
    assert period is not None
    assert (period.start.date().isoformat(), period.end.date().isoformat(), period.label) == (
        start,
        end,
        label,
    )
    assert period.args()["start"] == f"{start}T00:00:00+00:00"


def test_a_question_without_a_date_names_no_period() -> None:
    assert period_in("what is on my calendar?", NOW) is None
    assert period_in("what is on my calendar on 2026-13-45?", NOW) is None  # no such day


def test_this_weeks_events_only_readably() -> None:
    this_week = period_in("this week", NOW)
    text = render_events(demo_events(), this_week, NOW)
    assert text == (
        "Your calendar this week (3 events):\n"
        "- Mon 16 Nov 09:00–10:30 Quarterly planning (with @bob:localhost, @carol:localhost)\n"
        "- Tue 17 Nov 14:00–14:30 1:1 with Carol (with @carol:localhost)\n"
        "- Fri 20 Nov 08:00–09:00 Dentist"
    )
    assert "Team offsite" not in text and "{" not in text


def test_today_and_an_empty_day() -> None:
    today = render_events(demo_events(), period_in("today", datetime(2026, 11, 16, 7, tzinfo=UTC)), NOW)
    assert today == (
        "Your calendar today (1 event):\n"
        "- Mon 16 Nov 09:00–10:30 Quarterly planning (with @bob:localhost, @carol:localhost)"
    )
    assert (
        render_events(demo_events(), period_in("tomorrow", NOW), NOW) == "Nothing on your calendar tomorrow."
    )
    assert render_events([], None, NOW) == "Nothing on your calendar."


def test_events_spanning_the_boundaries_are_listed() -> None:
    """Overlap, half-open like the calendar's own query: an event that starts before the day
    and ends in it counts; one ending exactly at midnight does not count for the next day."""
    events = [
        {
            "id": "E-1",
            "title": "Night shift",
            "start": "2026-11-17T22:00:00+00:00",
            "end": "2026-11-18T02:00:00+00:00",
        },
        {
            "id": "E-2",
            "title": "Late call",
            "start": "2026-11-17T23:00:00+00:00",
            "end": "2026-11-18T00:00:00+00:00",
        },
        {
            "id": "E-3",
            "title": "Conference",
            "start": "2026-11-15T09:00:00+00:00",
            "end": "2026-11-20T17:00:00+00:00",
        },
    ]
    text = render_events(events, period_in("today", NOW), NOW)
    assert "Night shift" in text and "Conference" in text and "Late call" not in text
    assert "- Tue 17 Nov 22:00 – Wed 18 Nov 02:00 Night shift" in text
    assert "- Sun 15 Nov 09:00 – Fri 20 Nov 17:00 Conference" in text


def test_created_things_in_one_sentence() -> None:
    event = {
        "id": "E-1008",
        "title": "design review",
        "start": "2026-12-01T10:00:00+00:00",
        "end": "2026-12-01T10:30:00+00:00",
        "attendees": ["@bob:localhost"],
    }
    assert (
        created_event(event, NOW)
        == "Booked 'design review' on Tue 1 Dec 10:00–10:30 with @bob:localhost (E-1008)."
    )
    as_read = json.dumps(event)
    assert render_result("calendar__create_event", as_read, "book it", NOW) == created_event(event, NOW)
    ticket = "Created ticket T-1042: printer (normal priority)."
    assert (
        render_result("create_ticket", ticket, "", NOW) == "Opened ticket T-1042 'printer' (normal priority)."
    )


def test_results_as_the_model_reads_them_are_rendered() -> None:
    listing = json.dumps({"events": demo_events("@bob:localhost")})
    text = render_result("calendar__list_events", listing, "what is on my calendar this week?", NOW)
    assert text.startswith("Your calendar this week (2 events):")
    assert "Holiday party" not in text and '"events"' not in text
    indented = json.dumps({"events": demo_events("@bob:localhost")}, indent=2)  # FastMCP's text
    assert render_result("calendar__list_events", indented, "", NOW).startswith("Your calendar (3 events):")
    assert render_result("database_query", "records: 0", "", NOW) == "There are 0 matching records."
    assert render_result("database_query", "records: 1", "", NOW) == "There is 1 matching record."
    slot = {
        "date": "2026-12-01",
        "duration_minutes": 30,
        "people": [],
        "start": "2026-12-01T09:00:00+00:00",
        "end": "2026-12-01T09:30:00+00:00",
    }
    assert render_result("calendar__find_free_slot", json.dumps(slot), "", NOW) == (
        "The first free 30-minute slot on Tue 1 Dec is 09:00–09:30."
    )
    plain = "Your open tickets (1):\n- T-1: x (open, normal priority, opened 2026-11-01)"
    assert render_result("list_my_tickets", plain, "", NOW) == plain  # already readable


def test_any_other_data_is_a_short_table_or_list() -> None:
    rows = [{"name": "a", "n": 1}, {"name": "b|c", "n": 2}]
    assert render_data({"items": rows}) == "| name | n |\n|---|---|\n| a | 1 |\n| b/c | 2 |"
    assert render_data({"status": "ok", "count": 3}) == "- status: ok\n- count: 3"
    assert render_data(list(range(25))).endswith("- 19\n(… and 5 more)")
    assert render_data([]) == "Nothing was found."


def test_period_args_are_what_the_calendar_accepts() -> None:
    from vagent_dev.calendar import parse_when

    period = Period(datetime(2026, 12, 1, tzinfo=UTC), datetime(2026, 12, 2, tzinfo=UTC), "on Tue 1 Dec")
    assert parse_when("start", period.args()["start"]) == period.start


def test_structured_results_reach_the_model_as_one_line_of_json() -> None:
    """FastMCP sends a structured result twice: indented JSON text and structuredContent. The
    model reads it once, on one line (the same data in fewer tokens)."""
    from mcp.types import CallToolResult, TextContent

    from vagent_graph.mcp.results import result_text

    value = {"events": demo_events()}
    indented = TextContent(type="text", text=json.dumps(value, indent=2))
    text, failed = result_text(
        "calendar__list_events", CallToolResult(content=[indented], structuredContent=value), 10_000
    )
    assert not failed and "\n" not in text and json.loads(text) == value
    prose = TextContent(type="text", text="Two events:\n  - a\n  - b")
    assert result_text("x__y", CallToolResult(content=[prose]), 1000) == ("Two events:\n  - a\n  - b", False)


def test_a_count_reaches_the_model_as_name_and_value() -> None:
    """A single value (the offline model's count) is `records: N`, not a one-cell table."""
    from vagent_graph.tools.records import format_table

    assert format_table(["records"], [(0,)], False) == "records: 0"
    assert format_table(["a", "b"], [(1, None)], False) == "a | b\n--- | ---\n1 | "
