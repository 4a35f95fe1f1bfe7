"""`vagent schedules`: every user's scheduled tasks, for operators (docs/schedules.md).

    vagent schedules list [USER_ID] [--json]
    vagent schedules delete ID [--yes]

`list` prints every job (or one user's), by owner then number: its number, owner, room,
schedule, next due time (UTC), whether it is paused, its last result and its task (printable,
cut to one line). Users see only their own jobs (`!schedules`); this command is the
operator's. `--json` prints one ScheduledJob a line.

`delete` deletes one job of any user by its id (`list --json` shows it), after asking
(`--yes` does not ask: for scripts). It writes one `schedule_deleted` audit record (the job's
id and number, reason "operator", never the task's text). A run of it already claimed but not
started is not started. `vagent admin forget` deletes a user's jobs with the rest of their
data.

Reads the graph's settings (REDIS_URL). Exit codes: 0 done, 1 no such job, not confirmed or
Redis refused a command, 2 bad usage or Redis unreachable.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Annotated, TypeVar

import typer
from redis.asyncio import Redis

from vagent_graph.cli.common import load_settings, on_redis
from vagent_graph.cli.output import cell, complain, header, plural, printable, say
from vagent_graph.state.erasure import valid_user_id
from vagent_shared.audit import AuditEvent
from vagent_shared.audit_trail import stream_bounds
from vagent_shared.schedule_store import ScheduleStore
from vagent_shared.schedules import ScheduledJob
from vagent_shared.settings import GraphSettings

PROG = "vagent schedules"
#: The audit record's reason: deleted by an operator (the bot's: `!unschedule`, erasure, ...).
REASON = "operator"
#: The longest task text a table row shows (the whole of it: `--json`).
TASK_CHARS = 60
T = TypeVar("T")

app = typer.Typer(
    help="Every user's scheduled tasks: list, delete (docs/schedules.md).",
    short_help="Scheduled tasks: list, delete.",
    no_args_is_help=True,
)


class NotConfirmed(Exception):
    """The operator did not confirm a deletion."""


class NoSuchJob(Exception):
    """No job has that id."""


# ---- the text (pure) ---------------------------------------------------------------------------

#: (title, width) of `list`'s columns; the task, last, is cut to TASK_CHARS.
COLUMNS: tuple[tuple[str, int], ...] = (
    ("ID", 32),
    ("N", 3),
    ("OWNER", 24),
    ("ROOM", 24),
    ("SCHEDULE", 30),
    ("NEXT DUE (UTC)", 16),
    ("PAUSED", 6),
    ("LAST RESULT", 24),
    ("TASK", 0),
)


def _utc(when: datetime | None) -> str:
    return "-" if when is None else when.astimezone(UTC).strftime("%Y-%m-%d %H:%M")


def last_result(job: ScheduledJob) -> str:
    """The last run in short: its sentence, else its outcome, else "-" (never ran)."""
    return job.last_result or job.last_outcome or "-"


def table_row(job: ScheduledJob) -> str:
    """One job, in COLUMNS' order; its task last, printable and cut."""
    from vagent_shared.schedule_times import describe  # ~0.3 s to import: only when listing

    values = (
        job.id,
        str(job.number),
        job.owner,
        job.room_id + (" (thread)" if job.thread_root else ""),
        describe(job.schedule),
        _utc(job.next_due),
        "yes" if job.paused else "no",
        last_result(job),
    )
    cells = [cell(v, w).ljust(w) for v, (_, w) in zip(values, COLUMNS[:-1], strict=True)]
    task = printable(job.task)
    return "  ".join([*cells, task if len(task) <= TASK_CHARS else task[: TASK_CHARS - 1] + "…"])


def deleted_event(job: ScheduledJob) -> AuditEvent:
    """The record a deletion leaves: whose job, its id and number; never the task's text."""
    return AuditEvent(
        service="admin",
        user_id=job.owner,
        domain=job.domain,
        event_type="schedule_deleted",
        resource=f"schedule:{job.id}",
        decision="done",
        reason=REASON,
        metadata={"job_id": job.id, "number": job.number, "count": 1},
    )


# ---- Redis -------------------------------------------------------------------------------------


def with_store(work: Callable[[ScheduleStore, Redis, GraphSettings], Awaitable[T]]) -> T:
    """Run `work` on the job store, turning failures into one line and the exit code."""
    settings = load_settings(PROG, GraphSettings)

    async def run(redis: Redis) -> T:
        return await work(ScheduleStore(redis), redis, settings)

    return on_redis(PROG, settings.REDIS_URL, run)


async def record_deleted(redis: Redis, settings: GraphSettings, event: AuditEvent) -> None:
    """Append the record to the audit stream (the command waits for it, so the operator
    knows it is on record)."""
    bounds = stream_bounds(settings.AUDIT_STREAM_MAXLEN, settings.AUDIT_STREAM_MAX_AGE_HOURS * 3600)
    await redis.xadd(settings.AUDIT_STREAM, event.to_stream(), **bounds)  # type: ignore[arg-type]


# ---- the command line --------------------------------------------------------------------------


def _user(text: str) -> str:
    if not valid_user_id(text):
        raise typer.BadParameter(f"{text!r} is not a Matrix user id (@name:server)")
    return text


@app.command("list", short_help="Every scheduled task, or one user's.")
def list_(
    user_id: Annotated[
        str | None,
        typer.Argument(parser=_user, metavar="USER_ID", help="only this user's, @name:server"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON, one job per line")] = False,
) -> None:
    """Every scheduled task (or one user's), by owner then number, with its task."""

    async def work(store: ScheduleStore, _redis: Redis, _settings: GraphSettings) -> list[ScheduledJob]:
        return await (store.of_user(user_id) if user_id else store.admin_list())

    jobs = with_store(work)
    if as_json:
        for job in jobs:
            say(job.model_dump_json())
        return
    whose = f" of {printable(user_id)}" if user_id else ""
    if not jobs:
        say(f"No scheduled tasks{whose}.")
        return
    say(header(COLUMNS))
    for job in jobs:
        say(table_row(job))
    say(f"{plural(len(jobs), 'scheduled task', 'scheduled tasks')}{whose}.")


@app.command(short_help="Delete one scheduled task of any user.")
def delete(
    job_id: Annotated[str, typer.Argument(metavar="ID", help="the job's id (`list` shows it)")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")] = False,
) -> None:
    """Delete one scheduled task by its id; its owner's other tasks keep their numbers."""

    async def work(store: ScheduleStore, redis: Redis, settings: GraphSettings) -> ScheduledJob:
        job = await store.get(job_id)
        if job is None:
            raise NoSuchJob
        if not yes:
            question = (
                f"Delete task {job.number} of {printable(job.owner)} ({printable(job.task)[:TASK_CHARS]!r})?"
            )
            try:
                answer = typer.confirm(question, default=False)
            except typer.Abort:  # end of input, Ctrl-C
                answer = False
            if not answer:
                raise NotConfirmed
        deleted = await store.admin_delete(job_id)
        if deleted is None:  # gone meanwhile (its owner deleted it)
            raise NoSuchJob
        await record_deleted(redis, settings, deleted_event(deleted))
        return deleted

    try:
        job = with_store(work)
    except NotConfirmed:
        complain(PROG, "not confirmed; nothing was deleted")
        raise typer.Exit(1) from None
    except NoSuchJob:
        complain(PROG, f"no scheduled task {printable(job_id)!r} (`vagent schedules list` shows them)")
        raise typer.Exit(1) from None
    say(f"Deleted task {job.number} of {printable(job.owner)} ({job.id}).")
