"""Scheduled tasks (docs/schedules.md): the one definition of a job, its schedule, and the
run's identity. Data only here; parsing and next-run arithmetic are `schedule_times`, Redis
is `schedule_store`.

A job is a task its owner asked to run later, once (`at`) or again and again (`every`,
`cron`), in the room (and thread) it was created in. At every run the owner's rights are
checked again (the bot fetches their AcContext fresh), so a job never runs with rights its
owner no longer has. A run is identified by (job id, due time): it is claimed once, across
restarts and replicas.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

#: The tool the model schedules with, and its arguments (exactly one of AT/EVERY/CRON).
SCHEDULE_TOOL: Final = "schedule_task"
#: The line a scheduled run's answer replies to, so the room sees why the agent speaks.
SCHEDULED: Final = "⏰ Scheduled: "
#: The longest task text, in characters.
TASK_MAX_CHARS: Final = 1000
#: Skipped runs in a row after which a job pauses (and its owner is told in a DM).
MAX_SKIPS_IN_A_ROW: Final = 3

#: How a job repeats: once at a time, every fixed interval, or on a cron expression.
ScheduleKind = Literal["at", "every", "cron"]
#: Who made the job: the `!schedule` command or the model's `schedule_task` (confirmed).
JobOrigin = Literal["command", "tool"]
#: How a due run ended (the job's `last_result`, the `schedule_*` audit records and the
#: `vagent_bot_schedule_runs_total{outcome}` metric).
RunOutcome = Literal["ran", "failed", "skipped", "missed"]


class Schedule(BaseModel):
    """When a job runs. Times are timezone-aware; `tz` (an IANA name) is the zone a cron
    expression and wall-clock phrases ("every weekday at 09:00") are read in, so a run
    stays at 09:00 local time across daylight-saving changes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: ScheduleKind
    #: kind "at": the one run's time (aware).
    at: datetime | None = None
    #: kind "every": the interval in seconds, counted from `anchor`.
    every_seconds: int | None = Field(default=None, gt=0)
    #: kind "cron": five fields (minute hour day-of-month month day-of-week), read in `tz`.
    cron: str | None = None
    #: kind "every": the first occurrence (aware); later ones are anchor + n * interval.
    anchor: datetime | None = None
    tz: str = "UTC"
    #: How the user wrote it ("every weekday at 09:00"), for listings and confirmations.
    text: str = ""


class ScheduledJob(BaseModel):
    """One job, as stored (JSON in Redis) and listed. `number` is its owner's stable number
    (`!unschedule 3` always means the same job, whatever was deleted since)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    number: int = Field(ge=1)
    owner: str
    #: The tenant (AcContext domain) the job was made in; runs check the owner's rights there.
    domain: str | None = None
    room_id: str
    #: The thread it was asked in (its root event), None: the room's main timeline.
    thread_root: str | None = None
    task: str = Field(min_length=1, max_length=TASK_MAX_CHARS)
    schedule: Schedule
    origin: JobOrigin = "command"
    created_at: datetime
    #: The next run's due time; None when nothing is due any more (a one-off that ran or
    #: was missed).
    next_due: datetime | None = None
    paused: bool = False
    skips_in_a_row: int = Field(default=0, ge=0)
    last_run_at: datetime | None = None
    last_outcome: RunOutcome | None = None
    #: A short sentence for listings ("skipped: you are no longer in this room"); never a
    #: secret, never the answer's text.
    last_result: str | None = None


class RunClaim(BaseModel):
    """A due run this bot claimed: (job id, due) is its identity. Claimed atomically, so one
    claimant runs it; a claimant that dies before `started` leaves it to be taken over after
    its lease, one that dies after `started` leaves it done (never run twice)."""

    model_config = ConfigDict(frozen=True)

    job_id: str
    due: datetime
    #: Seconds late when claimed (due -> claim), for the lag histogram.
    lag_seconds: float = 0.0
    #: Who holds it (a bot process's id): only the holder may start or finish it.
    claimant: str = ""

    @property
    def run_id(self) -> str:
        return f"{self.job_id}@{int(self.due.timestamp())}"
