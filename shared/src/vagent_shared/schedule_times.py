"""When scheduled jobs run (docs/schedules.md): parsing every `!schedule` form and the
model's `schedule_task` arguments into a `Schedule`, next-run arithmetic, the missed-run
policy, the limits, and the human text of all of it.

Pure: no Redis, no Matrix, no clock. `now` is always an argument, so the bot, the graph and
the tests get the same answer for the same inputs. The calendar is the libraries' job:
croniter (cron expressions, read in the user's zone, so a 09:00 run stays at 09:00 local
time across daylight-saving changes), dateparser (one-off phrases) and zoneinfo (zones,
with the tzdata package where the OS has none).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache
from typing import Final, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

import dateparser
from croniter import CroniterBadDateError, croniter

from vagent_shared.schedules import TASK_MAX_CHARS, Schedule

#: A one-off must be at least this far ahead (seconds): less is a typo, not a plan.
MIN_LEAD_SECONDS: Final = 10
#: ... and at most this far ahead.
MAX_AHEAD: Final = timedelta(days=366)
#: How many upcoming occurrences (at most; and at most a year of them) of a cron expression
#: are checked against the minimum interval: the closest two of any expression are within
#: a year (daily patterns, month ends, the year's end, daylight-saving nights).
CRON_GAP_SAMPLES: Final = 400

#: Why a schedule was refused (for the bot's metrics and tests; users read `message`).
RefusalCode = Literal[
    "no_task",
    "task_too_long",
    "unknown_when",
    "bad_timezone",
    "bad_cron",
    "in_past",
    "too_soon",
    "too_far",
    "too_often",
    "tool_arguments",
]

#: What the user is told when a WHEN is not understood: the forms that work, briefly.
FORMS_HELP: Final = (
    "try `in 20m`, `at 2026-12-01 14:00`, `at 14:00`, `tomorrow at 9am`, `every 2h`, "
    "`every day at 08:30`, `every weekday at 09:00`, `every monday at 10:00` "
    "or `cron 0 9 * * 1-5`"
)

_CRON_FIELDS: Final = ("minute", "hour", "day of month", "month", "day of week")
_WEEKDAYS: Final = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS: Final = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")

_UNIT_SECONDS: Final[dict[str, int]] = {
    "s": 1,
    "sec": 1,
    "secs": 1,
    "second": 1,
    "seconds": 1,
    "m": 60,
    "min": 60,
    "mins": 60,
    "minute": 60,
    "minutes": 60,
    "h": 3600,
    "hr": 3600,
    "hrs": 3600,
    "hour": 3600,
    "hours": 3600,
    "d": 86400,
    "day": 86400,
    "days": 86400,
    "w": 604800,
    "week": 604800,
    "weeks": 604800,
}
_UNIT: Final = "|".join(sorted(_UNIT_SECONDS, key=len, reverse=True))
#: "90s", "1h30m", "1 hour 30 minutes", "2 h, 5 min" (each part a number and a unit).
_DURATION_RE: Final = re.compile(
    rf"^(?:\s*(\d{{1,7}})\s*({_UNIT})(?![a-z])\s*(?:,|and)?)+\s*$", re.IGNORECASE
)
_DURATION_PART_RE: Final = re.compile(rf"(\d{{1,7}})\s*({_UNIT})(?![a-z])", re.IGNORECASE)
#: "every hour", "every day", "every week" (no number: one of the unit).
_BARE_UNIT_RE: Final = re.compile(r"^(second|minute|hour|day|week)$", re.IGNORECASE)

#: A time of day: "9", "09:00", "9:30pm", "9 am", "21.15", "noon", "midnight".
_TIME_RE: Final = re.compile(
    r"^(?:(?P<h>\d{1,2})(?:[:.](?P<m>\d{2}))?\s*(?P<ampm>am|pm|a\.m\.|p\.m\.)?|(?P<word>noon|midnight))$",
    re.IGNORECASE,
)
#: "... at 9am" / "... 09:00": a trailing time of day after a date phrase.
_TRAILING_TIME_RE: Final = re.compile(
    r"^(?P<rest>.*?)\s+(?P<at>at\s+)?(?P<time>\d{1,2}(?:[:.]\d{2})?\s*(?:am|pm|a\.m\.|p\.m\.)?|noon|midnight)$",
    re.IGNORECASE,
)

_DAY_NAMES: Final[dict[str, int]] = {
    # cron's day-of-week numbers (0 = Sunday)
    "sunday": 0,
    "sun": 0,
    "monday": 1,
    "mon": 1,
    "tuesday": 2,
    "tue": 2,
    "tues": 2,
    "wednesday": 3,
    "wed": 3,
    "thursday": 4,
    "thu": 4,
    "thur": 4,
    "thurs": 4,
    "friday": 5,
    "fri": 5,
    "saturday": 6,
    "sat": 6,
}
#: Day sets a wall-clock phrase may name, as cron's day-of-week field.
_DAY_SETS: Final[dict[str, str]] = {
    "day": "*",
    "weekday": "1-5",
    "weekdays": "1-5",
    "workday": "1-5",
    "workdays": "1-5",
    "weekend": "0,6",
    "weekends": "0,6",
    "weekend day": "0,6",
}
_DOW_TEXT: Final[dict[str, str]] = {"*": "day", "1-5": "weekday", "0,6": "weekend day"}
_FULL_DAY: Final = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")

#: A phrase that names its own offset or zone ("...Z", "...+01:00", "... UTC").
_EXPLICIT_ZONE_RE: Final = re.compile(r"(?:\dZ|[+-]\d{2}(?::?\d{2})?|\b(?:UTC|GMT))\s*$", re.IGNORECASE)
#: The end of the WHEN: a colon followed by a space or the end (never the colon in 14:00).
_WHEN_END_RE: Final = re.compile(r":(?=\s|$)")


# ---- results ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParsedSchedule:
    """A schedule the user (or the model) may create: the job's schedule, its task, and its
    first run (aware, UTC), for the bot's answer and the confirmation question."""

    schedule: Schedule
    task: str
    first_run: datetime


@dataclass(frozen=True)
class ScheduleRefusal:
    """Why no job was made: `message` is one sentence the user reads."""

    code: RefusalCode
    message: str


@dataclass(frozen=True)
class MissedDecision:
    """What the scheduler does with a claimed due run (`due_after_missed`): run it now or
    not, whether it counts as missed (the owner is told), and the job's next due time (None:
    nothing is due any more)."""

    run_now: bool
    missed: bool
    next_due: datetime | None


# ---- zones and human text -----------------------------------------------------------------


@lru_cache(maxsize=1)
def _zone_names() -> dict[str, str]:
    """Every IANA zone name, keyed by its lower case (users type "europe/oslo")."""
    return {name.lower(): name for name in available_timezones()} | {"utc": "UTC"}


def valid_timezone(name: str) -> str | None:
    """The canonical IANA name for `name` (any letter case), or None when there is no such
    zone: `!timezone Europe/Oslo` stores only what zoneinfo can load."""
    canonical = _zone_names().get(name.strip().lower())
    if canonical is None:
        return None
    try:
        ZoneInfo(canonical)
    except (ZoneInfoNotFoundError, ValueError):
        return None
    return canonical


def _zone(tz: str) -> ZoneInfo:
    """The zone, or ZoneInfoNotFoundError / ValueError for a name that is none."""
    return ZoneInfo(tz)


def human_interval(seconds: int) -> str:
    """An interval as people say it: "15 minutes", "2 hours", "1 day 2 hours"."""
    if seconds <= 0:
        return "0 seconds"
    parts: list[str] = []
    rest = seconds
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count} {unit}{'' if count == 1 else 's'}")
    return " ".join(parts)


def when_text(dt: datetime, tz: str) -> str:
    """A time in the user's zone, short and unambiguous: "Mon 30 Nov 2026 09:00 CET".
    A zone whose abbreviation is only an offset ("-03") also gets its name."""
    local = dt.astimezone(_zone(tz))
    abbreviation = local.tzname() or tz
    zone = abbreviation if abbreviation[:1] not in "+-" else f"{abbreviation} ({tz})"
    return (
        f"{_WEEKDAYS[local.weekday()]} {local.day} {_MONTHS[local.month - 1]} {local.year} "
        f"{local:%H:%M} {zone}"
    )


def describe(schedule: Schedule) -> str:
    """A schedule for listings and confirmations: "every weekday at 09:00 (Europe/Oslo)",
    "every 2 hours", "once, Tue 1 Dec 2026 14:00 CET", "cron 0 9 * * 1-5 (Europe/Oslo)"."""
    if schedule.kind == "at" and schedule.at is not None:
        return f"once, {when_text(schedule.at, schedule.tz)}"
    if schedule.kind == "every" and schedule.every_seconds is not None:
        return f"every {human_interval(schedule.every_seconds)}"
    if schedule.kind == "cron" and schedule.cron is not None:
        return f"{_cron_text(schedule.cron)} ({schedule.tz})"
    return schedule.text or schedule.kind


def _cron_text(expr: str) -> str:
    """The words for a cron expression a wall-clock phrase made ("every weekday at 09:00"),
    else the expression itself ("cron 0 9 1 * *")."""
    fields = expr.split()
    if (
        len(fields) == 5
        and fields[0].isdigit()
        and fields[1].isdigit()
        and fields[2] == "*"
        and fields[3] == "*"
    ):
        at = f"{int(fields[1]):02d}:{int(fields[0]):02d}"
        dow = fields[4]
        if dow in _DOW_TEXT:
            return f"every {_DOW_TEXT[dow]} at {at}"
        numbers = dow.split(",")
        if all(n.isdigit() and int(n) <= 6 for n in numbers):
            return f"every {', '.join(_FULL_DAY[int(n)] for n in numbers)} at {at}"
    return f"cron {expr}"


# ---- next runs ----------------------------------------------------------------------------


def _aware(dt: datetime, what: str) -> datetime:
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware")
    return dt


def _cron_runs(expr: str, tz: str, after: datetime) -> Iterator[datetime]:
    """The occurrences of `expr` (read in `tz`) strictly after `after`, in UTC, in order.
    Each wall-clock time runs once: in the hour a fall-back change repeats, the second pass
    of a time that already ran (02:30 CEST, then 02:30 CET) is not another run. A time a
    spring-forward change skips runs at the first minute that exists (croniter). Ends
    where croniter finds no further occurrence (e.g. "0 9 30 2 *" has none)."""
    zone = _zone(tz)
    it = croniter(expr, after.astimezone(zone), ret_type=datetime)
    while True:
        try:
            found = it.get_next(datetime).astimezone(zone)
        except CroniterBadDateError:
            return
        if found.fold == 1 and found.replace(fold=0).utcoffset() != found.utcoffset():
            continue  # the repeated hour's second pass: this wall time already ran
        yield found.astimezone(UTC)


def next_due(schedule: Schedule, after: datetime) -> datetime | None:
    """The schedule's first occurrence strictly after `after` (aware, UTC); None when
    there is none (a one-off at or before `after`, a cron that never matches)."""
    after = _aware(after, "after")
    if schedule.kind == "at":
        if schedule.at is None:
            return None
        at = schedule.at.astimezone(UTC)
        return at if at > after else None
    if schedule.kind == "every":
        if schedule.every_seconds is None or schedule.anchor is None:
            return None
        anchor = schedule.anchor.astimezone(UTC)
        if anchor > after:
            return anchor
        step = timedelta(seconds=schedule.every_seconds)
        # the whole steps from the anchor up to `after`, then one more: strictly after
        steps = (after - anchor) // step + 1
        return anchor + steps * step
    if schedule.cron is None:
        return None
    return next(_cron_runs(schedule.cron, schedule.tz, after), None)


def due_after_missed(schedule: Schedule, due: datetime, now: datetime, grace_seconds: int) -> MissedDecision:
    """The missed-run policy, for every claimed due run. A one-off that is late (no bot ran
    at its time) runs if at most `grace_seconds` late, else it is missed (its owner is told).
    A recurring job runs once now however many occurrences passed (never a burst), and its
    next due is its first occurrence after `now`. A run not yet due does not run."""
    due = _aware(due, "due").astimezone(UTC)
    now = _aware(now, "now")
    if now < due:
        return MissedDecision(run_now=False, missed=False, next_due=due)
    if schedule.kind == "at":
        if (now - due).total_seconds() <= grace_seconds:
            return MissedDecision(run_now=True, missed=False, next_due=None)
        return MissedDecision(run_now=False, missed=True, next_due=None)
    return MissedDecision(run_now=True, missed=False, next_due=next_due(schedule, now))


# ---- parsing ------------------------------------------------------------------------------


class _Refused(Exception):
    """Raised inside the parser; turned into a ScheduleRefusal at the public edge."""

    def __init__(self, code: RefusalCode, message: str) -> None:
        super().__init__(message)
        self.refusal = ScheduleRefusal(code, message)


def parse_duration(text: str) -> int | None:
    """Seconds in "90s", "20m", "1h30m", "2 hours", "1 day 2 hours"; None if not one."""
    text = text.strip()
    if _BARE_UNIT_RE.match(text):
        return _UNIT_SECONDS[text.lower()]
    if not _DURATION_RE.match(text):
        return None
    return sum(int(n) * _UNIT_SECONDS[unit.lower()] for n, unit in _DURATION_PART_RE.findall(text))


def _time_of_day(text: str) -> time | None:
    """A time of day ("9", "09:00", "9:30pm", "noon"), or None if `text` is not one."""
    m = _TIME_RE.match(text.strip())
    if m is None:
        return None
    if m.group("word"):
        return time(12) if m.group("word").lower() == "noon" else time(0)
    hour, minute = int(m.group("h")), int(m.group("m") or 0)
    ampm = (m.group("ampm") or "").lower().replace(".", "")
    if ampm:
        if not 1 <= hour <= 12:
            return None
        hour = hour % 12 + (12 if ampm == "pm" else 0)
    if hour > 23 or minute > 59:
        return None
    return time(hour, minute)


def _whole_second(dt: datetime) -> datetime:
    """Rounded up to the whole second (UTC): due times are stored and identified as epoch
    seconds (`RunClaim.run_id`), so a relative time never carries a fraction."""
    whole = dt.astimezone(UTC).replace(microsecond=0)
    return whole if whole == dt else whole + timedelta(seconds=1)


def _local(day: date, at: time, tz: str) -> datetime:
    """A wall-clock time in `tz` as an aware UTC instant. A time skipped by a
    daylight-saving change (02:30 on a spring-forward night) becomes the instant the clock
    would show had it not jumped (03:30); an ambiguous one is its first occurrence."""
    return datetime.combine(day, at, tzinfo=_zone(tz)).astimezone(UTC)


def _check_one_off(at: datetime, now: datetime, tz: str) -> None:
    ahead = (at - now).total_seconds()
    if ahead <= 0:
        raise _Refused("in_past", f"That time ({when_text(at, tz)}) has already passed.")
    if ahead < MIN_LEAD_SECONDS:
        raise _Refused("too_soon", f"A one-off job must be at least {MIN_LEAD_SECONDS} seconds ahead.")
    if at - now > MAX_AHEAD:
        raise _Refused("too_far", "A one-off job can be at most a year ahead.")


def _too_often(min_interval_seconds: int) -> _Refused:
    return _Refused(
        "too_often",
        f"Recurring jobs may run at most once every {human_interval(min_interval_seconds)}.",
    )


def _one_off_phrase(phrase: str, now: datetime, tz: str) -> datetime:
    """An `at` phrase as an instant: a bare time of day is its next occurrence (today or
    tomorrow); anything else is dateparser's, read in `tz`, future preferred."""
    zone = _zone(tz)
    bare = _time_of_day(phrase)
    if bare is not None:
        today = now.astimezone(zone).date()
        candidate = _local(today, bare, tz)
        return candidate if candidate > now else _local(today + timedelta(days=1), bare, tz)
    m = _TRAILING_TIME_RE.match(phrase)
    explicit = m is not None and (m.group("at") or not m.group("time").isdigit())
    if m is not None and explicit and (at := _time_of_day(m.group("time"))) is not None:
        # dateparser reads "tomorrow at 9" as "tomorrow, this time"; give it "tomorrow 09:00"
        # (a bare number is a time only after "at": "december 9" is a date)
        phrase = f"{m.group('rest')} {at:%H:%M}"
    parsed = dateparser.parse(
        phrase,
        languages=["en"],
        settings={
            "PREFER_DATES_FROM": "future",
            "TIMEZONE": tz,
            "RETURN_AS_TIMEZONE_AWARE": True,
            "RELATIVE_BASE": now.astimezone(zone).replace(tzinfo=None),
        },
    )
    if parsed is None:
        raise _Refused("unknown_when", f"I don't understand the time “{phrase}”: {FORMS_HELP}.")
    if parsed.tzinfo is None or not _EXPLICIT_ZONE_RE.search(phrase):
        # read in the user's zone by zoneinfo, so an hour a fall-back change repeats means
        # its first pass, as everywhere else here (dateparser's pytz would take the second)
        return _local(parsed.date(), parsed.time(), tz)
    return parsed.astimezone(UTC)


def _check_cron(expr: str, now: datetime, tz: str, min_interval_seconds: int) -> datetime:
    """Refuses a cron expression that is not 5 valid fields, never runs, or runs more often
    than the minimum interval; returns its first run."""
    fields = expr.split()
    if len(fields) != 5:
        raise _Refused(
            "bad_cron",
            f"A cron expression has 5 fields (minute hour day-of-month month day-of-week), "
            f"not {len(fields)}.",
        )
    for i, name in enumerate(_CRON_FIELDS):
        probe = " ".join(field if j == i else "*" for j, field in enumerate(fields))
        if not croniter.is_valid(probe):
            raise _Refused("bad_cron", f"The cron expression's {name} field “{fields[i]}” is not valid.")
    if not croniter.is_valid(expr):
        raise _Refused("bad_cron", f"The cron expression “{expr}” is not valid.")
    runs: list[datetime] = []
    for run in _cron_runs(expr, tz, now):
        if runs and (run - runs[-1]).total_seconds() < min_interval_seconds:
            raise _too_often(min_interval_seconds)
        runs.append(run)
        if len(runs) >= CRON_GAP_SAMPLES or run - now > MAX_AHEAD:
            break
    if not runs:
        raise _Refused("bad_cron", f"The cron expression “{expr}” never runs.")
    return runs[0]


def _wall_clock_cron(phrase: str) -> str | None:
    """ "day at 08:30" / "weekday at 09:00" / "monday and friday at 10" -> a cron expression;
    None if `phrase` (after "every") is no such phrase."""
    m = re.match(r"^(?P<days>.+?)\s+at\s+(?P<time>.+)$", phrase, re.IGNORECASE)
    if m is None:
        return None
    at = _time_of_day(m.group("time"))
    if at is None:
        return None
    days = m.group("days").strip().lower()
    dow = _DAY_SETS.get(days)
    if dow is None:
        names = [d for d in re.split(r"\s*(?:,|\band\b|&|\s)\s*", days) if d]
        numbers: list[int] = []
        for name in names:
            number = _DAY_NAMES.get(name.removesuffix("s") if name not in _DAY_NAMES else name)
            if number is None:
                return None
            numbers.append(number)
        dow = ",".join(str(n) for n in sorted(set(numbers)))
    return f"{at.minute} {at.hour} * * {dow}"


_SYNONYMS: Final[tuple[tuple[re.Pattern[str], str], ...]] = (
    (re.compile(r"^daily\b", re.IGNORECASE), "every day"),
    (re.compile(r"^hourly$", re.IGNORECASE), "every hour"),
    (re.compile(r"^weekly$", re.IGNORECASE), "every week"),
    (re.compile(r"^(weekdays|weekends)\b", re.IGNORECASE), r"every \1"),
)


def _parse_when(when: str, now: datetime, tz: str, min_interval_seconds: int) -> tuple[Schedule, datetime]:
    """One WHEN (without its task) -> the schedule and its first run, or _Refused."""
    phrase = " ".join(when.split())
    for pattern, replacement in _SYNONYMS:
        phrase = pattern.sub(replacement, phrase)
    head, _, rest = phrase.partition(" ")
    head = head.lower()
    if head == "in":
        seconds = parse_duration(rest)
        if seconds is None:
            raise _Refused("unknown_when", f"I don't understand “{when.strip()}”: {FORMS_HELP}.")
        at = _whole_second(now + timedelta(seconds=seconds))
        _check_one_off(at, now, tz)
        return Schedule(kind="at", at=at, tz=tz, text=when.strip()), at
    if head == "every":
        seconds = parse_duration(rest)
        if seconds is not None:
            if seconds < max(1, min_interval_seconds):
                raise _too_often(min_interval_seconds)
            anchor = _whole_second(now + timedelta(seconds=seconds))
            schedule = Schedule(kind="every", every_seconds=seconds, anchor=anchor, tz=tz, text=when.strip())
            return schedule, anchor
        expr = _wall_clock_cron(rest)
        if expr is None:
            raise _Refused("unknown_when", f"I don't understand “{when.strip()}”: {FORMS_HELP}.")
        first = _check_cron(expr, now, tz, min_interval_seconds)
        return Schedule(kind="cron", cron=expr, tz=tz, text=when.strip()), first
    if head == "cron":
        expr = " ".join(rest.split())
        first = _check_cron(expr, now, tz, min_interval_seconds)
        return Schedule(kind="cron", cron=expr, tz=tz, text=when.strip()), first
    one_off = rest if head == "at" else phrase
    if not one_off:
        raise _Refused("unknown_when", f"I don't understand “{when.strip()}”: {FORMS_HELP}.")
    at = _one_off_phrase(one_off, now, tz)
    _check_one_off(at, now, tz)
    return Schedule(kind="at", at=at, tz=tz, text=when.strip()), at


def _check_task(task: str) -> str:
    task = task.strip()
    if not task:
        raise _Refused("no_task", "Say what to do after the time, e.g. `!schedule in 20m: call Bob`.")
    if len(task) > TASK_MAX_CHARS:
        raise _Refused("task_too_long", f"A scheduled task can be at most {TASK_MAX_CHARS} characters long.")
    return task


def _check_setup(now: datetime, tz: str) -> str:
    """Checks the caller's arguments; returns the zone's canonical name."""
    _aware(now, "now")
    canonical = valid_timezone(tz)
    if canonical is None:
        raise _Refused("bad_timezone", f"“{tz}” is not a time zone; set yours with `!timezone Europe/Oslo`.")
    return canonical


def parse_schedule_command(
    text: str, now: datetime, tz: str, *, min_interval_seconds: int
) -> ParsedSchedule | ScheduleRefusal:
    """The text after `!schedule `, `WHEN: TASK`, as a schedule to create or one sentence
    saying why not. WHEN ends at the first colon followed by a space (or the end) that ends a
    WHEN this understands: "at 2026-12-01 14:00: call Bob" and "cron 0 9 * * 1-5: digest"
    both split after the time. `tz` is the user's zone (wall-clock phrases and cron are read
    in it); `now` must be aware."""
    try:
        tz = _check_setup(now, tz)
        ends = [m.start() for m in _WHEN_END_RE.finditer(text)]
        if not ends or not text[: ends[0]].strip():
            raise _Refused(
                "no_task",
                "Write `!schedule WHEN: TASK`, e.g. `!schedule every weekday at 09:00: my tickets`.",
            )
        first_refusal: _Refused | None = None
        for end in ends:
            when, task = text[:end], text[end + 1 :]
            try:
                schedule, first = _parse_when(when, now, tz, min_interval_seconds)
            except _Refused as refused:
                if refused.refusal.code != "unknown_when":
                    return refused.refusal  # a WHEN understood, but over a limit
                first_refusal = first_refusal or refused
                continue
            return ParsedSchedule(schedule=schedule, task=_check_task(task), first_run=first)
        assert first_refusal is not None
        raise first_refusal
    except _Refused as refused:
        return refused.refusal


def _parse_iso(at: str, tz: str) -> datetime:
    """ISO 8601 ("2026-12-01T14:00:00Z", "...+01:00", or naive: read in `tz`)."""
    try:
        parsed = datetime.fromisoformat(at.strip())
    except ValueError:
        raise _Refused(
            "tool_arguments", f"`at` must be an ISO 8601 time such as 2026-12-01T14:00:00Z, not “{at}”."
        ) from None
    if parsed.tzinfo is None:
        return _local(parsed.date(), parsed.timetz().replace(tzinfo=None), tz)
    return parsed.astimezone(UTC)


def schedule_from_tool(
    task: str,
    at: str | None,
    every: str | None,
    cron: str | None,
    now: datetime,
    tz: str,
    min_interval_seconds: int,
) -> ParsedSchedule | ScheduleRefusal:
    """The model's `schedule_task(task, at | every | cron)` as a schedule to confirm and
    create, or one sentence (for the model and the user) saying why not. Exactly one of
    `at` (ISO 8601), `every` ("2h", "1d", "1h30m") and `cron` (5 fields)."""
    try:
        tz = _check_setup(now, tz)
        given = {k: v.strip() for k, v in (("at", at), ("every", every), ("cron", cron)) if v and v.strip()}
        if len(given) != 1:
            raise _Refused("tool_arguments", "Give exactly one of at, every, cron.")
        checked_task = _check_task(task)
        schedule: Schedule
        if "at" in given:
            when = _parse_iso(given["at"], tz)
            _check_one_off(when, now, tz)
            schedule, first = Schedule(kind="at", at=when, tz=tz, text=f"at {given['at']}"), when
        elif "every" in given:
            seconds = parse_duration(given["every"].removeprefix("every ").strip())
            if seconds is None:
                raise _Refused(
                    "tool_arguments",
                    f"`every` must be an interval such as 30m, 2h or 1d, not “{given['every']}”.",
                )
            if seconds < max(1, min_interval_seconds):
                raise _too_often(min_interval_seconds)
            first = _whole_second(now + timedelta(seconds=seconds))
            schedule = Schedule(
                kind="every", every_seconds=seconds, anchor=first, tz=tz, text=f"every {given['every']}"
            )
        else:
            expr = " ".join(given["cron"].split())
            first = _check_cron(expr, now, tz, min_interval_seconds)
            schedule = Schedule(kind="cron", cron=expr, tz=tz, text=f"cron {expr}")
        return ParsedSchedule(schedule=schedule, task=checked_task, first_run=first)
    except _Refused as refused:
        return refused.refusal


__all__ = [
    "CRON_GAP_SAMPLES",
    "FORMS_HELP",
    "MAX_AHEAD",
    "MIN_LEAD_SECONDS",
    "MissedDecision",
    "ParsedSchedule",
    "RefusalCode",
    "ScheduleRefusal",
    "describe",
    "due_after_missed",
    "human_interval",
    "next_due",
    "parse_duration",
    "parse_schedule_command",
    "schedule_from_tool",
    "valid_timezone",
    "when_text",
]
