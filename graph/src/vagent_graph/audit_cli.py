"""`vagent-audit`: read the audit trail, the Redis stream both services append to (docs/audit.md).

    vagent-audit tail [--user @alice:example.org] [--decision denied] [--type tool_access]
                      [--since 1h] [--count 50] [--follow] [--json]
    vagent-audit export [--since 2d] [--until 2026-11-22T10:00:00Z] [--user ...] [--decision ...]
                        [--type ...]

`tail` prints the last N matching events, oldest first, as a table (or JSON lines with
--json); with --follow it then prints new events as they arrive, until Ctrl-C. `export`
writes every matching event as JSON lines, oldest first, for a SIEM. A JSON line is exactly
`AuditEvent.model_dump_json()`.

--since/--until take a duration back from now (90s, 30m, 1h, 2d, 1w) or an ISO-8601 time
(no zone: UTC). Stream ids are the events' arrival times in milliseconds, so a time range is
a range of ids: only that part of the stream is read, in pages. Times are shown in UTC.

Reads REDIS_URL and AUDIT_STREAM. Entries that are not audit events are skipped and counted
on stderr. Exit codes: 0 done, 1 Redis refused a command, 2 bad usage or Redis unreachable.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO, cast, get_args

from pydantic import ValidationError
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from vagent_shared import redis_connect
from vagent_shared.audit import AuditEvent, AuditEventType, Decision
from vagent_shared.settings import CommonSettings

PROG = "vagent-audit"
#: Entries read per XRANGE/XREVRANGE/XREAD round trip.
PAGE = 500
#: A stream id's sequence part is a 64-bit unsigned number.
MAX_SEQ = 2**64 - 1
#: How long one XREAD of --follow blocks (it then asks again).
FOLLOW_BLOCK_MS = 2000

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
EVENT_TYPES: tuple[str, ...] = get_args(AuditEventType)
DECISIONS: tuple[str, ...] = get_args(Decision)

Entry = tuple[str, AuditEvent]


# ---- pure parts --------------------------------------------------------------------------------


def parse_when(text: str, now: datetime) -> datetime:
    """A duration back from `now` (`90s`, `30m`, `1h`, `2d`, `1w`) or an ISO-8601 time (naive = UTC)."""
    m = _DURATION.match(text)
    if m:
        return now - timedelta(seconds=float(m[1]) * _UNITS[m[2].lower()])
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a duration (90s, 30m, 1h, 2d, 1w) "
            "nor an ISO-8601 time (2026-11-22T10:00:00Z)"
        ) from None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def stream_id(when: datetime, *, end: bool = False) -> str:
    """The stream id of instant `when`: the first id of its millisecond, or with `end` the last."""
    ms = max(int(when.timestamp() * 1000), 0)
    return f"{ms}-{MAX_SEQ}" if end else f"{ms}-0"


def id_before(when: datetime) -> str:
    """The last stream id before `when` (to XREAD what comes from `when` on)."""
    ms = int(when.timestamp() * 1000)
    return f"{ms - 1}-{MAX_SEQ}" if ms > 0 else "0-0"


@dataclass(frozen=True)
class Filter:
    """Which events to show; None matches anything."""

    user: str | None = None
    decision: str | None = None
    event_type: str | None = None

    def matches(self, event: AuditEvent) -> bool:
        return (
            (self.user is None or event.user_id == self.user)
            and (self.decision is None or event.decision == self.decision)
            and (self.event_type is None or event.event_type == self.event_type)
        )


#: (title, width) of the table's columns; the last one is not padded.
COLUMNS: tuple[tuple[str, int], ...] = (
    ("SERVICE", 7),
    ("EVENT", 17),
    ("DECISION", 8),
    ("USER", 28),
    ("RESOURCE", 30),
    ("REASON", 60),
)
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def printable(text: str) -> str:
    """`text` on one line, without control characters (audit data is partly user-controlled:
    no terminal escapes)."""
    return _UNPRINTABLE.sub("?", text)


def cell(text: str, width: int) -> str:
    """`text` printable, cut to `width` with an ellipsis."""
    flat = printable(text)
    return flat if len(flat) <= width else flat[: width - 1] + "…"


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


# ---- reading the stream ------------------------------------------------------------------------


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class StreamReader:
    """Pages through one stream; counts entries that are not audit events (`skipped`)."""

    def __init__(self, redis: Redis, stream: str, page: int = PAGE) -> None:
        self.redis, self.stream, self.page = redis, stream, page
        self.skipped = 0
        #: The newest id seen by any read (where --follow goes on from).
        self.newest: str | None = None

    def _parse(self, raw: Any) -> list[Entry]:
        out: list[Entry] = []
        for entry_id, fields in raw or []:
            eid = _text(entry_id)
            try:
                out.append((eid, AuditEvent.from_stream(fields or {})))
            except (ValueError, ValidationError, UnicodeDecodeError):
                self.skipped += 1
        return out

    def _note(self, raw: Any, newest_first: bool) -> None:
        if raw:
            eid = _text(raw[0 if newest_first else -1][0])
            if self.newest is None or _id_key(eid) > _id_key(self.newest):
                self.newest = eid

    def find_newest(self) -> None:
        self._note(cast(list[Any], self.redis.xrevrange(self.stream, "+", "-", count=1)), newest_first=True)

    def backward(self, start: str = "-", end: str = "+") -> Iterator[Entry]:
        """Newest first, from `end` down to `start` (both inclusive)."""
        while True:
            raw = cast(list[Any], self.redis.xrevrange(self.stream, end, start, count=self.page))
            self._note(raw, newest_first=True)
            yield from self._parse(raw)
            if len(raw) < self.page:
                return
            end = "(" + _text(raw[-1][0])

    def forward(self, start: str = "-", end: str = "+") -> Iterator[Entry]:
        """Oldest first, from `start` up to `end` (both inclusive)."""
        while True:
            raw = cast(list[Any], self.redis.xrange(self.stream, start, end, count=self.page))
            self._note(raw, newest_first=False)
            yield from self._parse(raw)
            if len(raw) < self.page:
                return
            start = "(" + _text(raw[-1][0])

    def follow(self, after: str, block_ms: int = FOLLOW_BLOCK_MS) -> Iterator[Entry]:
        """What is appended after id `after`, forever (XREAD BLOCK)."""
        last = after
        while True:
            reply = cast(list[Any], self.redis.xread({self.stream: last}, count=self.page, block=block_ms))
            for _stream, raw in reply or []:
                if raw:
                    last = _text(raw[-1][0])
                    yield from self._parse(raw)


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


# ---- commands ----------------------------------------------------------------------------------


def _now() -> datetime:
    return datetime.now(UTC)


def _when_arg(text: str) -> datetime:
    try:
        return parse_when(text, _now())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _count_arg(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count (0 or more)")
    return n


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Read vagent's audit trail (the Redis stream AUDIT_STREAM at REDIS_URL).",
    )
    sub = p.add_subparsers(dest="command", required=True)

    def filters(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--user", help="only this Matrix user id")
        sp.add_argument("--decision", choices=DECISIONS, help="only this decision")
        sp.add_argument("--type", dest="event_type", choices=EVENT_TYPES, help="only this event type")
        sp.add_argument(
            "--since", type=_when_arg, help="from this time on: 90s, 30m, 1h, 2d, 1w or ISO-8601 (UTC)"
        )

    tail = sub.add_parser("tail", help="the last matching events (a table, or JSON lines)")
    filters(tail)
    tail.add_argument(
        "--count", "-n", type=_count_arg, default=50, help="how many of the last matching (default 50)"
    )
    tail.add_argument("--follow", "-f", action="store_true", help="then print new events until Ctrl-C")
    tail.add_argument("--json", action="store_true", help="JSON lines (one AuditEvent per line)")
    export = sub.add_parser("export", help="every matching event as JSON lines, oldest first")
    filters(export)
    export.add_argument("--until", type=_when_arg, help="up to this time (same forms as --since)")
    return p


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


def cmd_tail(reader: StreamReader, args: argparse.Namespace, out: TextIO) -> None:
    flt = Filter(args.user, args.decision, args.event_type)
    found: list[AuditEvent] = []
    if args.count > 0:
        for _id, event in reader.backward(stream_id(args.since) if args.since else "-", "+"):
            if flt.matches(event):
                found.append(event)
                if len(found) >= args.count:
                    break
    else:  # only new events: just find where the stream ends now
        reader.find_newest()
    found.reverse()
    show = Output(out, args.json, spans_days(args.since, found, _now()))
    show.header()
    for event in found:
        show.emit(event)
    show.flush()
    if not args.follow:
        return
    # Go on after the newest entry there was (matching or not); an empty range: from --since
    # (or the stream's start) on, so nothing written meanwhile is missed.
    after = reader.newest or (id_before(args.since) if args.since else "0-0")
    for _id, event in reader.follow(after):
        if flt.matches(event):
            show.emit(event)
            show.flush()


def cmd_export(reader: StreamReader, args: argparse.Namespace, out: TextIO) -> None:
    flt = Filter(args.user, args.decision, args.event_type)
    start = stream_id(args.since) if args.since else "-"
    end = stream_id(args.until, end=True) if args.until else "+"
    for _id, event in reader.forward(start, end):
        if flt.matches(event):
            out.write(json_line(event) + "\n")
    out.flush()


COMMANDS: dict[str, Callable[[StreamReader, argparse.Namespace, TextIO], None]] = {
    "tail": cmd_tail,
    "export": cmd_export,
}


# ---- the process -------------------------------------------------------------------------------


def skipped_message(prog: str, n: int) -> str:
    return f"{prog}: skipped {n} stream {'entry' if n == 1 else 'entries'} (not an audit event)"


def where(url: str) -> str:
    """The Redis address without credentials, for messages."""
    return redis_connect.where(url)


def connect(url: str) -> Redis:
    """A client that has answered a PING; raises RedisError when Redis cannot be reached
    (RedisUrlError when REDIS_URL cannot be read)."""
    redis = redis_connect.connect_sync(
        url, socket_timeout=FOLLOW_BLOCK_MS / 1000 + 10, socket_connect_timeout=5
    )
    try:
        redis.ping()
    except RedisError:
        redis.close()
        raise
    return redis


def load_settings(prog: str) -> CommonSettings:
    try:
        return CommonSettings()
    except ValidationError as exc:
        first = exc.errors()[0]
        print(f"{prog}: invalid setting {first['loc'][0]}: {first['msg']}", file=sys.stderr)
        raise SystemExit(2) from None


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if getattr(args, "until", None) and args.since and args.until < args.since:
        parser().error("--until is before --since")
    settings = load_settings(PROG)
    reader: StreamReader | None = None
    try:
        redis = connect(settings.REDIS_URL)
        try:
            reader = StreamReader(redis, settings.AUDIT_STREAM)
            COMMANDS[args.command](reader, args, sys.stdout)
        finally:
            redis.close()
    except KeyboardInterrupt:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
    except redis_connect.RedisUrlError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `vagent-audit export | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (RedisConnectionError, RedisTimeoutError) as exc:
        print(
            f"{PROG}: cannot reach Redis at {where(settings.REDIS_URL)} (REDIS_URL): {type(exc).__name__}",
            file=sys.stderr,
        )
        return 2
    except RedisError as exc:
        print(
            f"{PROG}: Redis refused: {exc} (is AUDIT_STREAM {settings.AUDIT_STREAM!r} a stream?)",
            file=sys.stderr,
        )
        return 1
    finally:
        if reader is not None and reader.skipped:
            print(skipped_message(PROG, reader.skipped), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
