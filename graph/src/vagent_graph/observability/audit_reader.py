"""Reading the audit trail back: the Redis stream both services append to (docs/audit.md).

Stream ids are the events' arrival times in milliseconds, so a time range is a range of ids:
only that part of the stream is read, in pages. Entries that are not audit events (a stray
XADD, an older format) are skipped and counted, never fatal: the trail must stay readable.

Used by `vagent audit` (tail, export) and by the erasure planning (a user's entries).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from pydantic import ValidationError
from redis import Redis

from vagent_shared.audit import AuditEvent

#: Entries read per XRANGE/XREVRANGE/XREAD round trip.
PAGE = 500
#: A stream id's sequence part is a 64-bit unsigned number.
MAX_SEQ = 2**64 - 1
#: How long one XREAD of a follow blocks (it then asks again).
FOLLOW_BLOCK_MS = 2000

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)

Entry = tuple[str, AuditEvent]


# ---- times and stream ids (pure) ---------------------------------------------------------------


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


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


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


# ---- reading the stream ------------------------------------------------------------------------


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class StreamReader:
    """Pages through one stream; counts entries that are not audit events (`skipped`)."""

    def __init__(self, redis: Redis, stream: str, page: int = PAGE) -> None:
        self.redis, self.stream, self.page = redis, stream, page
        self.skipped = 0
        #: The newest id seen by any read (where a follow goes on from).
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
