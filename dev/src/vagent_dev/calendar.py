"""`vagent-calendar`: a DEMO team calendar served over MCP, which knows people only by their API key.

Why: the graph calls an organisation's MCP servers with the asker's OWN key, which the
Credential Registry issues (resource `mcp:calendar`). Local runs, the demo and the tests need
such a server that answers differently per key; this is a development stand-in for one, never
production. Each key belongs to one person, and every tool acts on that person's events only:

    MCP streamable HTTP at /mcp (stateless, JSON responses)
    X-API-Key: <key>     unknown -> 401 {"error_code": "unauthorized"}, before MCP;
                         missing -> anonymous: the tool list only (every tool refuses)
    list_events(start?, end?)                       read-only -> {"events": [event, ...]}
    find_free_slot(date, duration_minutes=30, attendees=[])
                                                    read-only -> {"start", "end", ...} (null: none)
    create_event(title, start, end, attendees=[])  -> event (owned by the caller)
    event = {"id": "E-1001", "title", "start", "end": ISO-8601 UTC, "attendees": [user id, ...]}

Times are ISO-8601; one without an offset is UTC, the calendar's only time zone (also that of
the 09:00-17:00 working day in which find_free_slot looks). A bad argument is a tool error
(isError) that says which one, never a crash.

Anonymous requests may list the tools: the graph reads a `credential: user` server's list
without a user (no user is asking then); calls need the caller's own key.

Every tool call and every refused request is recorded in memory (`GET`/`DELETE
/debug/requests`) with the owner, the tool and the SHA-256 of the key, never the key itself
(the server keeps only the keys' hashes and never logs a key). Events live in SQLite
(CALENDAR_DB_PATH); a new database is seeded once from CALENDAR_SEED_FILE, which also maps the
keys to their owners (re-read at every start).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Annotated, Any, NamedTuple

import structlog
from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse
from mcp.server.fastmcp import Context, FastMCP
from mcp.server.session import ServerSession
from mcp.types import ToolAnnotations
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictStr, model_validator
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from vagent_dev.api_keys import add_request_log_routes, key_sha256, request_log, seed_place
from vagent_dev.serving import install_json_error_handlers, serve
from vagent_dev.settings import CalendarSettings
from vagent_dev.sqlite_files import transaction
from vagent_dev.yaml_files import MATRIX_USER_ID, FileError, YamlList, YamlMap, load_yaml_model
from vagent_shared.wire import ErrorResponse

log = structlog.get_logger(__name__)

#: At most this many events per listing.
MAX_LIST = 200
#: At most this many attendees per event or free-slot search.
MAX_ATTENDEES = 50
MAX_TITLE = 200
#: The working day in which find_free_slot looks (UTC).
DAY_START, DAY_END = time(9), time(17)
MAX_DURATION_MINUTES = 8 * 60
#: The request record keeps the last this many calls.
#: PRAGMA user_version of a created and seeded database.
SCHEMA_VERSION = 1
FIRST_EVENT_NUMBER = 1001
#: Paths anyone may call without a key (a development stand-in's probes).
PUBLIC_PATHS = ("/health", "/debug/")


class SeedError(FileError):
    """The seed file is missing, not YAML, or does not validate."""


# --------------------------------------------------------------------------- pure parts


def as_utc(value: datetime) -> datetime:
    """`value` in UTC to the second; one without an offset is taken as UTC already."""
    value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return value.replace(microsecond=0)


def iso(value: datetime) -> str:
    """The stored and returned form: fixed width, so it sorts as text."""
    return as_utc(value).isoformat(timespec="seconds")


def parse_when(name: str, value: str) -> datetime:
    """An ISO-8601 date-time argument, in UTC; ValueError naming `name` otherwise."""
    try:
        return as_utc(datetime.fromisoformat(value.strip()))
    except (ValueError, TypeError, AttributeError):
        shown = value[:40] if isinstance(value, str) else type(value).__name__
        raise ValueError(
            f"{name}: {shown!r} is not an ISO-8601 date-time (e.g. 2026-11-16T10:00:00+00:00)"
        ) from None


def parse_day(value: str) -> date:
    """A YYYY-MM-DD argument; ValueError otherwise."""
    try:
        return date.fromisoformat(value.strip())
    except (ValueError, TypeError, AttributeError):
        shown = value[:40] if isinstance(value, str) else type(value).__name__
        raise ValueError(f"date: {shown!r} is not a date (YYYY-MM-DD)") from None


def check_user_id(value: str) -> str:
    if not MATRIX_USER_ID.match(value):
        raise ValueError(f"{value[:80]!r} is not a Matrix user id (@name:server)")
    return value


def check_attendees(attendees: Sequence[str]) -> list[str]:
    """Matrix user ids, each once, in the given order; ValueError otherwise."""
    if isinstance(attendees, str):
        raise ValueError("attendees: a list of Matrix user ids, not one string")
    if len(attendees) > MAX_ATTENDEES:
        raise ValueError(f"attendees: at most {MAX_ATTENDEES}")
    seen: list[str] = []
    for i, who in enumerate(attendees):
        if not isinstance(who, str) or not MATRIX_USER_ID.match(who):
            raise ValueError(f"attendees[{i}]: not a Matrix user id (@name:server)")
        if who not in seen:
            seen.append(who)
    return seen


def check_range(start: datetime, end: datetime, what: str = "end") -> None:
    if end <= start:
        raise ValueError(f"{what} must be after start")


class NewEvent(NamedTuple):
    """A create_event request that passed validation."""

    title: str
    start: datetime
    end: datetime
    attendees: list[str]


def new_event(title: str, start: str, end: str, attendees: Sequence[str] = ()) -> NewEvent:
    """Validate create_event's arguments; ValueError says which one is wrong and why."""
    if not isinstance(title, str) or not title.strip():
        raise ValueError("title: must not be empty")
    title = " ".join(title.split())
    if len(title) > MAX_TITLE:
        raise ValueError(f"title: at most {MAX_TITLE} characters")
    begin, finish = parse_when("start", start), parse_when("end", end)
    check_range(begin, finish)
    return NewEvent(title, begin, finish, check_attendees(attendees))


def check_duration(minutes: int) -> timedelta:
    if isinstance(minutes, bool) or not isinstance(minutes, int) or not 1 <= minutes <= MAX_DURATION_MINUTES:
        raise ValueError(f"duration_minutes: a whole number from 1 to {MAX_DURATION_MINUTES}")
    return timedelta(minutes=minutes)


def working_day(day: date) -> tuple[datetime, datetime]:
    return datetime.combine(day, DAY_START, UTC), datetime.combine(day, DAY_END, UTC)


def first_free_slot(
    day: date, duration: timedelta, busy: Iterable[tuple[datetime, datetime]]
) -> tuple[datetime, datetime] | None:
    """The earliest `duration` on `day` between 09:00 and 17:00 UTC that overlaps no busy
    interval (half-open: a meeting ending at 10:00 leaves 10:00 free), or None."""
    candidate, close = working_day(day)
    for b_start, b_end in sorted(busy):
        if b_end <= candidate:
            continue
        if b_start >= candidate + duration:
            break
        candidate = b_end
    return (candidate, candidate + duration) if candidate + duration <= close else None


# --------------------------------------------------------------------------- seed


MatrixId = Annotated[StrictStr, AfterValidator(check_user_id)]


class SeedEvent(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    title: StrictStr = Field(min_length=1, max_length=MAX_TITLE)
    start: datetime
    end: datetime
    attendees: YamlList[MatrixId] = Field(default_factory=list, max_length=MAX_ATTENDEES)

    @model_validator(mode="after")
    def _order(self) -> SeedEvent:
        check_range(as_utc(self.start), as_utc(self.end))
        return self


class Seed(BaseModel):
    """`keys` (API key -> owner) and each owner's demo events."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    keys: dict[Annotated[StrictStr, Field(min_length=16)], MatrixId]
    events: YamlMap[YamlList[SeedEvent]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _owners(self) -> Seed:
        """An event nobody can see is a typo in its owner."""
        orphans = sorted(set(self.events) - set(self.keys.values()))
        if orphans:
            raise ValueError(f"events owned by {orphans}, who hold no key")
        return self


def load_seed(path: Path | str) -> Seed:
    """Read and validate the seed file; SeedError names the problem, never a key."""
    return load_yaml_model(path, Seed, "seed file", SeedError, seed_place)


# --------------------------------------------------------------------------- results


class Event(BaseModel):
    id: str
    title: str
    start: str
    end: str
    attendees: list[str]


class EventList(BaseModel):
    events: list[Event]


class FreeSlot(BaseModel):
    """The first free slot, or start = end = None when the day has none."""

    date: str
    duration_minutes: int
    #: Whose calendars were checked: the caller first, then the attendees.
    people: list[str]
    start: str | None
    end: str | None


# --------------------------------------------------------------------------- database


_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    num INTEGER PRIMARY KEY,
    owner TEXT NOT NULL,
    title TEXT NOT NULL,
    start TEXT NOT NULL,      -- ISO-8601 UTC to the second, so it sorts as text
    "end" TEXT NOT NULL,
    attendees TEXT NOT NULL   -- a JSON list of Matrix user ids
)"""
_INDEX = "CREATE INDEX IF NOT EXISTS events_by_owner ON events (owner, start)"
_INSERT = f"""
INSERT INTO events (num, owner, title, start, "end", attendees)
VALUES ((SELECT COALESCE(MAX(num), {FIRST_EVENT_NUMBER - 1}) + 1 FROM events), ?, ?, ?, ?, ?)"""
_COLUMNS = 'num, owner, title, start, "end", attendees'


def _event(row: sqlite3.Row) -> Event:
    return Event(
        id=f"E-{row['num']}",
        title=row["title"],
        start=row["start"],
        end=row["end"],
        attendees=json.loads(row["attendees"]),
    )


class CalendarDB:
    """The SQLite file. Blocking: call it in a worker thread; one connection per call."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _transaction(self, write: bool = True) -> AbstractContextManager[sqlite3.Connection]:
        return transaction(self.path, write)

    def init(self, seed: Seed) -> bool:
        """Create and seed a new database (once); True if it was new."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._transaction() as conn:
            if conn.execute("PRAGMA user_version").fetchone()[0] >= SCHEMA_VERSION:
                return False
            conn.execute(_SCHEMA)
            conn.execute(_INDEX)
            for owner, events in seed.events.items():
                for e in events:
                    row = (owner, e.title, iso(e.start), iso(e.end), json.dumps(list(e.attendees)))
                    conn.execute(_INSERT, row)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            return True

    def healthy(self) -> bool:
        """The database opens and is the seeded schema."""
        try:
            with self._transaction(write=False) as conn:
                version: int = conn.execute("PRAGMA user_version").fetchone()[0]
                conn.execute("SELECT 1 FROM events LIMIT 1").fetchall()
        except sqlite3.Error:
            return False
        return version >= SCHEMA_VERSION

    def events_of(self, owner: str, start: datetime | None, end: datetime | None) -> list[Event]:
        """The owner's events overlapping [start, end), earliest first, at most MAX_LIST."""
        where, args = ["owner = ?"], [owner]
        if start is not None:
            where.append('"end" > ?')
            args.append(iso(start))
        if end is not None:
            where.append("start < ?")
            args.append(iso(end))
        sql = f"SELECT {_COLUMNS} FROM events WHERE {' AND '.join(where)} ORDER BY start, num LIMIT ?"
        with self._transaction(write=False) as conn:
            return [_event(r) for r in conn.execute(sql, [*args, MAX_LIST])]

    def busy(self, people: Iterable[str], start: datetime, end: datetime) -> list[tuple[datetime, datetime]]:
        """When any of `people` owns or attends an event overlapping [start, end)."""
        wanted = set(people)
        sql = f'SELECT {_COLUMNS} FROM events WHERE start < ? AND "end" > ?'
        with self._transaction(write=False) as conn:
            rows = conn.execute(sql, (iso(end), iso(start))).fetchall()
        return [
            (datetime.fromisoformat(r["start"]), datetime.fromisoformat(r["end"]))
            for r in rows
            if r["owner"] in wanted or wanted & set(json.loads(r["attendees"]))
        ]

    def create(self, owner: str, new: NewEvent) -> Event:
        row = (owner, new.title, iso(new.start), iso(new.end), json.dumps(new.attendees))
        with self._transaction() as conn:
            cur = conn.execute(_INSERT, row)
            found = conn.execute(f"SELECT {_COLUMNS} FROM events WHERE num = ?", (cur.lastrowid,))
            return _event(found.fetchone())


# --------------------------------------------------------------------------- HTTP and MCP


class Caller(NamedTuple):
    """Whom the key of this request belongs to (set by ApiKeyAuth)."""

    owner: str
    key_sha256: str


#: The request-state attribute ApiKeyAuth sets and the tools read.
CALLER_STATE = "calendar_caller"


class RequestRecord:
    """The last tool calls and refused requests (api_keys.REQUEST_LOG_SIZE): owner, tool, key
    hash, outcome."""

    def __init__(self) -> None:
        self.entries = request_log()

    def add(self, tool: str | None, owner: str | None, digest: str | None, outcome: str) -> None:
        self.entries.append({"tool": tool, "owner": owner, "key_sha256": digest, "outcome": outcome})
        log.info(
            "calendar_request",
            tool=tool,
            owner=owner,
            key_id=digest[:12] if digest else None,
            outcome=outcome,
        )

    @contextmanager
    def call(self, tool: str, caller: Caller) -> Iterator[None]:
        """Record one tool call; a tool error is recorded, then re-raised for FastMCP."""
        try:
            yield
        except Exception:
            self.add(tool, caller.owner, caller.key_sha256, "error")
            raise
        self.add(tool, caller.owner, caller.key_sha256, "ok")


class ApiKeyAuth:
    """ASGI middleware: an `X-API-Key` that is not known is answered 401 before the MCP layer
    sees it; a known key's Caller goes in the request state; without a key the request goes
    on anonymously (it may list the tools; every tool refuses: `caller_of`).

    Why plain ASGI rather than BaseHTTPMiddleware: the MCP responses may be streams.
    """

    def __init__(self, app: ASGIApp, owners: dict[str, str], record: RequestRecord) -> None:
        self.app, self.owners, self.record = app, owners, record

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or str(scope["path"]).startswith(PUBLIC_PATHS):
            await self.app(scope, receive, send)
            return
        key = Headers(scope=scope).get("x-api-key")
        if key is None:
            await self.app(scope, receive, send)
            return
        digest = key_sha256(key)
        owner = self.owners.get(digest)
        if owner is None:
            self.record.add(None, None, digest, "unauthorized")
            body = ErrorResponse(error_code="unauthorized", message="A valid X-API-Key header is required.")
            await JSONResponse(body.model_dump(), status_code=401)(scope, receive, send)
            return
        scope.setdefault("state", {})[CALLER_STATE] = Caller(owner, digest)
        await self.app(scope, receive, send)


def caller_of(ctx: Context[ServerSession, Any, Request]) -> Caller:
    """The caller ApiKeyAuth found for the HTTP request that carries this tool call."""
    request = ctx.request_context.request
    caller = getattr(request.state, CALLER_STATE, None) if request is not None else None
    if not isinstance(caller, Caller):  # an anonymous request: the tool list only
        raise ValueError("A valid X-API-Key header is required to use this calendar.")
    return caller


def _doc(fn: Callable[..., Any]) -> str:
    """A docstring as one line: the tool description a model reads."""
    return " ".join((fn.__doc__ or "").split())


def build_mcp(db: CalendarDB, record: RequestRecord, host: str) -> FastMCP[Any]:
    """The FastMCP server and its three tools; each acts on the caller's own events only.

    `host` is the address served: on loopback FastMCP turns on its DNS-rebinding protection
    (only Host 127.0.0.1 / localhost accepted)."""
    server: FastMCP[Any] = FastMCP(
        "vagent demo calendar",
        instructions="DEV ONLY. The caller's own team calendar: list events, find a free slot, "
        "create an event. Times are ISO-8601, UTC unless they say otherwise.",
        host=host,
        stateless_http=True,
        json_response=True,
    )

    async def list_events(start: str | None = None, end: str | None = None) -> EventList:
        """List the caller's own calendar events that overlap [start, end), earliest first (at
        most 200). start and end are ISO-8601 date-times (UTC unless they carry an offset);
        either may be omitted for an open range."""
        caller = caller_of(server.get_context())
        with record.call("list_events", caller):
            lo = parse_when("start", start) if start is not None else None
            hi = parse_when("end", end) if end is not None else None
            if lo is not None and hi is not None:
                check_range(lo, hi)
            return EventList(events=await asyncio.to_thread(db.events_of, caller.owner, lo, hi))

    async def find_free_slot(
        date: str, duration_minutes: int = 30, attendees: Sequence[str] = ()
    ) -> FreeSlot:
        """Find the first free slot of duration_minutes on date (YYYY-MM-DD) between 09:00 and
        17:00 UTC in which the caller and every attendee (Matrix user ids) are free. start and
        end are null when there is none that day."""
        caller = caller_of(server.get_context())
        with record.call("find_free_slot", caller):
            day, duration = parse_day(date), check_duration(duration_minutes)
            people = list(dict.fromkeys([caller.owner, *check_attendees(attendees)]))
            busy = await asyncio.to_thread(db.busy, people, *working_day(day))
            slot = first_free_slot(day, duration, busy)
            return FreeSlot(
                date=day.isoformat(),
                duration_minutes=duration_minutes,
                people=people,
                start=iso(slot[0]) if slot else None,
                end=iso(slot[1]) if slot else None,
            )

    async def create_event(title: str, start: str, end: str, attendees: Sequence[str] = ()) -> Event:
        """Create one event in the caller's own calendar and return it. title: 1-200
        characters; start, end: ISO-8601 date-times (UTC unless they carry an offset), end
        after start; attendees: Matrix user ids (@name:server)."""
        caller = caller_of(server.get_context())
        with record.call("create_event", caller):
            event = await asyncio.to_thread(db.create, caller.owner, new_event(title, start, end, attendees))
            log.info("calendar_event_created", owner=caller.owner, event_id=event.id)
            return event

    read_only = ToolAnnotations(readOnlyHint=True, openWorldHint=False)
    writes = ToolAnnotations(
        readOnlyHint=False, destructiveHint=False, idempotentHint=False, openWorldHint=False
    )
    tools: list[tuple[Callable[..., Any], str, ToolAnnotations]] = [
        (list_events, "List your calendar events", read_only),
        (find_free_slot, "Find a free slot in your calendar", read_only),
        (create_event, "Book a calendar event", writes),
    ]
    for fn, title, hints in tools:
        annotations = hints.model_copy(update={"title": title})
        server.add_tool(
            fn, title=title, description=_doc(fn), annotations=annotations, structured_output=True
        )
    return server


def _health_route(app: FastAPI, db: CalendarDB) -> None:
    @app.get("/health")
    async def health() -> Response:
        """200 while the database answers; 503 otherwise."""
        if await asyncio.to_thread(db.healthy):
            return JSONResponse({"status": "healthy"})
        return JSONResponse({"status": "unhealthy"}, status_code=503)


def create_app(seed_path: Path | str, db_path: Path | str, host: str = "127.0.0.1") -> FastAPI:
    """Build the service (the MCP endpoint at /mcp); SeedError or sqlite3.Error if it cannot start."""
    seed = load_seed(seed_path)
    db = CalendarDB(Path(db_path))
    if db.init(seed):
        log.info("calendar_seeded", db_path=str(db.path), events=sum(map(len, seed.events.values())))
    owners = {key_sha256(key): owner for key, owner in seed.keys.items()}
    record = RequestRecord()
    mcp = build_mcp(db, record, host)
    mcp_app = mcp.streamable_http_app()  # creates the session manager the lifespan runs

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with mcp.session_manager.run():
            yield

    app = FastAPI(
        title="vagent demo calendar (MCP)",
        version="0.1.0",
        description="DEV ONLY. Per-user calendars behind per-user API keys, served over MCP at /mcp.",
        lifespan=lifespan,
    )
    install_json_error_handlers(app)
    app.add_middleware(ApiKeyAuth, owners=owners, record=record)
    add_request_log_routes(app, record.entries)
    _health_route(app, db)
    app.mount("/", mcp_app)  # after the routes above, so they match first
    return app


#: The MCP SDK's loggers: at INFO they print "Terminating session: None" after every
#: request of a stateless server and "Processing request of type ..." for each message.
MCP_SDK_LOGGER = "mcp"


def quiet_mcp_sdk(log_level: str) -> None:
    """The SDK's INFO chatter is noise on the console of `make run`: shown at LOG_LEVEL=DEBUG
    only; its warnings and errors always are."""
    debug = log_level.strip().upper() == "DEBUG"
    logging.getLogger(MCP_SDK_LOGGER).setLevel(logging.NOTSET if debug else logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    """Serve on CALENDAR_HOST:CALENDAR_PORT (configured by CALENDAR_* environment variables)."""
    argparse.ArgumentParser(
        prog="vagent-calendar",
        description="DEMO calendar MCP server with per-user API keys (never production). "
        "Configured by CALENDAR_* environment variables.",
    ).parse_args(argv)
    settings = CalendarSettings()
    quiet_mcp_sdk(settings.LOG_LEVEL)
    return serve(
        "vagent-calendar",
        lambda: create_app(settings.CALENDAR_SEED_FILE, settings.CALENDAR_DB_PATH, settings.CALENDAR_HOST),
        host=settings.CALENDAR_HOST,
        port=settings.CALENDAR_PORT,
        log_level=settings.LOG_LEVEL,
        startup_errors=(SeedError, sqlite3.Error, OSError),
        note="DEMO calendar MCP server, never use in production",
        seed_file=str(settings.CALENDAR_SEED_FILE),
        db_path=str(settings.CALENDAR_DB_PATH),
        mcp_path="/mcp",
    )


if __name__ == "__main__":
    raise SystemExit(main())
