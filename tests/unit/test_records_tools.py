"""The demo database tools: read-only by the connection, whatever the SQL says."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from datetime import date
from pathlib import Path

import pytest

from tests.support.factories import ac
from vagent_graph.services import Services
from vagent_graph.services.records import RecordsDb, count_older_than, ensure_records_db
from vagent_graph.tools.base import Changed, NothingToDo, Prepared, ToolContext, result_text
from vagent_graph.tools.catalogue import default_registry

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


async def test_delete_states_the_real_count_and_deletes_exactly_those(ctx: ToolContext) -> None:
    tool = REG.get("delete_records")
    assert tool is not None and tool.prepare is not None and tool.ask is None
    args = tool.args_model(older_than="2019-01-01")
    n = count_older_than(ctx.services.get(RecordsDb).path, date(2019, 1, 1))
    prepared = await tool.prepare(args, ctx)
    assert isinstance(prepared, Prepared) and prepared.action == f"Delete {n} records older than 2019-01-01"
    done = await tool.run(args, replace(ctx, plan=prepared.plan), "yes")
    assert done == f"Deleted {n} records older than 2019-01-01."
    nothing = await tool.prepare(args, ctx)  # nothing left: nothing to confirm, nothing runs
    assert isinstance(nothing, NothingToDo) and "nothing was deleted" in nothing.text


async def test_delete_without_a_confirmed_plan_deletes_nothing(ctx: ToolContext) -> None:
    tool = REG.get("delete_records")
    assert tool is not None
    before = rows(ctx)
    out = await tool.run(tool.args_model(older_than="2030-01-01"), ctx, "yes")
    assert out == "Nothing was deleted: the deletion was not confirmed." and rows(ctx) == before


async def test_rows_added_after_the_question_are_never_deleted(ctx: ToolContext) -> None:
    """The confirmed plan is the counted rows: one more matching row and nothing is deleted;
    the tool answers Changed with the new figure instead."""
    tool = REG.get("delete_records")
    assert tool is not None and tool.prepare is not None
    args = tool.args_model(older_than="2016-01-01")
    prepared = await tool.prepare(args, ctx)
    assert isinstance(prepared, Prepared)
    n = prepared.plan["count"]
    with sqlite3.connect(ctx.services.get(RecordsDb).path) as c:
        c.execute("INSERT INTO records (customer, amount, created_at) VALUES ('Late', 1, '2015-03-03')")
    before = rows(ctx)
    changed = await tool.run(args, replace(ctx, plan=prepared.plan), "yes")
    assert isinstance(changed, Changed) and rows(ctx) == before
    assert changed.prepared.action == f"Delete {n + 1} records older than 2016-01-01"
    assert f"{n} records then" in changed.reason
    again = await tool.run(args, replace(ctx, plan=changed.prepared.plan), "yes")
    assert again == f"Deleted {n + 1} records older than 2016-01-01." and rows(ctx) == before - n - 1


async def test_each_tenant_has_its_own_database_with_domain_in_the_path(tmp_path: Path) -> None:
    """`RECORDS_DB_PATH=.data/records/{domain}.db` (make run): one tenant's delete leaves
    another's rows alone, and each database is created and seeded on its first use."""
    services = Services(RecordsDb(tmp_path / "records" / "{domain}.db"))
    acme = ToolContext(ac=ac(domain="acme"), session_id="s", services=services)
    demo = ToolContext(ac=ac(domain="demo"), session_id="s", services=services)
    tool = REG.get("delete_records")
    assert tool is not None and tool.prepare is not None
    args = tool.args_model(older_than="2020-01-01")
    prepared = await tool.prepare(args, acme)
    assert isinstance(prepared, Prepared) and prepared.action.startswith("Delete ")
    assert result_text(await tool.run(args, replace(acme, plan=prepared.plan), "yes")).startswith("Deleted ")
    assert isinstance(await tool.prepare(args, acme), NothingToDo)
    again = await tool.prepare(args, demo)  # the other tenant's rows are all still there
    assert isinstance(again, Prepared) and again.action == prepared.action
    assert sorted(p.name for p in (tmp_path / "records").iterdir()) == ["acme.db", "demo.db"]


@pytest.mark.parametrize("domain", ["..", "../x", "a/b", ".hidden", "a..b", "", "x" * 101])
def test_a_domain_that_is_no_plain_name_gets_no_database(tmp_path: Path, domain: str) -> None:
    db = RecordsDb(tmp_path / "records" / "{domain}.db")
    with pytest.raises(FileNotFoundError):
        db.for_domain(domain)
    assert not (tmp_path / "records").exists() or not any((tmp_path / "records").iterdir())
    assert not list(tmp_path.glob("*.db"))
