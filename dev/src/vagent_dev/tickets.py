"""`vagent-tickets`: a small DEMO ticket service that knows people only by their API key.

Why: per-user credentials (the Credential Registry) are only worth something if the external
system answers differently per key. This one does: each key belongs to one person, who sees
and files only their own tickets. The graph's ticket tools call exactly this API:

    X-API-Key: <key>                      missing or unknown -> 401 {"error_code": "unauthorized"}
    GET  /api/v1/tickets?status=open|closed|all   (default open)
         -> 200 {"tickets": [ticket, ...]}   the key owner's only, newest first, at most 50
    POST /api/v1/tickets {"title": 1..200, "description": 0..4000 = "",
                          "priority": "low"|"normal"|"high" = "normal"}
         -> 201 ticket | 422 bad body
    ticket = {"id": "T-1001", "title", "description", "status": "open"|"closed",
              "priority", "created_at": ISO-8601 UTC, "owner": "@alice:localhost"}

Every /api request is recorded in memory (`GET`/`DELETE /debug/requests`) with the SHA-256
of the key it carried, so tests can prove whose key arrived while the service stores no raw
key anywhere (it keeps only the keys' hashes, and never logs a key).

Tickets live in SQLite (TICKETS_DB_PATH); a new database is seeded once from
TICKETS_SEED_FILE, which also maps the keys to their owners (re-read at every start).
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
from collections import deque
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import structlog
from fastapi import Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictStr, model_validator
from starlette.middleware.base import RequestResponseEndpoint

from vagent_dev.api_keys import add_request_log_routes, key_sha256, request_log, seed_place
from vagent_dev.serving import install_json_error_handlers, serve
from vagent_dev.settings import TicketsSettings
from vagent_dev.sqlite_files import transaction
from vagent_dev.yaml_files import FileError, load_yaml_model
from vagent_shared.wire import ErrorResponse

log = structlog.get_logger(__name__)

Priority = Literal["low", "normal", "high"]
Status = Literal["open", "closed"]
ListStatus = Literal["open", "closed", "all"]
#: At most this many tickets per listing.
MAX_LIST = 50
#: The request record keeps the last this many /api requests.
#: PRAGMA user_version of a created and seeded database.
SCHEMA_VERSION = 1
FIRST_TICKET_NUMBER = 1001


class SeedError(FileError):
    """The seed file is missing, not YAML, or does not validate."""


class SeedTicket(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    title: StrictStr = Field(min_length=1, max_length=200)
    description: StrictStr = Field(default="", max_length=4000)
    status: Status = "open"
    priority: Priority = "normal"
    owner: StrictStr


class Seed(BaseModel):
    """`keys` (API key -> owner) and the demo tickets, listed newest first."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    keys: dict[Annotated[StrictStr, Field(min_length=16)], StrictStr]
    tickets: list[SeedTicket] = Field(default_factory=list)

    @model_validator(mode="after")
    def _owners(self) -> Seed:
        """A ticket nobody can see is a typo in its owner."""
        owners = set(self.keys.values())
        orphans = sorted({t.owner for t in self.tickets} - owners)
        if orphans:
            raise ValueError(f"tickets owned by {orphans}, who hold no key")
        return self


def load_seed(path: Path | str) -> Seed:
    """Read and validate the seed file; SeedError names the problem, never a key."""
    return load_yaml_model(path, Seed, "seed file", SeedError, seed_place)


class NewTicket(BaseModel):
    """The POST body."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    title: StrictStr = Field(min_length=1, max_length=200)
    description: StrictStr = Field(default="", max_length=4000)
    priority: Priority = "normal"


class Ticket(BaseModel):
    id: str
    title: str
    description: str
    status: Status
    priority: Priority
    created_at: str
    owner: str


_SCHEMA = """
CREATE TABLE IF NOT EXISTS tickets (
    num INTEGER PRIMARY KEY,
    owner TEXT NOT NULL,
    title TEXT NOT NULL,
    description TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('open', 'closed')),
    priority TEXT NOT NULL CHECK (priority IN ('low', 'normal', 'high')),
    created_at TEXT NOT NULL  -- ISO-8601 UTC with microseconds, so it sorts as text
)"""
_INDEX = "CREATE INDEX IF NOT EXISTS tickets_by_owner ON tickets (owner, created_at)"
_INSERT = f"""
INSERT INTO tickets (num, owner, title, description, status, priority, created_at)
VALUES ((SELECT COALESCE(MAX(num), {FIRST_TICKET_NUMBER - 1}) + 1 FROM tickets), ?, ?, ?, ?, ?, ?)"""
_COLUMNS = "num, owner, title, description, status, priority, created_at"


def _ticket(row: sqlite3.Row) -> Ticket:
    created = datetime.fromisoformat(row["created_at"]).isoformat(timespec="seconds")
    return Ticket(
        id=f"T-{row['num']}",
        title=row["title"],
        description=row["description"],
        status=row["status"],
        priority=row["priority"],
        created_at=created,
        owner=row["owner"],
    )


class TicketDB:
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
            now = datetime.now(UTC)
            for i, t in enumerate(reversed(seed.tickets)):  # the first listed is the newest
                created = now - timedelta(hours=len(seed.tickets) - i)
                row = (
                    t.owner,
                    t.title,
                    t.description,
                    t.status,
                    t.priority,
                    created.isoformat(timespec="microseconds"),
                )
                conn.execute(_INSERT, row)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            return True

    def tickets_of(self, owner: str, status: ListStatus) -> list[Ticket]:
        """The owner's tickets, newest first, at most MAX_LIST."""
        where, args = "owner = ?", [owner]
        if status != "all":
            where, args = f"{where} AND status = ?", [owner, status]
        sql = f"SELECT {_COLUMNS} FROM tickets WHERE {where} ORDER BY created_at DESC, num DESC LIMIT ?"
        with self._transaction(write=False) as conn:
            return [_ticket(r) for r in conn.execute(sql, [*args, MAX_LIST])]

    def create(self, owner: str, new: NewTicket) -> Ticket:
        created = datetime.now(UTC).isoformat(timespec="microseconds")
        with self._transaction() as conn:
            cur = conn.execute(_INSERT, (owner, new.title, new.description, "open", new.priority, created))
            row = conn.execute(f"SELECT {_COLUMNS} FROM tickets WHERE num = ?", (cur.lastrowid,)).fetchone()
            return _ticket(row)


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse(ErrorResponse(error_code=code, message=message).model_dump(), status_code=status)


async def _owner(request: Request) -> str:
    """The key owner the middleware found (every /api route runs behind it)."""
    return str(request.state.owner)


def _authenticate(app: FastAPI, owners: dict[str, str], record: deque[dict[str, Any]]) -> None:
    """X-API-Key for every /api request, before the body is parsed; each one is recorded."""

    @app.middleware("http")
    async def _auth(request: Request, call_next: RequestResponseEndpoint) -> Response:
        if not request.url.path.startswith("/api/"):
            return await call_next(request)
        key = request.headers.get("x-api-key")
        digest = key_sha256(key) if key is not None else None
        owner = owners.get(digest) if digest is not None else None
        if owner is None:
            response: Response = _error(401, "unauthorized", "A valid X-API-Key header is required.")
        else:
            request.state.owner = owner
            response = await call_next(request)
        entry = {"method": request.method, "path": request.url.path, "key_sha256": digest}
        record.append({**entry, "owner": owner, "status": response.status_code})
        log.info(
            "ticket_request",
            method=request.method,
            path=request.url.path,
            owner=owner,
            key_id=digest[:12] if digest else None,
            status=response.status_code,
        )
        return response


def _ticket_routes(app: FastAPI, db: TicketDB) -> None:
    @app.get("/api/v1/tickets", responses={401: {"model": ErrorResponse}, 422: {"model": ErrorResponse}})
    async def list_tickets(
        status: ListStatus = "open", owner: str = Depends(_owner)
    ) -> dict[str, list[Ticket]]:
        """The key owner's tickets only."""
        return {"tickets": await asyncio.to_thread(db.tickets_of, owner, status)}

    @app.post(
        "/api/v1/tickets",
        status_code=201,
        responses={401: {"model": ErrorResponse}, 422: {"model": ErrorResponse}},
    )
    async def create_ticket(body: NewTicket, owner: str = Depends(_owner)) -> Ticket:
        """File a ticket as the key owner (open, id T-<next>)."""
        ticket = await asyncio.to_thread(db.create, owner, body)
        log.info("ticket_created", owner=owner, ticket_id=ticket.id, priority=ticket.priority)
        return ticket


def _health_route(app: FastAPI) -> None:
    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "healthy"}


def create_app(seed_path: Path | str, db_path: Path | str) -> FastAPI:
    """Build the service; SeedError or sqlite3.Error if it cannot start."""
    seed = load_seed(seed_path)
    db = TicketDB(Path(db_path))
    if db.init(seed):
        log.info("tickets_seeded", db_path=str(db.path), tickets=len(seed.tickets))
    owners = {key_sha256(key): owner for key, owner in seed.keys.items()}
    record = request_log()
    app = FastAPI(
        title="vagent demo ticket service",
        version="0.1.0",
        description="DEV ONLY. Per-user tickets behind per-user API keys.",
    )
    install_json_error_handlers(app)
    _authenticate(app, owners, record)
    _ticket_routes(app, db)
    add_request_log_routes(app, record)
    _health_route(app)
    return app


def main(argv: list[str] | None = None) -> int:
    """Serve on TICKETS_HOST:TICKETS_PORT (configured by TICKETS_* environment variables)."""
    argparse.ArgumentParser(
        prog="vagent-tickets",
        description="DEMO ticket service with per-user API keys (never production). "
        "Configured by TICKETS_* environment variables.",
    ).parse_args(argv)
    settings = TicketsSettings()
    return serve(
        "vagent-tickets",
        lambda: create_app(settings.TICKETS_SEED_FILE, settings.TICKETS_DB_PATH),
        host=settings.TICKETS_HOST,
        port=settings.TICKETS_PORT,
        log_level=settings.LOG_LEVEL,
        startup_errors=(SeedError, sqlite3.Error, OSError),
        note="DEMO ticket service, never use in production",
        seed_file=str(settings.TICKETS_SEED_FILE),
        db_path=str(settings.TICKETS_DB_PATH),
    )


if __name__ == "__main__":
    raise SystemExit(main())
