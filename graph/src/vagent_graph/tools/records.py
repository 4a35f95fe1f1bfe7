"""Demo tools over a small SQLite "records" database the service creates and seeds.

`database_query` opens the file READ-ONLY (SQLite URI mode=ro + query_only), so no
SQL text can write, whatever it says. `delete_records` asks first, stating the count, and
deletes exactly the rows that were counted: its plan is the count and a digest of their ids;
the delete re-reads the matching rows inside its write transaction and, if they are no longer
the same (rows were added or removed meanwhile), deletes nothing and asks again.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import sqlite3
import time
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from urllib.parse import quote

from pydantic import BaseModel, Field

from vagent_graph.tools.registry import Changed, NothingToDo, Prepared, Tool, ToolContext

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


def _matching(conn: sqlite3.Connection, cutoff: date) -> tuple[int, str]:
    """How many rows are older than `cutoff`, and a digest of exactly which: their ids, joined
    by SQLite itself (no Python object per row) in the order of the created_at index, which is
    the same for the same rows."""
    n, ids = conn.execute(
        "SELECT COUNT(*), group_concat(id) FROM records WHERE created_at < ?", (cutoff.isoformat(),)
    ).fetchone()
    return int(n), hashlib.sha256(str(ids or "").encode()).hexdigest()


def matching_older_than(path: Path, cutoff: date) -> tuple[int, str]:
    """The rows a delete would remove now: their count and the digest of their ids."""
    conn = _readonly(path)
    try:
        return _matching(conn, cutoff)
    finally:
        conn.close()


def delete_confirmed(path: Path, cutoff: date, count: int, digest: str) -> tuple[int | None, int, str]:
    """Delete the rows older than `cutoff` iff they are exactly the confirmed ones.

    Returns (deleted, count now, digest now); `deleted` is None when the matching rows are not
    the confirmed ones any more (nothing deleted). The check and the delete share one write
    transaction (BEGIN IMMEDIATE), so no row can slip in between them.
    """
    conn = sqlite3.connect(path, timeout=5, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            now, now_digest = _matching(conn, cutoff)
            if (now, now_digest) != (count, digest):
                conn.execute("ROLLBACK")
                return None, now, now_digest
            cur = conn.execute("DELETE FROM records WHERE created_at < ?", (cutoff.isoformat(),))
            deleted = cur.rowcount
            conn.execute("COMMIT")
            return deleted, now, now_digest
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    finally:
        conn.close()


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


def _records(n: int) -> str:
    return f"{n} record" if n == 1 else f"{n} records"


def _nothing(cutoff: date) -> str:
    return f"There are no records older than {cutoff.isoformat()}; nothing was deleted."


def _delete_plan(cutoff: date, n: int, digest: str) -> Prepared:
    return Prepared(
        action=f"Delete {_records(n)} older than {cutoff.isoformat()}", plan={"count": n, "digest": digest}
    )


async def _prepare_delete(args: DeleteRecordsArgs, ctx: ToolContext) -> Prepared | NothingToDo:
    path = ctx.services.get(RecordsDb).path
    n, digest = await asyncio.to_thread(matching_older_than, path, args.older_than)
    if n == 0:
        return NothingToDo(_nothing(args.older_than))
    return _delete_plan(args.older_than, n, digest)


async def _delete(args: DeleteRecordsArgs, ctx: ToolContext, _: str | None) -> str | Changed:
    """Deletes exactly the confirmed rows, or nothing (Changed: they are not the same now)."""
    plan = ctx.plan or {}
    count, digest = plan.get("count"), plan.get("digest")
    if not isinstance(count, int) or not isinstance(digest, str):
        return "Nothing was deleted: the deletion was not confirmed."
    path = ctx.services.get(RecordsDb).path
    deleted, now, now_digest = await asyncio.to_thread(
        delete_confirmed, path, args.older_than, count, digest
    )
    if deleted is not None:
        return f"Deleted {_records(deleted)} older than {args.older_than.isoformat()}."
    if now == 0:
        return f"There are no records older than {args.older_than.isoformat()} any more; nothing was deleted."
    return Changed(
        _delete_plan(args.older_than, now, now_digest),
        reason=(
            f"The records older than {args.older_than.isoformat()} changed since you were asked "
            f"({_records(count)} then); nothing was deleted yet."
        ),
    )


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
        prepare=_prepare_delete,
        run=_delete,
        requires_confirmation=True,
        shows=("older_than",),
    ),
]
