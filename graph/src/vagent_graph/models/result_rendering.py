"""Structured tool results as short Markdown, filtered by the dates a question names. Pure.

Why: a newcomer asking "what is on my calendar this week?" should read a short list of this
week's events, not the calendar's JSON; a created event deserves one sentence, a count one
sentence. The offline model (offline_model.py) answers with these; a real model reads the
compact data itself. "Now" is always a parameter, so every answer is testable.

Dates are UTC, the demo calendar's only time zone.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

#: At most this many events, rows or items are listed; the rest are counted.
MAX_ITEMS = 20
#: At most this many columns of a table.
MAX_COLUMNS = 6
#: A cell is cut to this many characters.
MAX_CELL = 80

_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_MONTH = (
    r"(?P<month>jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
_ISO_DAY = re.compile(r"\b(?P<iso>\d{4}-\d{2}-\d{2})\b")
_DAY_MONTH = re.compile(
    rf"\b(?P<day>\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH}\b(?:\s+(?P<year>\d{{4}}))?", re.I
)
_MONTH_DAY = re.compile(
    rf"\b{_MONTH}\s+(?P<day>\d{{1,2}})(?:st|nd|rd|th)?\b(?:,?\s+(?P<year>\d{{4}}))?", re.I
)
_COUNT_LINE = re.compile(r"^records: (?P<n>\d+)$")
_TICKET_CREATED = re.compile(
    r"^Created ticket (?P<id>\S+): (?P<title>.*) \((?P<priority>\w+) priority\)\.$", re.S
)


@dataclass(frozen=True)
class Period:
    """A span of time a question names: [start, end) in UTC, and how to say it."""

    start: datetime
    end: datetime
    #: "today", "this week", "on Tue 1 Dec": fits after "Nothing on your calendar".
    label: str

    def args(self) -> dict[str, str]:
        """The span as a calendar's list_events arguments (ISO-8601 with the offset)."""
        return {
            "start": self.start.isoformat(timespec="seconds"),
            "end": self.end.isoformat(timespec="seconds"),
        }


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time(), UTC)


def day_label(day: date, now: datetime) -> str:
    """`Tue 1 Dec`, with the year when it is not this year's."""
    text = f"{day.strftime('%a')} {day.day} {day.strftime('%b')}"
    return text if day.year == _utc(now).year else f"{text} {day.year}"


def _days(first: date, count: int, label: str) -> Period:
    return Period(_midnight(first), _midnight(first + timedelta(days=count)), label)


def _named_day(text: str, now: datetime) -> date | None:
    """A date the text names: `2026-12-01`, `1 Dec [2026]`, `December 1st[, 2026]`."""
    if m := _ISO_DAY.search(text):
        try:
            return date.fromisoformat(m.group("iso"))
        except ValueError:
            return None
    for pattern in (_DAY_MONTH, _MONTH_DAY):
        if m := pattern.search(text):
            month = _MONTHS.index(m.group("month")[:3].lower()) + 1
            year = int(m.group("year") or _utc(now).year)
            try:
                return date(year, month, int(m.group("day")))
            except ValueError:
                return None
    return None


def period_in(text: str, now: datetime) -> Period | None:
    """The span of time `text` names ("today", "tomorrow", "yesterday", "this week", "next
    week", "this month", a date), or None when it names none. Weeks start on Monday."""
    today = _utc(now).date()
    if (day := _named_day(text, now)) is not None:
        return _days(day, 1, f"on {day_label(day, now)}")
    lower = text.lower()
    monday = today - timedelta(days=today.weekday())
    relative: list[tuple[str, Period]] = [
        (r"\btoday\b|\btonight\b", _days(today, 1, "today")),
        (r"\btomorrow\b", _days(today + timedelta(days=1), 1, "tomorrow")),
        (r"\byesterday\b", _days(today - timedelta(days=1), 1, "yesterday")),
        (r"\bnext week\b", _days(monday + timedelta(days=7), 7, "next week")),
        (r"\blast week\b", _days(monday - timedelta(days=7), 7, "last week")),
        (r"\bthis week\b|\bthe week\b", _days(monday, 7, "this week")),
    ]
    for pattern, period in relative:
        if re.search(pattern, lower):
            return period
    if re.search(r"\bthis month\b", lower):
        first = today.replace(day=1)
        after = (first + timedelta(days=32)).replace(day=1)
        return _days(first, (after - first).days, "this month")
    return None


# --------------------------------------------------------------------------- events


def _when(value: Any) -> datetime | None:
    try:
        return _utc(datetime.fromisoformat(str(value)))
    except ValueError:
        return None


def span(start: datetime, end: datetime, now: datetime) -> str:
    """`Tue 1 Dec 10:00–10:30`, or `Thu 3 Dec 09:00 – Fri 4 Dec 10:00` across days."""
    first = f"{day_label(start.date(), now)} {start:%H:%M}"
    if end.date() == start.date() or (end - start <= timedelta(days=1) and end.time() == time()):
        return f"{first}–{end:%H:%M}"
    return f"{first} – {day_label(end.date(), now)} {end:%H:%M}"


def is_event(value: Any) -> bool:
    return isinstance(value, dict) and {"title", "start", "end"} <= set(value)


def overlaps(event: dict[str, Any], period: Period) -> bool:
    """Does the event overlap the period (half-open, like the calendar's own query)? An event
    whose times do not parse is kept: better shown than silently dropped."""
    start, end = _when(event.get("start")), _when(event.get("end"))
    if start is None or end is None:
        return True
    return start < period.end and end > period.start


def event_line(event: dict[str, Any], now: datetime) -> str:
    """`- Tue 1 Dec 10:00–10:30 Design review (with @bob:localhost)`."""
    start, end = _when(event.get("start")), _when(event.get("end"))
    when = span(start, end, now) if start and end else f"{event.get('start')} – {event.get('end')}"
    attendees = [str(a) for a in event.get("attendees") or []]
    with_whom = f" (with {', '.join(attendees)})" if attendees else ""
    return f"- {when} {_cell(event.get('title'))}{with_whom}"


def render_events(events: list[Any], period: Period | None, now: datetime) -> str:
    """A calendar listing: only the events in `period` (when the question named one), earliest
    first, or a sentence saying there are none."""
    shown = [e for e in events if is_event(e) and (period is None or overlaps(e, period))]
    shown.sort(key=lambda e: _when(e.get("start")) or datetime.max.replace(tzinfo=UTC))
    where = f" {period.label}" if period else ""
    if not shown:
        return f"Nothing on your calendar{where}."
    count = f"{len(shown)} event{'' if len(shown) == 1 else 's'}"
    lines = [f"Your calendar{where} ({count}):"]
    lines += [event_line(e, now) for e in shown[:MAX_ITEMS]]
    if len(shown) > MAX_ITEMS:
        lines.append(f"- … and {len(shown) - MAX_ITEMS} more")
    return "\n".join(lines)


def created_event(event: dict[str, Any], now: datetime) -> str:
    """`Booked 'design review' on Tue 1 Dec 10:00–10:30 with @bob:localhost (E-1008).`"""
    start, end = _when(event.get("start")), _when(event.get("end"))
    when = f" on {span(start, end, now)}" if start and end else ""
    attendees = [str(a) for a in event.get("attendees") or []]
    with_whom = f" with {', '.join(attendees)}" if attendees else ""
    ident = f" ({event['id']})" if event.get("id") else ""
    return f"Booked '{_cell(event.get('title'))}'{when}{with_whom}{ident}."


def free_slot(slot: dict[str, Any], now: datetime) -> str:
    """A find_free_slot answer as a sentence."""
    minutes = slot.get("duration_minutes")
    length = f"{minutes}-minute " if isinstance(minutes, int) else ""
    day = _when(f"{slot.get('date')}T00:00:00")
    on = f" on {day_label(day.date(), now)}" if day else ""
    start, end = _when(slot.get("start")), _when(slot.get("end"))
    if start is None or end is None:
        return f"There is no free {length}slot{on}."
    return f"The first free {length}slot{on} is {start:%H:%M}–{end:%H:%M}."


# --------------------------------------------------------------------------- any data


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split()).replace("|", "/")
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def _more(total: int) -> list[str]:
    return [f"(… and {total - MAX_ITEMS} more)"] if total > MAX_ITEMS else []


def table(rows: list[dict[str, Any]]) -> str:
    """Rows of the same kind as a Markdown table (the first MAX_COLUMNS keys seen)."""
    columns: list[str] = []
    for row in rows[:MAX_ITEMS]:
        columns += [k for k in row if k not in columns]
    columns = columns[:MAX_COLUMNS]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c, "")) for c in columns) + " |" for r in rows[:MAX_ITEMS]]
    return "\n".join(lines + _more(len(rows)))


def render_data(value: Any) -> str:
    """Any JSON value as short Markdown: a list of objects as a table, an object as a list of
    `key: value` lines, a list as a list."""
    if isinstance(value, list):
        if not value:
            return "Nothing was found."
        if all(isinstance(v, dict) for v in value):
            return table(value)
        return "\n".join([f"- {_cell(v)}" for v in value[:MAX_ITEMS]] + _more(len(value)))
    if isinstance(value, dict):
        lists = [v for v in value.values() if isinstance(v, list)]
        if len(value) == 1 and lists:
            return render_data(lists[0])
        if not value:
            return "Nothing was returned."
        return "\n".join(f"- {k}: {_cell(v)}" for k, v in list(value.items())[:MAX_ITEMS])
    return _cell(value)


def _json_in(text: str) -> tuple[Any, str] | None:
    """The JSON object or array a result holds (all of it, or its last line), and the text
    around it."""
    stripped = text.strip()
    candidates = [(stripped, "")]
    head, _, last = stripped.rpartition("\n")
    if head:
        candidates.append((last.strip(), head.strip()))
    for candidate, rest in candidates:
        if candidate[:1] in ("{", "["):
            try:
                return json.loads(candidate), rest
            except ValueError:
                continue
    return None


def render_result(tool: str, text: str, question: str, now: datetime) -> str:
    """What the offline model says about a tool's result: structured data as short Markdown
    (events filtered by the dates the question names), a count or a created thing as one
    sentence, anything else as it is."""
    if m := _COUNT_LINE.match(text.strip()):
        n = int(m.group("n"))
        return "There is 1 matching record." if n == 1 else f"There are {n} matching records."
    if m := _TICKET_CREATED.match(text.strip()):
        return f"Opened ticket {m.group('id')} '{m.group('title')}' ({m.group('priority')} priority)."
    found = _json_in(text)
    if found is None:
        return text
    value, rest = found
    if isinstance(value, dict) and isinstance(value.get("events"), list):
        rendered = render_events(value["events"], period_in(question, now), now)
    elif is_event(value) and "duration_minutes" not in value:
        rendered = created_event(value, now) if "create" in tool or "book" in tool else event_line(value, now)
    elif isinstance(value, dict) and "duration_minutes" in value and "date" in value:
        rendered = free_slot(value, now)
    else:
        rendered = render_data(value)
    return f"{rest}\n{rendered}" if rest and not _json_in(rest) else rendered
