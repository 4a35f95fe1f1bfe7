"""Demo tools over a small SQLite "records" database the service creates and seeds.

`database_query` opens the file READ-ONLY (SQLite URI mode=ro + query_only), so no
SQL text can write, whatever it says. `delete_records` asks first, stating the count.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
import time
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from urllib.parse import quote

from pydantic import BaseModel, Field

from vagent_graph.tools.registry import Question, Tool, ToolContext

MAX_ROWS = 50
QUERY_TIME_LIMIT_S = 2.0
CUSTOMERS = [
    "Acme Corp",
    "Globex",
    "Initech",
    "Umbrella",
    "Hooli",
    "Stark Industries",
    "Wayne Enterprises",
    "Wonka",
    "Soylent",
    "Tyrell",
    "Cyberdyne",
    "Aperture",
]
SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY,
    customer TEXT NOT NULL,
    amount REAL NOT NULL,
    created_at TEXT NOT NULL  -- ISO date YYYY-MM-DD
);
CREATE INDEX IF NOT EXISTS records_created_at ON records(created_at);
"""


@dataclass(frozen=True)
class RecordsDb:
    """The demo database's file, as a service the records tools find in their context."""

    path: Path


def ensure_records_db(path: Path, rows: int = 1500, seed: int = 42) -> None:
    """Create and seed the database once; an existing one is left alone."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as conn:
        conn.executescript(SCHEMA)
        (n,) = conn.execute("SELECT COUNT(*) FROM records").fetchone()
        if n:
            return
        rng = random.Random(seed)
        start, span = date(2015, 1, 1), (date(2025, 12, 31) - date(2015, 1, 1)).days
        conn.executemany(
            "INSERT INTO records (customer, amount, created_at) VALUES (?, ?, ?)",
            [
                (
                    rng.choice(CUSTOMERS),
                    round(rng.uniform(10, 5000), 2),
                    (start + timedelta(days=rng.randint(0, span))).isoformat(),
                )
                for _ in range(rows)
            ],
        )


def _readonly(path: Path) -> sqlite3.Connection:
    if not path.exists():
        raise FileNotFoundError("the records database does not exist")
    conn = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, timeout=5)
    conn.execute("PRAGMA query_only = ON")
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)  # no ATTACH of other (writable) files
    return conn


def run_query(
    path: Path, sql: str, max_rows: int = MAX_ROWS
) -> tuple[list[str], list[tuple[object, ...]], bool]:
    """Columns, at most `max_rows` rows, and whether more were cut off."""
    conn = _readonly(path)
    deadline = time.monotonic() + QUERY_TIME_LIMIT_S
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
    try:
        cur = conn.execute(sql)
        cols = [d[0] for d in cur.description or []]
        rows = cur.fetchmany(max_rows + 1)
        return cols, rows[:max_rows], len(rows) > max_rows
    finally:
        conn.close()


def count_older_than(path: Path, cutoff: date) -> int:
    conn = _readonly(path)
    try:
        (n,) = conn.execute(
            "SELECT COUNT(*) FROM records WHERE created_at < ?", (cutoff.isoformat(),)
        ).fetchone()
        return int(n)
    finally:
        conn.close()


def delete_older_than(path: Path, cutoff: date) -> int:
    with sqlite3.connect(path, timeout=5) as conn:
        cur = conn.execute("DELETE FROM records WHERE created_at < ?", (cutoff.isoformat(),))
        return cur.rowcount


def format_table(cols: list[str], rows: list[tuple[object, ...]], truncated: bool) -> str:
    if not cols:
        return "The query returned no columns."
    if not rows:
        return "The query returned no rows."
    lines = [" | ".join(cols), " | ".join("---" for _ in cols)]
    lines += [" | ".join("" if v is None else str(v) for v in row) for row in rows]
    if truncated:
        lines.append(f"(only the first {len(rows)} rows are shown)")
    return "\n".join(lines)


class DatabaseQueryArgs(BaseModel):
    sql: str = Field(
        min_length=1,
        max_length=4000,
        description="One read-only SQLite SELECT statement over table `records`.",
    )


class DeleteRecordsArgs(BaseModel):
    older_than: date = Field(description="Delete records created before this date (YYYY-MM-DD).")


async def _query(args: DatabaseQueryArgs, ctx: ToolContext, _: str | None) -> str:
    try:
        cols, rows, truncated = await asyncio.to_thread(run_query, ctx.services.get(RecordsDb).path, args.sql)
    except (sqlite3.Error, sqlite3.Warning) as exc:
        return f"Query failed: {exc}"
    return format_table(cols, rows, truncated)


async def _ask_delete(args: DeleteRecordsArgs, ctx: ToolContext) -> Question | None:
    n = await asyncio.to_thread(count_older_than, ctx.services.get(RecordsDb).path, args.older_than)
    if n == 0:
        return None
    noun = "record" if n == 1 else "records"
    return Question(
        text=f"Delete {n} {noun} older than {args.older_than.isoformat()}?", options=["yes", "no"]
    )


async def _delete(args: DeleteRecordsArgs, ctx: ToolContext, _: str | None) -> str:
    n = await asyncio.to_thread(delete_older_than, ctx.services.get(RecordsDb).path, args.older_than)
    if n == 0:
        return f"There are no records older than {args.older_than.isoformat()}; nothing was deleted."
    return f"Deleted {n} records older than {args.older_than.isoformat()}."


TOOLS = [
    Tool(
        name="database_query",
        description=(
            "Run a read-only SQL query on the records database (SQLite). Table `records` "
            "has columns id, customer, amount, created_at (YYYY-MM-DD)."
        ),
        args_model=DatabaseQueryArgs,
        run=_query,
    ),
    Tool(
        name="delete_records",
        description="Delete all records created before a date. The user must confirm.",
        args_model=DeleteRecordsArgs,
        ask=_ask_delete,
        run=_delete,
        requires_confirmation=True,
    ),
]
