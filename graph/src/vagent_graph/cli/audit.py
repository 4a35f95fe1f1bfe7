"""`vagent audit`: read the audit trail, the Redis stream both services append to (docs/audit.md).

    vagent audit tail [--user @alice:example.org] [--decision denied] [--type tool_access]
                      [--since 1h] [--count 50] [--follow] [--json]
    vagent audit export [--since 2d] [--until 2026-11-22T10:00:00Z] [--user ...] [--decision ...]
                        [--type ...]

`tail` prints the last N matching events, oldest first, as a table (or JSON lines with
--json); with --follow it then prints new events as they arrive, until Ctrl-C. `export`
writes every matching event as JSON lines, oldest first, for a SIEM. A JSON line is exactly
`AuditEvent.model_dump_json()`.

--since/--until take a duration back from now (90s, 30m, 1h, 2d, 1w) or an ISO-8601 time
(no zone: UTC). Only that part of the stream is read (vagent_graph.observability.audit_reader says how).
Times are shown in UTC.

Reads REDIS_URL and AUDIT_STREAM. Entries that are not audit events are skipped and counted
on stderr. Exit codes: 0 done, 1 Redis refused a command, 2 bad usage or Redis unreachable.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, TextIO

import typer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from vagent_graph.cli.common import connect, load_settings
from vagent_graph.cli.output import cell, complain, skipped, unreachable
from vagent_graph.observability.audit_reader import Filter, StreamReader, id_before, parse_when, stream_id
from vagent_shared.audit import AuditEvent, AuditEventType, Decision
from vagent_shared.redis_connect import RedisUrlError
from vagent_shared.settings import CommonSettings

PROG = "vagent audit"

app = typer.Typer(
    help="Read vagent's audit trail (the Redis stream AUDIT_STREAM at REDIS_URL).",
    short_help="Read the audit trail: tail, export.",
    no_args_is_help=True,
)


# ---- the table (pure) --------------------------------------------------------------------------

#: (title, width) of the table's columns; the last one is not padded.
COLUMNS: tuple[tuple[str, int], ...] = (
    ("SERVICE", 7),
    ("EVENT", 17),
    ("DECISION", 8),
    ("USER", 28),
    ("RESOURCE", 30),
    ("REASON", 60),
)


def format_time(when: datetime, full: bool) -> str:
    utc = when.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%SZ") if full else utc.strftime("%H:%M:%S")


def spans_days(since: datetime | None, events: Iterable[AuditEvent], now: datetime) -> bool:
    """Whether times need their date: --since reaches back more than a day, or the events
    shown fall on more than one (UTC) day."""
    if since is not None and now - since > timedelta(days=1):
        return True
    return len({e.timestamp.astimezone(UTC).date() for e in events}) > 1


def table_header(full_time: bool) -> str:
    time_col = "TIME (UTC)".ljust(20 if full_time else 10)
    cols = [title.ljust(width) for title, width in COLUMNS[:-1]] + [COLUMNS[-1][0]]
    return (time_col + "  " + "  ".join(cols)).rstrip()


def table_row(event: AuditEvent, full_time: bool) -> str:
    values = (event.service, event.event_type, event.decision, event.user_id, event.resource, event.reason)
    cells = [cell(v, w).ljust(w) for v, (_, w) in zip(values[:-1], COLUMNS[:-1], strict=True)]
    cells.append(cell(values[-1], COLUMNS[-1][1]))
    time_col = format_time(event.timestamp, full_time).ljust(20 if full_time else 10)
    return (time_col + "  " + "  ".join(cells)).rstrip()


def json_line(event: AuditEvent) -> str:
    return event.model_dump_json()


class Output:
    """Events to `out` as table rows or JSON lines, flushed per event (pipes, --follow)."""

    def __init__(self, out: TextIO, as_json: bool, full_time: bool) -> None:
        self.out, self.as_json, self.full_time = out, as_json, full_time
        self._header_done = as_json

    def emit(self, event: AuditEvent) -> None:
        if not self._header_done:
            self.header()
        self.out.write((json_line(event) if self.as_json else table_row(event, self.full_time)) + "\n")

    def header(self) -> None:
        if not self._header_done:
            self.out.write(table_header(self.full_time) + "\n")
            self._header_done = True

    def flush(self) -> None:
        self.out.flush()


# ---- the commands' work ------------------------------------------------------------------------


@dataclass(frozen=True)
class Query:
    """What `tail` or `export` was asked for."""

    user: str | None = None
    decision: str | None = None
    event_type: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    count: int = 50
    follow: bool = False
    json: bool = False

    def filter(self) -> Filter:
        return Filter(self.user, self.decision, self.event_type)


def _now() -> datetime:
    return datetime.now(UTC)


def show_tail(reader: StreamReader, q: Query, out: TextIO) -> None:
    flt = q.filter()
    found: list[AuditEvent] = []
    if q.count > 0:
        for _id, event in reader.backward(stream_id(q.since) if q.since else "-", "+"):
            if flt.matches(event):
                found.append(event)
                if len(found) >= q.count:
                    break
    else:  # only new events: just find where the stream ends now
        reader.find_newest()
    found.reverse()
    show = Output(out, q.json, spans_days(q.since, found, _now()))
    show.header()
    for event in found:
        show.emit(event)
    show.flush()
    if not q.follow:
        return
    # Go on after the newest entry there was (matching or not); an empty range: from --since
    # (or the stream's start) on, so nothing written meanwhile is missed.
    after = reader.newest or (id_before(q.since) if q.since else "0-0")
    for _id, event in reader.follow(after):
        if flt.matches(event):
            show.emit(event)
            show.flush()


def show_export(reader: StreamReader, q: Query, out: TextIO) -> None:
    flt = q.filter()
    start = stream_id(q.since) if q.since else "-"
    end = stream_id(q.until, end=True) if q.until else "+"
    for _id, event in reader.forward(start, end):
        if flt.matches(event):
            out.write(json_line(event) + "\n")
    out.flush()


def read(show: Callable[[StreamReader, Query, TextIO], None], q: Query) -> None:
    """Run `show` on the stream, turning Redis' failures into one line and the exit code."""
    settings = load_settings(PROG, CommonSettings)
    reader: StreamReader | None = None
    code = 0
    try:
        redis = connect(settings.REDIS_URL)
        try:
            reader = StreamReader(redis, settings.AUDIT_STREAM)
            show(reader, q, sys.stdout)
        finally:
            redis.close()
    except KeyboardInterrupt:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
    except RedisUrlError as exc:
        complain(PROG, str(exc))
        code = 2
    except BrokenPipeError:  # `vagent audit export | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (RedisConnectionError, RedisTimeoutError) as exc:
        complain(PROG, unreachable(settings.REDIS_URL, exc))
        code = 2
    except RedisError as exc:
        complain(PROG, f"Redis refused: {exc} (is AUDIT_STREAM {settings.AUDIT_STREAM!r} a stream?)")
        code = 1
    finally:
        if reader is not None and reader.skipped:
            complain(PROG, skipped(reader.skipped))
    if code:
        raise typer.Exit(code)


# ---- the command line --------------------------------------------------------------------------


def _when(text: str) -> datetime:
    try:
        return parse_when(text, _now())
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise typer.BadParameter(f"{text!r} is not a count (0 or more)")
    return n


User = Annotated[str | None, typer.Option(metavar="USER_ID", help="only this Matrix user id")]
OfDecision = Annotated[Decision | None, typer.Option(help="only this decision")]
OfType = Annotated[AuditEventType | None, typer.Option("--type", help="only this event type")]
Since = Annotated[
    datetime | None,
    typer.Option(
        parser=_when, metavar="WHEN", help="from this time on: 90s, 30m, 1h, 2d, 1w or ISO-8601 (UTC)"
    ),
]


@app.command()
def tail(
    user: User = None,
    decision: OfDecision = None,
    event_type: OfType = None,
    since: Since = None,
    count: Annotated[
        int, typer.Option("--count", "-n", parser=_count, metavar="N", help="how many of the last matching")
    ] = 50,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="then print new events until Ctrl-C")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines (one AuditEvent per line)")] = False,
) -> None:
    """The last matching events, oldest first (a table, or JSON lines)."""
    read(show_tail, Query(user, decision, event_type, since, count=count, follow=follow, json=as_json))


@app.command()
def export(
    ctx: typer.Context,
    user: User = None,
    decision: OfDecision = None,
    event_type: OfType = None,
    since: Since = None,
    until: Annotated[
        datetime | None,
        typer.Option(parser=_when, metavar="WHEN", help="up to this time (same forms as --since)"),
    ] = None,
) -> None:
    """Every matching event as JSON lines, oldest first (for a SIEM)."""
    if until and since and until < since:
        ctx.fail("--until is before --since")
    read(show_export, Query(user, decision, event_type, since, until))
