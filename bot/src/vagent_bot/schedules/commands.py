"""The schedule commands (docs/schedules.md): `!schedule WHEN: TASK`, `!schedules`,
`!unschedule N`, `!schedule pause N`, `!schedule resume N`, `!timezone [ZONE]`.

The bot answers them itself (they never reach the model), after the same access check as any
message, each answer a reply to the command. Two layers: `parse_schedule_command_words` turns
the command word and its rest into a small command type, and the `*_text` functions word the
answers (both pure); `ScheduleCommands` is the thin I/O around them (the `ScheduleStore`, the
audit trail). Every change goes through the store's owner-scoped calls, so nobody sees, pauses
or deletes another person's job, nor learns that someone else has a job with that number.

`schedule_times` (dateparser: ~0.3 s to import) is imported here at module level, so the bot
pays for it once at start (event_router imports this module), never per message.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Literal

import structlog
from redis.exceptions import RedisError

from vagent_bot.conversation.commands import Command
from vagent_shared import schedule_times
from vagent_shared.audit import Decision
from vagent_shared.audit_trail import AuditTrail
from vagent_shared.schedule_store import LimitReached, ScheduleStore
from vagent_shared.schedules import ScheduledJob
from vagent_shared.settings import CommonSettings

log = structlog.get_logger(__name__)

#: The command words this module answers (vagent_bot.conversation.commands parses them).
SCHEDULE_COMMAND_NAMES: Final = frozenset({"schedule", "schedules", "unschedule", "timezone"})
#: How much of a task a listing line shows.
TASK_SHOWN_CHARS: Final = 80

USAGE_SCHEDULE: Final = (
    "Write `!schedule WHEN: TASK`, e.g. `!schedule in 20m: remind me to call Bob` or "
    "`!schedule every weekday at 09:00: list my open tickets`; `!schedules` lists your tasks."
)
USAGE_UNSCHEDULE: Final = "Write `!unschedule N`, with N the task's number from `!schedules`."
USAGE_PAUSE: Final = "Write `!schedule pause N`, with N the task's number from `!schedules`."
USAGE_RESUME: Final = "Write `!schedule resume N`, with N the task's number from `!schedules`."
NOTHING_SCHEDULED: Final = (
    "You have no scheduled tasks{where}. Create one with `!schedule WHEN: TASK`, "
    "e.g. `!schedule every weekday at 09:00: list my open tickets`."
)
STORE_DOWN: Final = "⚠️ I can't reach my list of scheduled tasks right now; please try again in a moment."

#: The audit records these commands write (vagent_shared.audit).
ScheduleAuditType = Literal["schedule_created", "schedule_paused", "schedule_deleted"]

_NUMBER = re.compile(r"#?(\d{1,9})\.?")


# ---- the command words (pure) ---------------------------------------------------------------


@dataclass(frozen=True)
class CreateJob:
    """`!schedule WHEN: TASK`; `text` is everything after `!schedule` (parsed with the user's
    zone by `schedule_times.parse_schedule_command`)."""

    text: str


@dataclass(frozen=True)
class ListJobs:
    """`!schedules`: the asker's jobs in this room (all of them in a DM)."""


@dataclass(frozen=True)
class DeleteJob:
    """`!unschedule N`."""

    number: int


@dataclass(frozen=True)
class PauseJob:
    """`!schedule pause N`."""

    number: int


@dataclass(frozen=True)
class ResumeJob:
    """`!schedule resume N`."""

    number: int


@dataclass(frozen=True)
class ShowTimezone:
    """`!timezone` alone: which zone the user's times are in."""


@dataclass(frozen=True)
class SetTimezone:
    """`!timezone Europe/Oslo` (checked against zoneinfo when answered)."""

    name: str


@dataclass(frozen=True)
class Usage:
    """A malformed schedule command: answered with how to write it, nothing changes."""

    message: str


ScheduleCommand = CreateJob | ListJobs | DeleteJob | PauseJob | ResumeJob | ShowTimezone | SetTimezone | Usage


def _number(text: str) -> int | None:
    """`3`, `#3` or `3.` (as a listing shows it) -> 3; anything else (0 too) -> None."""
    m = _NUMBER.fullmatch(text.strip())
    return int(m.group(1)) if m and int(m.group(1)) >= 1 else None


def parse_schedule_command_words(command: Command) -> ScheduleCommand | None:
    """A parsed `!word ...` as a schedule command; None when the word is none of them (then it
    is another command). `!schedule pause|resume` followed by anything but a number is a usage
    answer, not a task: "pause 2" is never scheduled."""
    args = command.args.strip()
    if command.name == "schedules":
        return ListJobs()
    if command.name == "timezone":
        return SetTimezone(args) if args else ShowTimezone()
    if command.name == "unschedule":
        number = _number(args)
        return DeleteJob(number) if number is not None else Usage(USAGE_UNSCHEDULE)
    if command.name != "schedule":
        return None
    if not args:
        return Usage(USAGE_SCHEDULE)
    word, _, rest = args.partition(" ")
    verb = word.lower()
    if verb in ("pause", "resume") and ":" not in args:
        number = _number(rest)
        if number is None:
            return Usage(USAGE_PAUSE if verb == "pause" else USAGE_RESUME)
        return PauseJob(number) if verb == "pause" else ResumeJob(number)
    if verb in ("list", "ls") and not rest.strip():
        return ListJobs()
    return CreateJob(args)


# ---- the answers' words (pure) --------------------------------------------------------------


def quoted(task: str, limit: int = TASK_SHOWN_CHARS) -> str:
    """A task as listings and answers show it: on one line, in quotes, cut at `limit`."""
    flat = " ".join(task.split())
    return f"“{flat if len(flat) <= limit else flat[: limit - 1].rstrip() + '…'}”"


def created_text(job: ScheduledJob, tz: str) -> str:
    """`!schedule` done: the job's number, its schedule and its next run in the user's zone."""
    how = "once" if job.schedule.kind == "at" else schedule_times.describe(job.schedule)
    next_run = schedule_times.when_text(job.next_due, tz) if job.next_due else "none"
    return f"⏰ Scheduled task {job.number}: {quoted(job.task)}, {how} — next run {next_run}."


def limit_text(refused: LimitReached) -> str:
    """`!schedule` refused by SCHEDULE_MAX_PER_USER: the limit named, and the way out."""
    if refused.limit <= 0:
        return "Scheduled tasks are turned off here (the most allowed is 0)."
    if refused.live == refused.limit:
        return f"You have {refused.limit} scheduled tasks, the most allowed; remove one with `!unschedule N`."
    return (
        f"You have {refused.live} scheduled tasks and the most allowed is {refused.limit}; "
        "remove one with `!unschedule N`."
    )


def next_run_text(job: ScheduledJob, tz: str) -> str:
    """A listing's "next run": a time in the user's zone, or paused / missed / done."""
    if job.paused:
        return "paused"
    if job.next_due is None:
        return "missed" if job.last_outcome == "missed" else "done"
    return schedule_times.when_text(job.next_due, tz)


def last_result_text(job: ScheduledJob) -> str:
    if job.last_result:
        return job.last_result
    return job.last_outcome or "not run yet"


def job_line(job: ScheduledJob, tz: str) -> str:
    """One listing line: `1. “task” — schedule — next run … — last: …`."""
    return (
        f"{job.number}. {quoted(job.task)} — {schedule_times.describe(job.schedule)} — "
        f"next run: {next_run_text(job, tz)} — last: {last_result_text(job)}"
    )


def list_text(jobs: list[ScheduledJob], tz: str, *, is_dm: bool) -> str:
    """`!schedules`: one job a line, by number; none -> how to create one."""
    if not jobs:
        return NOTHING_SCHEDULED.format(where="" if is_dm else " in this room")
    where = "" if is_dm else " in this room"
    head = f"⏰ Your scheduled tasks{where} (times in {tz}):"
    return "\n".join([head, "", *(job_line(j, tz) for j in jobs)])


def no_such_job(number: int) -> str:
    """The same sentence whether nobody or somebody else has a job with that number."""
    return f"You have no scheduled task {number}."


def unknown_zone_text(name: str) -> str:
    return f"“{name[:64]}” is not a time zone I know; give an IANA name, e.g. `!timezone Europe/Oslo`."


# ---- answering (thin I/O) -------------------------------------------------------------------


class ScheduleCommands:
    """Answers one schedule command of `user` in `room_id`: the reply's text. The caller has
    already checked the user's access (a denied user gets silence, as for any message)."""

    def __init__(
        self,
        settings: CommonSettings,
        store: ScheduleStore,
        *,
        audit: AuditTrail | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.settings, self.store, self.audit, self.clock = settings, store, audit, clock

    async def answer(
        self,
        command: ScheduleCommand,
        *,
        user: str,
        room_id: str,
        thread_root: str | None,
        is_dm: bool,
        domain: str | None,
    ) -> str:
        """The reply to `command`; a Redis failure is one sentence (nothing half-done: each of
        the store's writes is atomic)."""
        try:
            return await self._answer(
                command, user=user, room_id=room_id, thread_root=thread_root, is_dm=is_dm, domain=domain
            )
        except RedisError as exc:
            log.warning("schedule_command_failed", error_type=type(exc).__name__)
            return STORE_DOWN

    async def _answer(
        self,
        command: ScheduleCommand,
        *,
        user: str,
        room_id: str,
        thread_root: str | None,
        is_dm: bool,
        domain: str | None,
    ) -> str:
        if isinstance(command, Usage):
            return command.message
        if isinstance(command, ShowTimezone):
            tz = await self._zone(user)
            return (
                f"🕘 Your time zone is {tz}; times you give and I show are in it. "
                "Change it with e.g. `!timezone Europe/Oslo`."
            )
        if isinstance(command, SetTimezone):
            canonical = schedule_times.valid_timezone(command.name)
            if canonical is None:
                return unknown_zone_text(command.name)
            await self.store.set_timezone(user, canonical)
            now = schedule_times.when_text(self.clock(), canonical)
            return f"🕘 Your time zone is now {canonical} (it is {now} there)."
        if isinstance(command, CreateJob):
            return await self._create(command, user, room_id, thread_root, domain)
        if isinstance(command, ListJobs):
            tz = await self._zone(user)
            jobs = await (self.store.of_user(user) if is_dm else self.store.in_room(user, room_id))
            return list_text(jobs, tz, is_dm=is_dm)
        if isinstance(command, DeleteJob):
            deleted = await self.store.delete(user, command.number)
            if deleted is None:
                return no_such_job(command.number)
            self._audit("schedule_deleted", deleted, domain, "done", "deleted by its owner")
            return f"🗑️ Deleted scheduled task {deleted.number}: {quoted(deleted.task)}."
        if isinstance(command, PauseJob):
            return await self._pause(command.number, user, domain)
        return await self._resume(command.number, user)

    async def _zone(self, user: str) -> str:
        """The user's zone; one that no longer loads (tzdata changed) falls back to the default."""
        tz = await self.store.timezone_of(user, self.settings.SCHEDULE_DEFAULT_TZ)
        return (
            schedule_times.valid_timezone(tz)
            or schedule_times.valid_timezone(self.settings.SCHEDULE_DEFAULT_TZ)
            or "UTC"
        )

    async def _create(
        self, command: CreateJob, user: str, room_id: str, thread_root: str | None, domain: str | None
    ) -> str:
        tz = await self._zone(user)
        now = self.clock()
        parsed = schedule_times.parse_schedule_command(
            command.text, now, tz, min_interval_seconds=self.settings.SCHEDULE_MIN_INTERVAL_SECONDS
        )
        if isinstance(parsed, schedule_times.ScheduleRefusal):
            log.info("schedule_refused", code=parsed.code)
            return parsed.message
        made = await self.store.create(
            owner=user,
            room_id=room_id,
            thread_root=thread_root,
            task=parsed.task,
            schedule=parsed.schedule,
            next_due=parsed.first_run,
            max_per_user=self.settings.SCHEDULE_MAX_PER_USER,
            now=now,
            domain=domain,
            origin="command",
        )
        if isinstance(made, LimitReached):
            return limit_text(made)
        self._audit("schedule_created", made, domain, "done", "", task=made.task)
        return created_text(made, tz)

    async def _pause(self, number: int, user: str, domain: str | None) -> str:
        before = await self.store.by_number(user, number)
        if before is None:
            return no_such_job(number)
        if before.paused:
            return f"Task {number} is already paused; `!schedule resume {number}` resumes it."
        if before.next_due is None:
            return f"Task {number} has nothing left to run ({next_run_text(before, 'UTC')})."
        after = await self.store.pause(user, number)
        if after is None:  # deleted meanwhile
            return no_such_job(number)
        if not after.paused:
            return f"Task {number} has nothing left to run ({next_run_text(after, 'UTC')})."
        self._audit("schedule_paused", after, domain, "done", "paused by its owner")
        return f"⏸️ Paused task {number}: {quoted(after.task)}. `!schedule resume {number}` resumes it."

    async def _resume(self, number: int, user: str) -> str:
        job = await self.store.by_number(user, number)
        if job is None:
            return no_such_job(number)
        if not job.paused:
            return f"Task {number} is not paused."
        tz = await self._zone(user)
        following = schedule_times.next_due(job.schedule, self.clock())
        if following is None:
            was = schedule_times.when_text(job.schedule.at, tz) if job.schedule.at else "once"
            return (
                f"Task {number} was due once, {was}, and that time has passed, so it cannot be "
                "resumed; schedule it again with `!schedule`."
            )
        resumed = await self.store.resume(user, number, following)
        if resumed is None:
            return no_such_job(number)
        when = schedule_times.when_text(resumed.next_due, tz) if resumed.next_due else "none"
        return f"▶️ Resumed task {number}: {quoted(resumed.task)} — next run {when}."

    def _audit(
        self,
        event_type: ScheduleAuditType,
        job: ScheduledJob,
        domain: str | None,
        decision: Decision,
        reason: str,
        *,
        task: str | None = None,
    ) -> None:
        """One audit record: job id, number, kind (the task's text only with AUDIT_INCLUDE_CONTENT,
        through the trail's content scrubbing)."""
        if self.audit is None:
            return
        self.audit.record(
            event_type,
            user_id=job.owner,
            domain=domain,
            resource=f"schedule:{job.id}",
            decision=decision,
            reason=reason,
            metadata={
                "job_id": job.id,
                "number": job.number,
                "kind": job.schedule.kind,
                "origin": job.origin,
                "room_id": job.room_id,
            },
            arguments={"text": task} if task is not None else None,
        )
