"""The demo database tools: read-only by the connection, whatever the SQL says."""

from __future__ import annotations

import sqlite3
from datetime import date
from pathlib import Path

import pytest

from tests.support.factories import ac
from vagent_graph.tools import Services
from vagent_graph.tools.records import RecordsDb, count_older_than, ensure_records_db
from vagent_graph.tools.registry import ToolContext, default_registry, result_text

REG = default_registry()


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    db = tmp_path / "records.db"
    ensure_records_db(db)
    return ToolContext(ac=ac(), session_id="s", services=Services(RecordsDb(db)))


def rows(ctx: ToolContext) -> int:
    with sqlite3.connect(ctx.services.get(RecordsDb).path) as c:
        return int(c.execute("SELECT COUNT(*) FROM records").fetchone()[0])


def test_seeded_once_and_deterministic(tmp_path: Path) -> None:
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    ensure_records_db(a)
    ensure_records_db(b)
    ensure_records_db(a)  # idempotent
    assert count_older_than(a, date(2020, 1, 1)) == count_older_than(b, date(2020, 1, 1)) > 0
    with sqlite3.connect(a) as c:
        assert c.execute("SELECT COUNT(*) FROM records").fetchone()[0] == 1500


@pytest.mark.parametrize(
    "sql",
    [
        "DELETE FROM records",
        "UPDATE records SET amount = 0",
        "DROP TABLE records",
        "INSERT INTO records (customer, amount, created_at) VALUES ('x', 1, '2020-01-01')",
        "CREATE TABLE evil (x)",
        "PRAGMA query_only = OFF",
        "ATTACH DATABASE '{tmp}/evil.db' AS evil",
        "WITH x AS (SELECT 1) DELETE FROM records",
        "SELECT 1; DELETE FROM records",
    ],
)
async def test_database_query_cannot_write(ctx: ToolContext, sql: str, tmp_path: Path) -> None:
    tool = REG.get("database_query")
    assert tool is not None
    before = rows(ctx)
    out = result_text(await tool.run(tool.args_model(sql=sql.format(tmp=tmp_path)), ctx, None))
    if sql.startswith("PRAGMA"):  # it may "run", but the connection stays read-only
        out = result_text(await tool.run(tool.args_model(sql="DELETE FROM records"), ctx, None))
    assert out.startswith("Query failed"), out
    assert rows(ctx) == before
    assert not (tmp_path / "evil.db").exists()


async def test_database_query_answers_a_table(ctx: ToolContext) -> None:
    tool = REG.get("database_query")
    assert tool is not None
    out = result_text(
        await tool.run(
            tool.args_model(
                sql="SELECT customer, COUNT(*) AS n FROM records GROUP BY customer ORDER BY customer"
            ),
            ctx,
            None,
        )
    )
    lines = out.splitlines()
    assert lines[0] == "customer | n" and len(lines) == 2 + 12
    big = result_text(await tool.run(tool.args_model(sql="SELECT * FROM records"), ctx, None))
    assert "only the first 50 rows" in big


async def test_delete_question_states_the_real_count(ctx: ToolContext) -> None:
    tool = REG.get("delete_records")
    assert tool is not None and tool.ask is not None
    args = tool.args_model(older_than="2019-01-01")
    n = count_older_than(ctx.services.get(RecordsDb).path, date(2019, 1, 1))
    q = await tool.ask(args, ctx)
    assert q is not None and q.text == f"Delete {n} records older than 2019-01-01?"
    assert q.options == ["yes", "no"] and q.kind == "confirm"
    assert await tool.run(args, ctx, "yes") == f"Deleted {n} records older than 2019-01-01."
    assert await tool.ask(args, ctx) is None  # nothing left: nothing to confirm
