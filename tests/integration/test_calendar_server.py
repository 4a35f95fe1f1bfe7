"""The real `vagent-calendar` process over MCP streamable HTTP: each API key sees and creates
only its owner's events, a request with an unknown key never reaches MCP (without one: only
the tool list), the tools announce
their read-only / write hints, and the server neither logs nor keeps a raw key.

Why a subprocess and the SDK's client: the graph's MCP client talks to exactly this process
over exactly this transport.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent
from procutil import free_port

from tests.support.procs import BIN, ServiceProcess

ROOT = Path(__file__).resolve().parents[2]
DEV_SEED = ROOT / "deploy/dev/calendar.yaml"
ALICE, BOB = "@alice:localhost", "@bob:localhost"
EVENT_FIELDS = {"id", "title", "start", "end", "attendees"}


def keys() -> dict[str, str]:
    """owner -> API key, from the dev seed file."""
    return {owner: key for key, owner in yaml.safe_load(DEV_SEED.read_text())["keys"].items()}


def seed_titles(owner: str) -> list[str]:
    return [e["title"] for e in yaml.safe_load(DEV_SEED.read_text())["events"][owner]]


class CalendarProcess(ServiceProcess):
    """`vagent-calendar` on a free loopback port with its own seed file and database."""

    def __init__(self, directory: Path) -> None:
        self.seed, self.db = directory / "calendar.yaml", directory / "data" / "calendar.db"
        self.port = free_port()
        env = {
            "CALENDAR_HOST": "127.0.0.1",
            "CALENDAR_PORT": str(self.port),
            "CALENDAR_SEED_FILE": str(self.seed),
            "CALENDAR_DB_PATH": str(self.db),
            "LOG_LEVEL": "DEBUG",
        }
        super().__init__(
            "vagent-calendar", env, directory / f"calendar-{self.port}.log", f"{self.url}/health"
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def mcp_url(self) -> str:
        return f"{self.url}/mcp"

    @asynccontextmanager
    async def session(self, owner: str | None = None, key: str | None = None) -> AsyncIterator[ClientSession]:
        """An initialized MCP session with `owner`'s key (or `key`, or none)."""
        key = keys()[owner] if owner else key
        headers = {"X-API-Key": key} if key is not None else {}
        async with (
            httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(10, read=30)) as http,
            streamable_http_client(self.mcp_url, http_client=http) as (read, write, _),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session

    async def call(self, owner: str, tool: str, **arguments: Any) -> CallToolResult:
        async with self.session(owner) as session:
            return await session.call_tool(tool, arguments)

    async def events(self, owner: str, **arguments: Any) -> list[dict[str, Any]]:
        result = await self.call(owner, "list_events", **arguments)
        assert not result.isError and result.structuredContent is not None, result
        events: list[dict[str, Any]] = result.structuredContent["events"]
        return events

    async def requests(self) -> list[dict[str, Any]]:
        async with httpx.AsyncClient(timeout=10) as http:
            entries: list[dict[str, Any]] = (await http.get(self.url + "/debug/requests")).json()["requests"]
        return entries


def start_calendar(directory: Path) -> CalendarProcess:
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(DEV_SEED, directory / "calendar.yaml")
    return CalendarProcess(directory).start()


@pytest.fixture(scope="module")
def calendar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CalendarProcess]:
    server = start_calendar(tmp_path_factory.mktemp("calendar"))
    yield server
    server.stop()


async def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
    """One plain HTTP request, without blocking the event loop."""
    async with httpx.AsyncClient(timeout=10) as http:
        return await http.request(method, url, **kwargs)


def error_text(result: CallToolResult) -> str:
    assert result.isError, result
    return " ".join(c.text for c in result.content if isinstance(c, TextContent))


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


async def test_tools_and_their_annotations_arrive(calendar: CalendarProcess) -> None:
    async with calendar.session(ALICE) as session:
        tools = {t.name: t for t in (await session.list_tools()).tools}
    assert set(tools) == {"list_events", "find_free_slot", "create_event"}
    hints = {name: t.annotations.readOnlyHint if t.annotations else None for name, t in tools.items()}
    assert hints == {"list_events": True, "find_free_slot": True, "create_event": False}
    create = tools["create_event"]
    assert create.annotations is not None and create.annotations.destructiveHint is False
    assert create.inputSchema["required"] == ["title", "start", "end"]
    assert create.inputSchema["properties"]["attendees"] == {
        "default": [],
        "items": {"type": "string"},
        "title": "Attendees",
        "type": "array",
    }
    for t in tools.values():
        assert t.description and "\n" not in t.description and "caller" in t.description
        assert "ctx" not in t.inputSchema["properties"]


async def test_each_key_lists_only_its_owners_events(calendar: CalendarProcess) -> None:
    alice, bob = await calendar.events(ALICE), await calendar.events(BOB)
    for owner, events in ((ALICE, alice), (BOB, bob)):
        seeded = seed_titles(owner)
        assert [e["title"] for e in events if e["title"] in seeded] == seeded  # earliest first
    assert all(set(e) == EVENT_FIELDS for e in alice + bob)
    assert not {e["id"] for e in alice} & {e["id"] for e in bob}
    planning = alice[0]
    assert planning == {
        "id": "E-1001",
        "title": "Quarterly planning",
        "start": "2026-11-16T09:00:00+00:00",
        "end": "2026-11-16T10:30:00+00:00",
        "attendees": [BOB, "@carol:localhost"],
    }
    # Bob attends Alice's planning meeting, but it is not his event to list.
    assert "Quarterly planning" not in {e["title"] for e in bob}


async def test_list_events_in_a_range(calendar: CalendarProcess) -> None:
    november = await calendar.events(ALICE, start="2026-11-17", end="2026-11-21T00:00:00Z")
    assert [e["title"] for e in november] == ["1:1 with Carol", "Dentist"]
    # Overlap, half-open: an event ending exactly at `start` is not listed.
    assert await calendar.events(ALICE, start="2026-11-16T10:30:00+00:00", end="2026-11-16T23:00") == []
    december = await calendar.events(BOB, start="2026-12-01T00:00:00+01:00")
    assert "Holiday party" in [e["title"] for e in december]


async def test_a_created_event_is_visible_to_its_owner_only(calendar: CalendarProcess) -> None:
    result = await calendar.call(
        ALICE,
        "create_event",
        title="  Design   review ",
        start="2026-11-19T15:00:00+01:00",
        end="2026-11-19T15:45:00+01:00",
        attendees=[BOB, BOB, "@carol:localhost"],
    )
    assert not result.isError, result
    event = result.structuredContent
    assert event is not None and set(event) == EVENT_FIELDS
    assert event["title"] == "Design review"
    assert (event["start"], event["end"]) == ("2026-11-19T14:00:00+00:00", "2026-11-19T14:45:00+00:00")
    assert event["attendees"] == [BOB, "@carol:localhost"]
    assert event in await calendar.events(ALICE)
    assert event["id"] not in {e["id"] for e in await calendar.events(BOB)}
    # Bob attends, so Alice's new event makes him busy: his free slot skips it.
    slot = await calendar.call(BOB, "find_free_slot", date="2026-11-19", duration_minutes=480)
    assert slot.structuredContent is not None and slot.structuredContent["start"] is None


async def test_find_free_slot_checks_the_caller_and_the_attendees(calendar: CalendarProcess) -> None:
    # 16 Nov: Alice's planning 09:00-10:30 (Bob attends), Bob's review 11:00-12:00 (Alice attends).
    alone = await calendar.call(ALICE, "find_free_slot", date="2026-11-16")
    assert alone.structuredContent == {
        "date": "2026-11-16",
        "duration_minutes": 30,
        "people": [ALICE],
        "start": "2026-11-16T10:30:00+00:00",
        "end": "2026-11-16T11:00:00+00:00",
    }
    hour = await calendar.call(
        ALICE, "find_free_slot", date="2026-11-16", duration_minutes=60, attendees=[BOB]
    )
    assert hour.structuredContent is not None
    assert hour.structuredContent["people"] == [ALICE, BOB]
    assert hour.structuredContent["start"] == "2026-11-16T12:00:00+00:00"
    offsite = await calendar.call(BOB, "find_free_slot", date="2026-12-03", duration_minutes=15)
    assert offsite.structuredContent is not None and offsite.structuredContent["start"] is None


@pytest.mark.parametrize(
    ("tool", "arguments", "message"),
    [
        ("create_event", {"title": "x", "start": "tomorrow", "end": "2026-11-16T10:00"}, "start: 'tomorrow'"),
        ("create_event", {"title": "x", "start": "2026-11-16T10:00", "end": "2026-11-16T09:00"}, "end must"),
        ("create_event", {"title": "x" * 201, "start": "2026-11-16T10:00", "end": "2026-11-16T11:00"}, "200"),
        ("create_event", {"title": " ", "start": "2026-11-16T10:00", "end": "2026-11-16T11:00"}, "empty"),
        (
            "create_event",
            {"title": "x", "start": "2026-11-16T10:00", "end": "2026-11-16T11:00", "attendees": ["bob"]},
            "attendees[0]: not a Matrix user id",
        ),
        ("create_event", {"title": "x", "start": "2026-11-16T10:00"}, "end"),
        ("list_events", {"start": "2026-11-20", "end": "2026-11-10"}, "end must be after start"),
        ("find_free_slot", {"date": "16/11/2026"}, "not a date (YYYY-MM-DD)"),
        ("find_free_slot", {"date": "2026-11-16", "duration_minutes": 0}, "duration_minutes"),
        ("find_free_slot", {"date": "2026-11-16", "duration_minutes": 481}, "duration_minutes"),
    ],
)
async def test_bad_arguments_are_tool_errors(
    calendar: CalendarProcess, tool: str, arguments: dict[str, Any], message: str
) -> None:
    before = len(await calendar.events(ALICE))
    assert message in error_text(await calendar.call(ALICE, tool, **arguments))
    assert len(await calendar.events(ALICE)) == before
    assert (await request("GET", calendar.url + "/health")).status_code == 200


async def test_without_a_key_the_tools_can_be_listed_but_none_acts(calendar: CalendarProcess) -> None:
    """The graph reads a `credential: user` server's list with no user (none is asking)."""
    before = len(await calendar.events(ALICE))
    async with calendar.session(key=None) as session:
        listed = await session.list_tools()
        assert {t.name for t in listed.tools} == {"list_events", "find_free_slot", "create_event"}
        for tool, args in (
            ("list_events", {}),
            ("create_event", {"title": "x", "start": "2026-12-01T10:00", "end": "2026-12-01T11:00"}),
        ):
            result = await session.call_tool(tool, args)
            assert result.isError and "X-API-Key" in error_text(result)
    assert len(await calendar.events(ALICE)) == before


@pytest.mark.parametrize("key", ["", "cal-nobody-dev-key-not-a-secret-9999"])
async def test_an_unknown_key_is_401_before_mcp(calendar: CalendarProcess, key: str) -> None:
    headers = {"X-API-Key": key}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    r = await request("POST", calendar.mcp_url, json=body, headers=headers)
    assert r.status_code == 401 and r.json()["error_code"] == "unauthorized"
    with pytest.raises(BaseExceptionGroup) as failed:
        async with calendar.session(key=key):
            pytest.fail("the session must not start")
    statuses = [e.response.status_code for e in leaves(failed.value) if isinstance(e, httpx.HTTPStatusError)]
    assert statuses == [401]


async def test_requests_record_owner_and_tool_never_the_key(calendar: CalendarProcess) -> None:
    assert (await request("DELETE", calendar.url + "/debug/requests")).status_code == 204
    await calendar.events(ALICE)
    await calendar.call(BOB, "find_free_slot", date="2026-11-18")
    await calendar.call(BOB, "create_event", title="x", start="nope", end="nope")
    await request(
        "POST", calendar.mcp_url, json={}, headers={"X-API-Key": "cal-nobody-dev-key-not-a-secret-9999"}
    )
    sha = {owner: hashlib.sha256(key.encode()).hexdigest() for owner, key in keys().items()}
    assert await calendar.requests() == [
        {"tool": "list_events", "owner": ALICE, "key_sha256": sha[ALICE], "outcome": "ok"},
        {"tool": "find_free_slot", "owner": BOB, "key_sha256": sha[BOB], "outcome": "ok"},
        {"tool": "create_event", "owner": BOB, "key_sha256": sha[BOB], "outcome": "error"},
        {
            "tool": None,
            "owner": None,
            "key_sha256": hashlib.sha256(b"cal-nobody-dev-key-not-a-secret-9999").hexdigest(),
            "outcome": "unauthorized",
        },
    ]


async def test_no_raw_key_in_the_log_or_the_database(calendar: CalendarProcess) -> None:
    for owner in (ALICE, BOB):
        await calendar.events(owner)
    logs = calendar.logs()
    for owner, key in keys().items():
        assert key not in logs, f"{owner}'s key is in the calendar's log"
        assert key.encode() not in calendar.db.read_bytes()
    lines = [r for r in calendar.log_records() if r.get("event") == "calendar_request"]
    assert {r["owner"] for r in lines} >= {ALICE, BOB}
    assert all(r["key_id"] is None or len(r["key_id"]) == 12 for r in lines)


async def test_events_survive_a_restart_and_are_seeded_once(tmp_path: Path) -> None:
    calendar = start_calendar(tmp_path)
    try:
        created = await calendar.call(
            BOB, "create_event", title="Survives restarts", start="2026-12-01T10:00", end="2026-12-01T11:00"
        )
        assert created.structuredContent is not None
        calendar.restart()
        after = await calendar.events(BOB)
        assert [e["title"] for e in after].count("Grafana migration") == 1  # not seeded again
        assert created.structuredContent in after
        nxt = await calendar.call(
            ALICE, "create_event", title="Next", start="2026-12-02T10:00", end="2026-12-02T11:00"
        )
        assert nxt.structuredContent is not None
        assert int(nxt.structuredContent["id"][2:]) == int(created.structuredContent["id"][2:]) + 1
    finally:
        calendar.stop()


def test_refuses_to_start_with_an_invalid_seed(tmp_path: Path) -> None:
    key = "cal-key-that-is-never-quoted-0000"
    seed = tmp_path / "calendar.yaml"
    events = {"@b:x": [{"title": "t", "start": "2026-11-16T10:00", "end": "2026-11-16T11:00"}]}
    seed.write_text(yaml.safe_dump({"keys": {key: "@a:x"}, "events": events}))
    env = {**os.environ, **CalendarProcess(tmp_path).env}
    done = subprocess.run([str(BIN / "vagent-calendar")], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert str(seed) in done.stderr and "who hold no key" in done.stderr and key not in done.stderr
