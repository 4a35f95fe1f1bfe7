"""`vagent usage`: tokens per UTC day, tenant and user (docs/budgets.md).

    vagent usage [--tenant acme] [--user @alice:example.org] [--since 7d|2026-11-01] [--json]

One row per day, tenant and user; unless --user is given, each tenant's day total follows
its users (user `*`: it still counts users forgotten since). --since takes a date
(YYYY-MM-DD, UTC) or a number of days back, today included (`1d`, the default, is today).
--json prints JSON lines, one UsageRow each (`user_id` "" for a tenant's total).

Reads REDIS_URL. Exit codes: 0 done, 1 Redis refused a command, 2 bad usage or Redis
unreachable.
"""

from __future__ import annotations

from datetime import date
from typing import Annotated

import typer
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from vagent_graph.cli.common import connect, load_settings
from vagent_graph.cli.output import cell, complain, say, unreachable
from vagent_graph.observability.usage import day_rows, days_from, parse_since
from vagent_shared import redis_keys
from vagent_shared.budgets import UsageRow, usage_day
from vagent_shared.redis_connect import RedisUrlError
from vagent_shared.settings import CommonSettings

PROG = "vagent usage"

#: (title, width, right-aligned) of the table's columns.
COLUMNS: tuple[tuple[str, int, bool], ...] = (
    ("DAY (UTC)", 10, False),
    ("TENANT", 16, False),
    ("USER", 32, False),
    ("INPUT", 11, True),
    ("OUTPUT", 11, True),
    ("TOTAL", 11, True),
    ("CALLS", 7, True),
)
ALL_USERS = "*"


def _line(values: tuple[str, ...]) -> str:
    cells = [
        (cell(v, w).rjust(w) if right else cell(v, w).ljust(w))
        for v, (_, w, right) in zip(values, COLUMNS, strict=True)
    ]
    return "  ".join(cells).rstrip()


def table_header() -> str:
    return _line(tuple(title for title, _, _ in COLUMNS))


def table_row(row: UsageRow) -> str:
    return _line(
        (
            row.day.isoformat(),
            row.tenant,
            row.user_id or ALL_USERS,
            f"{row.input_tokens:,}",
            f"{row.output_tokens:,}",
            f"{row.total_tokens:,}",
            f"{row.llm_calls:,}",
        )
    )


def read_rows(redis: Redis, days: list[date], tenant: str | None, user: str | None) -> list[UsageRow]:
    pipe = redis.pipeline(transaction=False)
    for day in days:
        pipe.hgetall(redis_keys.usage_day(day.isoformat()))
    found = pipe.execute()
    return [
        row for day, fields in zip(days, found, strict=True) for row in day_rows(day, fields, tenant, user)
    ]


def _since(text: str) -> date:
    try:
        return parse_since(text, usage_day())
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


Tenant = Annotated[str | None, typer.Option(metavar="TENANT", help="only this tenant (ACL domain)")]
User = Annotated[str | None, typer.Option(metavar="USER_ID", help="only this Matrix user id")]
Since = Annotated[
    date | None,
    typer.Option(parser=_since, metavar="WHEN", help="from this UTC day: YYYY-MM-DD, or 7d (default: today)"),
]


def usage(
    tenant: Tenant = None,
    user: User = None,
    since: Since = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines (one UsageRow per line)")] = False,
) -> None:
    """Tokens per UTC day, tenant and user (a table, or JSON lines)."""
    settings = load_settings(PROG, CommonSettings)
    today = usage_day()
    try:
        redis = connect(settings.REDIS_URL)
        try:
            rows = read_rows(redis, days_from(since or today, today), tenant, user)
        finally:
            redis.close()
    except RedisUrlError as exc:
        complain(PROG, str(exc))
        raise typer.Exit(2) from None
    except (RedisConnectionError, RedisTimeoutError) as exc:
        complain(PROG, unreachable(settings.REDIS_URL, exc))
        raise typer.Exit(2) from None
    except RedisError as exc:
        complain(PROG, f"Redis refused: {exc}")
        raise typer.Exit(1) from None
    if as_json:
        for row in rows:
            say(row.model_dump_json())
        return
    say(table_header())
    for row in rows:
        say(table_row(row))
