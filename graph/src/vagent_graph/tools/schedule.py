"""`schedule_task`: the model schedules a task for the user, once (`at`), every interval
(`every`) or on a cron expression (`cron`) (docs/schedules.md). Granted as
`tool:schedule_task`; ALWAYS confirmed: the question's headline shows the schedule and the
next run in the user's zone, the arguments below it show the task, so "remind me every
morning to ..." never makes a job the user did not see.

The job runs later as a new turn of the user, in the room and thread of this conversation,
with their rights checked again at every run (the bot's scheduler). `prepare` parses the
arguments (a refusal goes back to the model as one sentence, nobody is asked); `run`, after
the "yes", parses them again in the zone that was shown (the next run is counted from now)
and creates the job, so a limit reached while the question waited refuses with its sentence.

`vagent_shared.schedule_times` (dateparser, croniter) costs ~0.3 s to import: it is imported
when the tool is first prepared, never when the graph starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer
from redis.asyncio import Redis
from redis.exceptions import RedisError

from vagent_graph.services.audit import audit
from vagent_graph.tools.base import NothingToDo, Prepared, Tool, ToolContext
from vagent_shared.schedule_store import LimitReached, ScheduleStore
from vagent_shared.schedules import SCHEDULE_TOOL, TASK_MAX_CHARS, Schedule
from vagent_shared.session import SessionId

if TYPE_CHECKING:
    from vagent_shared.schedule_times import ParsedSchedule, ScheduleRefusal
    from vagent_shared.settings import CommonSettings

#: The model's result when the job store does not answer (the user is told; nothing was made).
UNAVAILABLE = "Not scheduled: scheduled tasks are unavailable right now; try again later."


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Scheduling:
    """What `schedule_task` works with: the job store and the limits (SCHEDULE_* settings).
    A service (ToolContext.services), opened once with the graph's Redis."""

    store: ScheduleStore
    default_tz: str = "UTC"
    max_per_user: int = 10
    min_interval_seconds: int = 900
    #: The clock (tests pass their own; the arithmetic itself is pure).
    clock: Callable[[], datetime] = field(default=_now)

    @classmethod
    def from_settings(cls, settings: CommonSettings, redis: Redis) -> Scheduling:
        return cls(
            ScheduleStore(redis),
            default_tz=settings.SCHEDULE_DEFAULT_TZ,
            max_per_user=settings.SCHEDULE_MAX_PER_USER,
            min_interval_seconds=settings.SCHEDULE_MIN_INTERVAL_SECONDS,
        )


class ScheduleTaskArgs(BaseModel):
    task: str = Field(
        min_length=1,
        max_length=TASK_MAX_CHARS,
        description=(
            "What to do at each run, written as the user's own request to you "
            "(e.g. 'List my open tickets', 'Remind me to call Bob')."
        ),
    )
    at: str | None = Field(
        default=None,
        description="Run once at this time, ISO 8601 (e.g. '2026-12-01T14:00:00Z'); without an "
        "offset it is read in the user's time zone.",
    )
    every: str | None = Field(
        default=None, description="Run again and again at this interval, e.g. '2h', '1d', '1h30m'."
    )
    cron: str | None = Field(
        default=None,
        description="Run on this cron expression, 5 fields (minute hour day-of-month month "
        "day-of-week), read in the user's time zone (e.g. '0 9 * * 1-5': weekdays at 09:00).",
    )

    @model_serializer(mode="wrap")
    def _given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The arguments given: the two of at/every/cron left out are not the call's, so the
        confirmation does not list them as `null` (it lists every argument it dumps)."""
        return {k: v for k, v in handler(self).items() if v is not None}


def headline(parsed: ParsedSchedule, tz: str) -> str:
    """The question's headline: the schedule and the next run in the user's zone (the task
    itself is shown as the `task` argument below it, whole)."""
    from vagent_shared.schedule_times import describe, when_text

    return (
        f"Schedule this task {_schedule_words(describe(parsed.schedule))}, "
        f"next run {when_text(parsed.first_run, tz)}"
    )


def _schedule_words(described: str) -> str:
    """`describe`'s "once, Tue 1 Dec 2026 14:00 CET" reads "once on ..." in a sentence."""
    return "once on " + described.removeprefix("once, ") if described.startswith("once, ") else described


def scheduled_text(number: int, task: str, schedule: Schedule, next_due: datetime, tz: str) -> str:
    """What the model reads after the job was made: its number, schedule and next run, and
    how the user lists and removes it."""
    from vagent_shared.schedule_times import describe, when_text

    return (
        f"Scheduled task {number} ({task!r}), {_schedule_words(describe(schedule))}; "
        f"next run {when_text(next_due, tz)}. The user can list it with !schedules and "
        f"remove it with !unschedule {number}."
    )


def limit_text(limit: LimitReached) -> str:
    return (
        f"Not scheduled: the user already has {limit.live} scheduled tasks, the most allowed is "
        f"{limit.limit}; they can remove one with !unschedule N (!schedules lists them)."
    )


def parse_call(
    args: ScheduleTaskArgs, now: datetime, tz: str, min_interval: int
) -> ParsedSchedule | ScheduleRefusal:
    """The call's arguments as a schedule, or the refusal (pure; imports the parser lazily)."""
    from vagent_shared.schedule_times import schedule_from_tool

    return schedule_from_tool(args.task, args.at, args.every, args.cron, now, tz, min_interval)


async def _prepare(args: ScheduleTaskArgs, ctx: ToolContext) -> Prepared | NothingToDo:
    """The question: the schedule and the next run in the user's zone; a call that cannot be
    scheduled is answered at once (the model reads why, nobody is asked)."""
    from vagent_shared.schedule_times import ScheduleRefusal

    scheduling = ctx.services.find(Scheduling)
    if scheduling is None:  # a process started without the job store
        return NothingToDo(UNAVAILABLE)
    try:
        tz = await scheduling.store.timezone_of(ctx.ac.user_id, scheduling.default_tz)
    except RedisError:
        return NothingToDo(UNAVAILABLE)
    parsed = parse_call(args, scheduling.clock(), tz, scheduling.min_interval_seconds)
    if isinstance(parsed, ScheduleRefusal):
        return NothingToDo(f"Not scheduled: {parsed.message}")
    plan: dict[str, Any] = {"tz": tz, "first_run": parsed.first_run.isoformat()}
    return Prepared(action=headline(parsed, tz), plan=plan)


async def _run(args: ScheduleTaskArgs, ctx: ToolContext, _: str | None) -> str:
    """After the "yes": the job, in this conversation's room and thread, first due at the
    next run counted from now in the zone the question showed."""
    from vagent_shared.schedule_times import ScheduleRefusal

    scheduling = ctx.services.get(Scheduling)
    plan = ctx.plan or {}
    tz = str(plan.get("tz") or scheduling.default_tz)
    now = scheduling.clock()
    parsed = parse_call(args, now, tz, scheduling.min_interval_seconds)
    if isinstance(parsed, ScheduleRefusal):  # e.g. the one-off time passed while asked
        return f"Not scheduled: {parsed.message}"
    session = SessionId.parse(ctx.session_id)
    try:
        made = await scheduling.store.create(
            owner=ctx.ac.user_id,
            domain=ctx.ac.active_acl_domain,
            room_id=session.room_id,
            thread_root=session.thread_id,
            task=parsed.task,
            schedule=parsed.schedule,
            next_due=parsed.first_run,
            max_per_user=scheduling.max_per_user,
            now=now,
            origin="tool",
        )
    except RedisError:
        return UNAVAILABLE
    if isinstance(made, LimitReached):
        return limit_text(made)
    assert made.next_due is not None  # a job just made is due
    audit(
        ctx.services,
        "schedule_created",
        ctx.ac,
        ctx.session_id,
        resource=f"schedule:{made.id}",
        decision="done",
        reason="tool",
        metadata={
            "job_id": made.id,
            "number": made.number,
            "kind": made.schedule.kind,
            "origin": made.origin,
            "room_id": made.room_id,
            "next_due": made.next_due.isoformat(),
        },
    )
    return scheduled_text(made.number, made.task, made.schedule, made.next_due, tz)


TOOL = Tool(
    name=SCHEDULE_TOOL,
    description=(
        "Schedule a task to run later as the user's own request, in this conversation: once "
        "(`at`), at an interval (`every`) or on a cron expression (`cron`); give exactly one. "
        "The user is asked to confirm first. Use it for reminders, digests and recurring "
        "reports ('remind me every morning at 9 to ...')."
    ),
    args_model=ScheduleTaskArgs,
    run=_run,
    prepare=_prepare,
    requires_confirmation=True,
    title="Schedule a task",
)
