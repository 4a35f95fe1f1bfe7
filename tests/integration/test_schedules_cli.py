"""`vagent schedules list|delete` on a real Redis (docs/schedules.md): an operator sees every
user's jobs (or one user's), deletes one by its id after confirming, and the deletion is on
record (`schedule_deleted`, reason operator, never the task's text)."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from datetime import UTC, datetime
from typing import cast

from redis.asyncio import Redis

from tests.support.vagent_cli import Ran, run_vagent
from vagent_shared.audit import AuditEvent
from vagent_shared.schedule_store import ScheduleStore
from vagent_shared.schedule_times import ParsedSchedule, parse_schedule_command
from vagent_shared.schedules import ScheduledJob


async def make_jobs(redis_url: str, owner: str, *commands: str) -> list[ScheduledJob]:
    """`owner`'s jobs as `!schedule COMMAND` makes them (room !r:x)."""
    redis = Redis.from_url(redis_url)
    try:
        store, made = ScheduleStore(redis), []
        now = datetime.now(UTC)
        for command in commands:
            parsed = parse_schedule_command(command, now, "UTC", min_interval_seconds=900)
            assert isinstance(parsed, ParsedSchedule), parsed
            job = await store.create(
                owner=owner,
                room_id="!r:x",
                task=parsed.task,
                schedule=parsed.schedule,
                next_due=parsed.first_run,
                max_per_user=10,
                now=now,
            )
            assert isinstance(job, ScheduledJob), job
            made.append(job)
        return made
    finally:
        await redis.aclose()


async def jobs_of(redis_url: str, owner: str) -> list[ScheduledJob]:
    redis = Redis.from_url(redis_url)
    try:
        return await ScheduleStore(redis).of_user(owner)
    finally:
        await redis.aclose()


async def records(redis_url: str, stream: str) -> list[AuditEvent]:
    redis = Redis.from_url(redis_url)
    try:
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]], await redis.xrange(stream))
        return [AuditEvent.from_stream(f) for _, f in entries]
    finally:
        await redis.aclose()


def vagent(redis_url: str, stream: str, *args: str) -> Ran:
    return run_vagent(["schedules", *args], {**os.environ, "REDIS_URL": redis_url, "AUDIT_STREAM": stream})


def test_list_shows_every_users_jobs_or_one_users_and_delete_is_confirmed_and_recorded(
    redis_url: str,
) -> None:
    tag = uuid.uuid4().hex[:8]
    alice, bob, stream = f"@alice-{tag}:x", f"@bob-{tag}:x", f"audit-sched-{tag}"
    mine = asyncio.run(
        make_jobs(redis_url, alice, "every weekday at 09:00: list my open tickets", "in 20m: call Bob")
    )
    (his,) = asyncio.run(make_jobs(redis_url, bob, "every 2h: check the build"))

    listed = vagent(redis_url, stream, "list")
    assert listed.returncode == 0, listed.stderr
    for job, schedule in ((mine[0], "every weekday at 09:00 (UTC)"), (his, "every 2 hours")):
        (row,) = [line for line in listed.stdout.splitlines() if line.startswith(job.id)]
        assert job.owner in row and schedule in row and row.endswith(job.task), row
    only = vagent(redis_url, stream, "list", alice)
    assert only.returncode == 0 and his.id not in only.stdout and mine[1].id in only.stdout
    assert only.stdout.rstrip().endswith(f"2 scheduled tasks of {alice}."), only.stdout
    as_json = vagent(redis_url, stream, "list", bob, "--json")
    assert [json.loads(line)["task"] for line in as_json.stdout.splitlines()] == ["check the build"]
    assert vagent(redis_url, stream, "list", "not-a-user").returncode == 2

    refused = vagent(redis_url, stream, "delete", mine[0].id)  # no answer: not confirmed
    assert refused.returncode == 1 and "nothing was deleted" in refused.stderr
    assert len(asyncio.run(jobs_of(redis_url, alice))) == 2

    done = vagent(redis_url, stream, "delete", mine[0].id, "--yes")
    assert done.returncode == 0 and f"Deleted task 1 of {alice}" in done.stdout, done.stdout + done.stderr
    assert [j.number for j in asyncio.run(jobs_of(redis_url, alice))] == [2]  # the other keeps its number
    assert [j.id for j in asyncio.run(jobs_of(redis_url, bob))] == [his.id]
    (event,) = asyncio.run(records(redis_url, stream))
    assert (event.event_type, event.user_id, event.reason) == ("schedule_deleted", alice, "operator")
    assert event.metadata["job_id"] == mine[0].id and mine[0].task not in event.model_dump_json()

    again = vagent(redis_url, stream, "delete", mine[0].id, "--yes")
    assert again.returncode == 1 and "no scheduled task" in again.stderr
    assert len(asyncio.run(records(redis_url, stream))) == 1
