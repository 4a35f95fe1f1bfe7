"""The bot's scheduler (vagent_bot.schedules.scheduler) on a real Redis: two schedulers (separate Redis
clients, as two bot replicas) racing over many due runs execute each run once; a scheduler
killed between claim and start leaves its run to the other, once; one killed after the start
leaves it never run again; skipped runs pause the job and tell its owner; a missed one-off is
reported, not run.

The Matrix side is a recording stand-in (`RecordingSide`): the checks, the ⏰ line and the turn
need a homeserver and are covered end to end in tests/e2e/test_schedules_e2e.py. Everything
Redis does here is the real store; time is the real clock (jobs every second).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError

from vagent_bot.schedules.runs import STOPPED_RESULT, Skip
from vagent_bot.schedules.scheduler import Allowed, Scheduler
from vagent_shared.access_provider import AccessResult
from vagent_shared.audit import AuditEvent
from vagent_shared.audit_trail import AuditTrail
from vagent_shared.schedule_store import ScheduleStore
from vagent_shared.schedules import MAX_SKIPS_IN_A_ROW, RunClaim, RunOutcome, Schedule, ScheduledJob

pytestmark = pytest.mark.timeout(90)

OWNER = "@alice:localhost"
ROOM = "!room:localhost"
LEASE = 1.0


class RecordingSide:
    """The Matrix side, recorded: which runs were answered (by run id), what owners were told.
    `hold_check` / `hold_run`: the next check or run waits until the test kills its scheduler."""

    def __init__(
        self, runs: Counter[str], verdict: Allowed | Skip | None = None, ended: Skip | None = None
    ) -> None:
        self.runs = runs
        self.ended = ended  # what a run ends with instead of an answer (the graph's budget refusal)
        self.told: list[tuple[str, str]] = []
        self.verdict = verdict or Allowed(AccessResult(True, "granted", None), None)
        self.hold_check = self.hold_run = False
        self.entered = asyncio.Event()
        self.release = asyncio.Event()  # ends a held run (never set: held until killed)

    async def ready(self) -> None:
        return None

    async def check(self, job: ScheduledJob) -> Allowed | Skip:
        if self.hold_check:
            self.entered.set()
            await asyncio.Event().wait()
        return self.verdict

    async def run(
        self, job: ScheduledJob, claim: RunClaim, allowed: Allowed
    ) -> tuple[RunOutcome, str] | Skip:
        self.runs[claim.run_id] += 1
        if self.hold_run:
            self.entered.set()
            await self.release.wait()
        return self.ended or ("ran", "answered")

    async def tell(self, owner: str, text: str) -> None:
        self.told.append((owner, text))


class RecordingAudit(AuditTrail):
    def __init__(self) -> None:
        super().__init__("bot", None, "audit")
        self.events: list[AuditEvent] = []

    def record(self, *args: Any, **kwargs: Any) -> AuditEvent:
        event = super().record(*args, **kwargs)
        self.events.append(event)
        return event


class Running:
    """One scheduler on a Redis client of its own, its loop a task the test can kill."""

    def __init__(self, redis: Redis, side: RecordingSide, audit: AuditTrail | None = None) -> None:
        self.redis, self.side = redis, side
        self.scheduler = Scheduler(
            ScheduleStore(redis),
            side,
            grace_seconds=3600,
            audit=audit,
            lease_seconds=LEASE,
            poll_seconds=0.05,
            take_over_seconds=0.1,
        )
        self.task = asyncio.create_task(self.scheduler.run())

    async def kill(self) -> None:
        """As SIGKILL: nothing more is written to Redis (not even the run's end), all stops."""

        async def dead(*_: Any, **__: Any) -> NoReturn:
            raise RedisError("killed")

        self.scheduler.store.finished = dead  # type: ignore[method-assign]
        for task in [self.task, *self.scheduler._runs.values()]:
            task.cancel()
        await asyncio.gather(self.task, *self.scheduler._runs.values(), return_exceptions=True)

    async def stop(self) -> None:
        await self.scheduler.stop(grace_seconds=5)
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


@pytest.fixture
async def clients(module_redis_url: str) -> AsyncIterator[Callable[[], Redis]]:
    made: list[Redis] = []

    def new() -> Redis:
        made.append(Redis.from_url(module_redis_url))
        return made[-1]

    await new().flushdb()
    yield new
    for r in made:
        await r.aclose()


async def until(condition: Callable[[], bool | Awaitable[bool]], what: str, within: float = 30) -> None:
    deadline = time.monotonic() + within
    while True:
        got = condition()
        if not isinstance(got, bool):
            got = await got
        if got:
            return
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.02)


async def new_job(store: ScheduleStore, schedule: Schedule, first: datetime) -> ScheduledJob:
    job = await store.create(
        owner=OWNER,
        room_id=ROOM,
        task="list my open tickets",
        schedule=schedule,
        next_due=first,
        max_per_user=100,
        now=datetime.now(UTC),
        domain="localhost",
    )
    assert isinstance(job, ScheduledJob)
    return job


def every_second(anchor: datetime) -> Schedule:
    return Schedule(kind="every", every_seconds=1, anchor=anchor, text="every 1s")


async def test_two_schedulers_racing_run_every_due_run_exactly_once(clients: Callable[[], Redis]) -> None:
    store = ScheduleStore(clients())
    anchor = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    jobs = [await new_job(store, every_second(anchor), anchor) for _ in range(5)]
    runs: Counter[str] = Counter()
    one, two = Running(clients(), RecordingSide(runs)), Running(clients(), RecordingSide(runs))
    try:
        await until(lambda: len(runs) >= 5 * 6, "30 runs of the five jobs", within=40)
    finally:
        await one.stop()
        await two.stop()
    assert set(runs.values()) == {1}, [r for r, n in runs.items() if n > 1]
    for job in jobs:
        dues = sorted(int(r.rpartition("@")[2]) for r in runs if r.startswith(job.id + "@"))
        assert len(dues) >= 3 and len(set(dues)) == len(dues)
    for run_id in list(runs)[:10]:
        job_id, _, due = run_id.rpartition("@")
        claim = RunClaim(job_id=job_id, due=datetime.fromtimestamp(int(due), UTC))
        assert await store.run_state(claim) == "ran"


async def test_a_scheduler_killed_before_starting_a_run_leaves_it_to_another_once(
    clients: Callable[[], Redis],
) -> None:
    store = ScheduleStore(clients())
    now = datetime.now(UTC)
    job = await new_job(store, Schedule(kind="at", at=now, text="now"), now)
    runs: Counter[str] = Counter()
    dying = RecordingSide(runs)
    dying.hold_check = True
    first = Running(clients(), dying)
    await asyncio.wait_for(dying.entered.wait(), 20)  # claimed, checking: not started
    await first.kill()
    assert not runs
    second = Running(clients(), RecordingSide(runs))
    try:
        await until(lambda: len(runs) == 1, "the other scheduler took the run over")
        run_id = next(iter(runs))
        claim = RunClaim(job_id=job.id, due=datetime.fromtimestamp(int(run_id.rpartition("@")[2]), UTC))
        await until(lambda: _state(store, claim, "ran"), "the run recorded as ran")
        rounds = second.scheduler.rounds
        await until(lambda: second.scheduler.rounds > rounds + 20, "twenty more rounds")
    finally:
        await second.stop()
    assert runs == Counter({run_id: 1})
    finished = await store.get(job.id)
    assert finished is not None and finished.last_outcome == "ran" and finished.next_due is None


async def test_a_scheduler_killed_after_starting_a_run_never_runs_it_again(
    clients: Callable[[], Redis],
) -> None:
    store = ScheduleStore(clients())
    now = datetime.now(UTC)
    job = await new_job(store, Schedule(kind="at", at=now, text="now"), now)
    runs: Counter[str] = Counter()
    dying = RecordingSide(runs)
    dying.hold_run = True
    first = Running(clients(), dying)
    await asyncio.wait_for(dying.entered.wait(), 20)  # started, answering
    await first.kill()
    killed_at = time.monotonic()
    audit = RecordingAudit()
    second = Running(clients(), RecordingSide(runs), audit)
    try:
        # the dead claimant's lease ran out long ago, and the other looked again and again
        await until(
            lambda: time.monotonic() > killed_at + 3 * LEASE and second.scheduler.rounds > 30,
            "the lease ran out and the other scheduler looked for abandoned runs",
        )
    finally:
        await second.stop()
    assert sum(runs.values()) == 1
    claim = RunClaim(job_id=job.id, due=datetime.fromtimestamp(int(next(iter(runs)).rpartition("@")[2]), UTC))
    # recorded failed by the survivor, once: `!schedules` does not show a run going on forever
    assert await store.run_state(claim) == "failed"
    ended = await store.get(job.id)
    assert ended is not None and (ended.last_outcome, ended.last_result) == ("failed", STOPPED_RESULT)
    recorded = [(e.event_type, e.reason) for e in audit.events]
    assert recorded == [("schedule_run", "abandoned")]


async def test_a_run_answering_longer_than_its_lease_is_not_taken_for_abandoned(
    clients: Callable[[], Redis],
) -> None:
    store = ScheduleStore(clients())
    now = datetime.now(UTC)
    job = await new_job(store, Schedule(kind="at", at=now, text="now"), now)
    runs: Counter[str] = Counter()
    slow = RecordingSide(runs)
    slow.hold_run = True
    audit = RecordingAudit()
    answering = Running(clients(), slow, audit)
    await asyncio.wait_for(slow.entered.wait(), 20)  # it holds the run: then another bot looks on
    other = Running(clients(), RecordingSide(runs), audit)
    try:
        started = time.monotonic()
        await until(lambda: time.monotonic() > started + 4 * LEASE, "four leases went by")
        slow.release.set()
        await until(lambda: any(e.event_type == "schedule_run" for e in audit.events), "the run ended")
    finally:
        await answering.stop()
        await other.stop()
    assert sum(runs.values()) == 1
    ended = await store.get(job.id)
    assert ended is not None and (ended.last_outcome, ended.last_result) == ("ran", "answered")
    assert [(e.event_type, e.reason) for e in audit.events] == [("schedule_run", "ran")]


async def until_paused(
    clients: Callable[[], Redis], side: RecordingSide
) -> tuple[ScheduledJob, RecordingAudit]:
    """An every-second job run by one scheduler until its owner is told (it paused): the job
    as stored then, and what was audited."""
    store = ScheduleStore(clients())
    anchor = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    job = await new_job(store, every_second(anchor), anchor)
    audit = RecordingAudit()
    scheduler = Running(clients(), side, audit)
    try:
        await until(lambda: bool(side.told), "the owner was told")
    finally:
        await scheduler.stop()
    paused = await store.get(job.id)
    assert paused is not None and paused.paused and paused.last_outcome == "skipped"
    return paused, audit


async def test_skipped_runs_in_a_row_pause_the_job_and_tell_its_owner(clients: Callable[[], Redis]) -> None:
    runs: Counter[str] = Counter()
    side = RecordingSide(runs, verdict=Skip("no_agent_access"))
    paused, audit = await until_paused(clients, side)
    assert not runs  # nothing ran: no model call, no message in the room
    assert paused.last_result == "skipped: you no longer have access to this agent"
    assert side.told == [(OWNER, side.told[0][1])] and "`!schedule resume 1`" in side.told[0][1]
    skipped = [e for e in audit.events if e.event_type == "schedule_skipped"]
    assert len(skipped) == MAX_SKIPS_IN_A_ROW and {e.reason for e in skipped} == {"no_agent_access"}
    assert [e.event_type for e in audit.events].count("schedule_paused") == 1
    assert all("list my open tickets" not in e.model_dump_json() for e in audit.events)


async def test_runs_over_the_owners_budget_are_skipped_not_ran_and_pause_the_job(
    clients: Callable[[], Redis],
) -> None:
    """The graph answered with the budget notice (Done.outcome over_budget): each such run is
    recorded and audited as skipped, `!schedules` says why, and the third in a row pauses."""
    runs: Counter[str] = Counter()
    side = RecordingSide(runs, ended=Skip("over_budget"))
    paused, audit = await until_paused(clients, side)
    assert sum(runs.values()) == MAX_SKIPS_IN_A_ROW  # each was started once (the room saw the notice)
    assert paused.last_result == "skipped: your usage budget is spent"
    kinds = [(e.event_type, e.reason) for e in audit.events if e.event_type.startswith("schedule_")]
    assert kinds.count(("schedule_skipped", "over_budget")) == MAX_SKIPS_IN_A_ROW
    assert not [k for k in kinds if k[0] == "schedule_run"]  # never recorded as ran
    assert "budget" in side.told[0][1]


async def test_a_one_off_missed_beyond_the_grace_is_not_run_and_its_owner_is_told(
    clients: Callable[[], Redis],
) -> None:
    store = ScheduleStore(clients())
    long_ago = datetime(2030, 1, 7, 9, 0, tzinfo=UTC) - timedelta(days=3650)
    job = await new_job(store, Schedule(kind="at", at=long_ago, text="then"), long_ago)
    runs: Counter[str] = Counter()
    side = RecordingSide(runs)
    audit = RecordingAudit()
    scheduler = Running(clients(), side, audit)
    try:
        await until(lambda: bool(side.told), "the owner was told")
    finally:
        await scheduler.stop()
    assert not runs
    assert "was missed: no bot was running; it will not run." in side.told[0][1]
    missed = await store.get(job.id)
    assert missed is not None and missed.last_outcome == "missed" and missed.next_due is None
    assert [(e.event_type, e.reason) for e in audit.events] == [("schedule_skipped", "missed")]


async def _state(store: ScheduleStore, claim: RunClaim, wanted: str) -> bool:
    return await store.run_state(claim) == wanted
