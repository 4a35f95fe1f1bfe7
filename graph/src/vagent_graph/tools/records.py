"""Demo tools over the small SQLite "records" database (services/records.py).

`database_query` runs on a READ-ONLY connection, so no SQL text can write, whatever it says.
`delete_records` asks first, stating the count, and deletes exactly the rows that were counted:
its plan is the count and a digest of their ids; the delete re-reads the matching rows inside
its write transaction and, if they are no longer the same (rows were added or removed
meanwhile), deletes nothing and asks again.
"""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import date
from pathlib import Path

from pydantic import BaseModel, Field

from vagent_graph.services.records import RecordsDb, delete_confirmed, matching_older_than, run_query
from vagent_graph.tools.base import Changed, NothingToDo, Prepared, Tool, ToolContext


def format_table(cols: list[str], rows: list[tuple[object, ...]], truncated: bool) -> str:
    """Rows as a compact table; a single value (a count) as `name: value`, which reads as
    data rather than as a one-cell table."""
    if not cols:
        return "The query returned no columns."
    if not rows:
        return "The query returned no rows."
    if len(cols) == 1 and len(rows) == 1:
        value = rows[0][0]
        return f"{cols[0]}: {'' if value is None else value}"
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
        path = await _database(ctx)
        cols, rows, truncated = await asyncio.to_thread(run_query, path, args.sql)
    except (sqlite3.Error, sqlite3.Warning) as exc:
        return f"Query failed: {exc}"
    return format_table(cols, rows, truncated)


async def _database(ctx: ToolContext) -> Path:
    """The asking user's tenant's database (created on its first use)."""
    return await asyncio.to_thread(ctx.services.get(RecordsDb).for_domain, ctx.ac.active_acl_domain)


def _records(n: int) -> str:
    return f"{n} record" if n == 1 else f"{n} records"


def _nothing(cutoff: date) -> str:
    return f"There are no records older than {cutoff.isoformat()}; nothing was deleted."


def _delete_plan(cutoff: date, n: int, digest: str) -> Prepared:
    return Prepared(
        action=f"Delete {_records(n)} older than {cutoff.isoformat()}", plan={"count": n, "digest": digest}
    )


async def _prepare_delete(args: DeleteRecordsArgs, ctx: ToolContext) -> Prepared | NothingToDo:
    path = await _database(ctx)
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
    path = await _database(ctx)
    deleted, now, now_digest = await asyncio.to_thread(delete_confirmed, path, args.older_than, count, digest)
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
