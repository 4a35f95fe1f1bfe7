"""The demo calendar as `make run` starts it (LOG_LEVEL=INFO) keeps the MCP SDK's chatter
("Terminating session: None" after every request, "Processing request of type ...") off the
console, and still prints its own INFO lines; at LOG_LEVEL=DEBUG the chatter is there. Its
tools carry titles a person reads in a confirmation question.

The real `vagent-calendar` process (test_calendar_server.py's CalendarProcess), called with
the SDK's client.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.integration.test_calendar_server import ALICE, DEV_SEED, CalendarProcess

CHATTER = ("Terminating session", "Processing request of type", "StreamableHTTP session manager")


def start_at(directory: Path, level: str) -> CalendarProcess:
    """The calendar with the dev seed, at LOG_LEVEL `level`."""
    shutil.copy(DEV_SEED, directory / "calendar.yaml")
    calendar = CalendarProcess(directory)
    calendar.env["LOG_LEVEL"] = level
    return calendar.start()


@pytest.mark.parametrize("level", ["INFO", "DEBUG"])
async def test_the_sdk_chatter_shows_at_debug_only(tmp_path: Path, level: str) -> None:
    calendar = start_at(tmp_path, level)
    try:
        async with calendar.session(ALICE) as session:
            titles = {t.name: t.title for t in (await session.list_tools()).tools}
            await session.call_tool("list_events", {})
            created = await session.call_tool(
                "create_event",
                {"title": "Console check", "start": "2026-12-03T10:00", "end": "2026-12-03T10:30"},
            )
            assert not created.isError
    finally:
        calendar.stop()
    logs = calendar.logs()
    assert "calendar_event_created" in logs  # its own INFO lines stay
    if level == "INFO":
        assert not [c for c in CHATTER if c in logs], logs[-3000:]
    else:
        assert all(c in logs for c in CHATTER[:2]), logs[-3000:]
    assert titles == {
        "list_events": "List your calendar events",
        "find_free_slot": "Find a free slot in your calendar",
        "create_event": "Book a calendar event",
    }
