"""Scheduled jobs in a real Redis (vagent_shared.schedule_store): every due run claimed exactly
once by racing schedulers, a claimant that dies before starting leaves its run to exactly one
other, one that dies after starting leaves it done, deleted and paused jobs do not run, limits
hold under concurrent creates, numbers belong to their owner, erasure leaves no task text.

Time is a fake `now` the tests advance (no sleeping); the next-due policy is plain arithmetic
on `every` schedules (the real one is schedule_times').
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from vagent_shared import redis_keys
from vagent_shared.schedule_store import LimitReached, ScheduleStore
from vagent_shared.schedules import MAX_SKIPS_IN_A_ROW, Schedule, ScheduledJob

pytestmark = pytest.mark.timeout(60)

T0 = datetime(2030, 1, 7, 9, 0, tzinfo=UTC)
ROOM = "!room:localhost"
LEASE = 30.0


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def every(seconds: int, anchor: datetime) -> Schedule:
    return Schedule(kind="every", every_seconds=seconds, anchor=anchor, text=f"every {seconds}s")


def once(when: datetime) -> Schedule:
    return Schedule(kind="at", at=when, text=when.isoformat())


def next_after_now(job: ScheduledJob, due: datetime, now: datetime) -> datetime | None:
    """The missed-run rule for the tests: the first occurrence after now (a recurring job
    that missed several runs once); a one-off has nothing next."""
    s = job.schedule
    if s.kind != "every":
        return None
    assert s.every_seconds and s.anchor
    k = math.floor((now - s.anchor).total_seconds() / s.every_seconds) + 1
    return s.anchor + timedelta(seconds=k * s.every_seconds)


@pytest.fixture
async def clients(module_redis_url: str) -> AsyncIterator[Callable[[], Redis]]:
    """New clients (each its own connections) on the module's own Redis, emptied first."""
    made: list[Redis] = []

    def new() -> Redis:
        made.append(Redis.from_url(module_redis_url))
        return made[-1]

    await new().flushdb()
    yield new
    for r in made:
        await r.aclose()


@pytest.fixture
def redis(clients: Callable[[], Redis]) -> Redis:
    return clients()


@pytest.fixture
def store(redis: Redis) -> ScheduleStore:
    return ScheduleStore(redis)


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def user() -> str:
    return f"@u{uuid.uuid4().hex[:8]}:localhost"


async def make(
    store: ScheduleStore,
    owner: str,
    schedule: Schedule,
    first: datetime,
    task: str = "list my open tickets",
    limit: int = 100,
) -> ScheduledJob:
    job = await store.create(
        owner=owner, room_id=ROOM, task=task, schedule=schedule, next_due=first, max_per_user=limit, now=T0
    )
    assert isinstance(job, ScheduledJob)
    return job


def elsewhere(module_redis_url: str, work: Callable[[ScheduleStore], Coroutine[Any, Any, Any]]) -> Any:
    """Runs `work` on another store (its own client and event loop) and waits for it: another
    bot acting in the middle of one of ours."""
    out: list[Any] = []

    async def run() -> None:
        r = Redis.from_url(module_redis_url)
        try:
            out.append(await work(ScheduleStore(r)))
        finally:
            await r.aclose()

    t = threading.Thread(target=lambda: asyncio.run(run()))
    t.start()
    t.join()
    return out[0]


# ---- exactly once --------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_racing_schedulers_claim_every_occurrence_exactly_once(
    clients: Callable[[], Redis], seed: int
) -> None:
    rng = random.Random(seed)
    setup = ScheduleStore(clients())
    schedulers = [ScheduleStore(clients()) for _ in range(3)]
    expected: set[tuple[str, int]] = set()
    last = 60
    for i in range(20):
        anchor = at(rng.randint(0, 3))
        interval = rng.choice([1, 1, 2, 3])
        job = await make(setup, f"@owner{i}:localhost", every(interval, anchor), anchor)
        first = int(anchor.timestamp())
        expected |= {(job.id, t) for t in range(first, int(at(last).timestamp()) + 1, interval)}

    ran: list[tuple[str, int]] = []

    async def scheduler(s: ScheduleStore, name: str, now: datetime) -> int:
        got = await s.claim_due(now, name, LEASE, next_after_now, limit=rng.randint(1, 6))
        for claim, _job in got:
            await asyncio.sleep(0)
            assert await s.started(claim)
            ran.append((claim.job_id, int(claim.due.timestamp())))
            assert (await s.finished(claim, "ran", "ok", now)).recorded
        return len(got)

    for tick in range(last + 1):
        now = at(tick + rng.random() * 0.9)  # claims happen a little late, like a real loop
        while await setup.redis.zcount(redis_keys.SCHEDULE_DUE, "-inf", now.timestamp()):
            order = rng.sample(range(3), 3)
            await asyncio.gather(*(scheduler(schedulers[i], f"bot{i}", now) for i in order))

    counts = Counter(ran)
    assert [run for run, n in counts.items() if n > 1] == []  # none twice
    assert set(counts) == expected  # none lost
    assert await setup.redis.zcard(redis_keys.SCHEDULE_CLAIMED) == 0
    jobs = await setup.admin_list()
    assert len(jobs) == 20 and all(
        j.last_outcome == "ran" and j.next_due > at(last) for j in jobs if j.next_due
    )


async def test_a_recurring_job_that_missed_many_occurrences_runs_once(store: ScheduleStore) -> None:
    owner = user()
    job = await make(store, owner, every(10, T0), T0)
    now = at(95)  # nine occurrences passed while no bot ran
    claims = await store.claim_due(now, "bot", LEASE, next_after_now)
    assert [c.job_id for c, _ in claims] == [job.id]
    claim, claimed = claims[0]
    assert claim.due == T0 and claim.lag_seconds == 95
    assert claimed.next_due == at(100)  # the next one after now, not a burst
    assert await store.claim_due(now, "bot", LEASE, next_after_now) == []
    assert await store.claim_due(at(99.5), "other", LEASE, next_after_now) == []
    assert [c.due for c, _ in await store.claim_due(at(100), "other", LEASE, next_after_now)] == [at(100)]


async def test_a_run_claimed_by_someone_between_read_and_claim_is_not_claimed_twice(
    store: ScheduleStore, module_redis_url: str
) -> None:
    owner = user()
    job = await make(store, owner, every(60, T0), T0)
    theirs: list[Any] = []

    def policy(j: ScheduledJob, due: datetime, now: datetime) -> datetime | None:
        if not theirs:  # another bot claims it after our read, before our claim
            theirs.append(
                elsewhere(module_redis_url, lambda s: s.claim_due(now, "them", LEASE, next_after_now))
            )
        return next_after_now(j, due, now)

    assert await store.claim_due(at(1), "us", LEASE, policy) == []
    assert [c.job_id for c, _ in theirs[0]] == [job.id]


# ---- claimants that die ----------------------------------------------------------------------


async def test_a_run_claimed_by_a_bot_that_died_before_starting_is_taken_over_once(
    clients: Callable[[], Redis],
) -> None:
    dead, b, c = (ScheduleStore(clients()) for _ in range(3))
    owner = user()
    job = await make(dead, owner, once(at(10)), at(10))
    [(claim, _)] = await dead.claim_due(at(10), "dead", LEASE, next_after_now)
    # ...and the bot is killed before it starts the run
    assert await b.take_over(at(10 + LEASE - 1), "b", LEASE) == []  # not while its lease runs
    got_b, got_c = await asyncio.gather(
        b.take_over(at(10 + LEASE + 1), "b", LEASE), c.take_over(at(10 + LEASE + 1), "c", LEASE)
    )
    taken = got_b + got_c
    assert [(t.job_id, t.due) for t, _ in taken] == [(job.id, at(10))]  # exactly one bot got it
    taker_store = b if got_b else c
    taker, taken_job = taken[0]
    assert taken_job.task == job.task
    assert not await dead.started(claim)  # the dead bot, back late, does not run it
    assert await taker_store.started(taker)
    assert await taker_store.started(taker)  # asking again (a retried call) answers the same
    assert (await taker_store.finished(taker, "ran", "done", at(50))).recorded
    assert await b.take_over(at(10_000), "b", LEASE) == []
    assert await c.claim_due(at(10_000), "c", LEASE, next_after_now) == []
    assert await b.run_state(claim) == "ran"


async def test_a_run_started_by_a_bot_that_died_is_never_run_again(clients: Callable[[], Redis]) -> None:
    dead, b = ScheduleStore(clients()), ScheduleStore(clients())
    owner = user()
    job = await make(dead, owner, every(3600, T0), T0)
    [(claim, _)] = await dead.claim_due(at(1), "dead", LEASE, next_after_now)
    assert await dead.started(claim)
    # killed mid-run: nobody takes it over, and the same due time is never claimed again
    assert await b.take_over(at(10_000), "b", LEASE) == []
    later = await b.claim_due(at(3600), "b", LEASE, next_after_now)
    assert [(c.job_id, c.due) for c, _ in later] == [(job.id, at(3600))]
    assert await b.run_state(claim) == "started:dead"


async def test_renewing_keeps_a_slow_claimants_run_from_being_taken_over(
    clients: Callable[[], Redis],
) -> None:
    a, b = ScheduleStore(clients()), ScheduleStore(clients())
    await make(a, user(), once(at(0)), at(0))
    [(claim, _)] = await a.claim_due(at(0), "a", LEASE, next_after_now)
    assert await a.renew([claim], at(20), LEASE) == 1  # still deciding (asking the provider)
    assert await b.take_over(at(40), "b", LEASE) == []
    assert await b.renew([claim], at(40), LEASE) == 1  # renewing needs the right claimant...
    other = claim.model_copy(update={"claimant": "b"})
    assert await b.renew([other], at(45), LEASE) == 0  # ...which b is not
    assert [t.job_id for t, _ in await b.take_over(at(71), "b", LEASE)] == [claim.job_id]
    assert await a.renew([claim], at(72), LEASE) == 0  # a lost it: it renews nothing


async def test_a_resumed_job_at_an_already_claimed_time_is_not_run_twice(store: ScheduleStore) -> None:
    owner = user()
    job = await make(store, owner, every(60, T0), T0)
    [(claim, _)] = await store.claim_due(at(0), "bot", LEASE, next_after_now)
    assert await store.started(claim)
    await store.finished(claim, "ran", "ok", at(1))
    assert (await store.pause(owner, job.number) or job).paused
    await store.resume(owner, job.number, T0)  # a careless caller puts it back at the run time
    assert await store.claim_due(at(1), "bot", LEASE, next_after_now) == []  # that run is done
    assert (await store.get(job.id) or job).next_due == at(60)  # and the job moved on


# ---- deleted and paused jobs -----------------------------------------------------------------


@pytest.mark.parametrize("change", ["delete", "pause"])
async def test_a_job_deleted_or_paused_between_read_and_claim_is_not_claimed(
    store: ScheduleStore, module_redis_url: str, change: str
) -> None:
    owner = user()
    job = await make(store, owner, every(60, T0), T0)

    def policy(j: ScheduledJob, due: datetime, now: datetime) -> datetime | None:
        elsewhere(module_redis_url, lambda s: getattr(s, change)(owner, job.number))
        return next_after_now(j, due, now)

    assert await store.claim_due(at(1), "bot", LEASE, policy) == []
    assert await store.claim_due(at(1000), "bot", LEASE, next_after_now) == []
    assert await store.redis.zcard(redis_keys.SCHEDULE_CLAIMED) == 0


@pytest.mark.parametrize("change", ["delete", "pause"])
async def test_a_job_deleted_or_paused_after_the_claim_does_not_start(
    store: ScheduleStore, change: str
) -> None:
    owner = user()
    job = await make(store, owner, every(60, T0), T0)
    [(claim, _)] = await store.claim_due(at(1), "bot", LEASE, next_after_now)
    await getattr(store, change)(owner, job.number)
    assert not await store.started(claim)
    assert await store.run_state(claim) == "cancelled"
    assert await store.take_over(at(10_000), "other", LEASE) == []


async def test_a_claimed_run_of_a_deleted_job_is_not_taken_over(clients: Callable[[], Redis]) -> None:
    dead, b = ScheduleStore(clients()), ScheduleStore(clients())
    owner = user()
    job = await make(dead, owner, once(at(0)), at(0))
    await dead.claim_due(at(0), "dead", LEASE, next_after_now)
    assert await b.delete(owner, job.number) is not None
    assert await b.take_over(at(1000), "b", LEASE) == []


async def test_finishing_a_run_of_a_job_deleted_meanwhile_does_not_bring_it_back(
    store: ScheduleStore,
) -> None:
    owner = user()
    job = await make(store, owner, every(60, T0), T0)
    [(claim, _)] = await store.claim_due(at(1), "bot", LEASE, next_after_now)
    assert await store.started(claim)
    assert await store.delete(owner, job.number) is not None  # deleted while it runs
    done = await store.finished(claim, "ran", "ok", at(2))
    assert done.recorded and done.job is None
    assert await store.get(job.id) is None and await store.of_user(owner) == []
    assert not await store.redis.exists(redis_keys.schedule_job(job.id))
    assert await store.claim_due(at(10_000), "bot", LEASE, next_after_now) == []


# ---- results, skips, pause and resume ------------------------------------------------------


async def run_once(store: ScheduleStore, now: datetime, outcome: Any, result: str = "x") -> Any:
    [(claim, _)] = await store.claim_due(now, "bot", LEASE, next_after_now)
    return await store.finished(claim, outcome, result, now)


async def test_three_skipped_runs_in_a_row_pause_the_job(store: ScheduleStore) -> None:
    owner = user()
    job = await make(store, owner, every(60, T0), T0)
    assert (await run_once(store, at(0), "skipped")).job.skips_in_a_row == 1
    assert (await run_once(store, at(60), "ran")).job.skips_in_a_row == 0  # a run resets it
    for i in range(1, MAX_SKIPS_IN_A_ROW):
        done = await run_once(store, at(60 + 60 * i), "skipped", "you are no longer in this room")
        assert not done.paused_now and not done.job.paused
    done = await run_once(
        store, at(60 * (MAX_SKIPS_IN_A_ROW + 1)), "skipped", "you are no longer in this room"
    )
    assert done.paused_now and done.job.paused and done.job.next_due is None
    assert done.job.skips_in_a_row == MAX_SKIPS_IN_A_ROW
    assert done.job.last_outcome == "skipped" and done.job.last_result == "you are no longer in this room"
    assert await store.claim_due(at(100_000), "bot", LEASE, next_after_now) == []
    resumed = await store.resume(owner, job.number, at(100_020))
    assert resumed and not resumed.paused and resumed.skips_in_a_row == 0 and resumed.next_due == at(100_020)
    assert [c.due for c, _ in await store.claim_due(at(100_020), "bot", LEASE, next_after_now)] == [
        at(100_020)
    ]


async def test_finishing_twice_counts_once(store: ScheduleStore) -> None:
    owner = user()
    await make(store, owner, every(60, T0), T0)
    [(claim, _)] = await store.claim_due(at(0), "bot", LEASE, next_after_now)
    assert (await store.finished(claim, "skipped", "no", at(1))).recorded
    again = await store.finished(claim, "skipped", "no", at(1))
    assert not again.recorded
    assert [j.skips_in_a_row for j in await store.of_user(owner)] == [1]


async def test_a_one_off_that_ran_is_listed_for_a_while_and_frees_its_place(store: ScheduleStore) -> None:
    owner = user()
    job = await make(store, owner, once(at(30)), at(30), limit=1)
    refused = await store.create(
        owner=owner,
        room_id=ROOM,
        task="second",
        schedule=once(at(90)),
        next_due=at(90),
        max_per_user=1,
        now=T0,
    )
    assert refused == LimitReached(limit=1, live=1)
    await run_once(store, at(31), "ran", "answered")
    [listed] = await store.of_user(owner)
    assert listed.id == job.id and listed.next_due is None and listed.last_result == "answered"
    assert listed.last_run_at == at(31)
    assert 0 < await store.redis.ttl(redis_keys.schedule_job(job.id))
    second = await make(store, owner, once(at(90)), at(90), task="second", limit=1)
    assert second.number == 2


async def test_task_text_survives_the_round_trips_unchanged(store: ScheduleStore) -> None:
    owner = user()
    task = 'remind me: "call Bob" / ask for the \\ report ⏰ 🦀 — naïve\nsecond line'
    job = await make(store, owner, every(60, T0), T0, task=task)
    await run_once(store, at(0), "ran", 'done "ok" / ✓')
    await store.pause(owner, job.number)
    await store.resume(owner, job.number, at(600))
    again = await store.get(job.id)
    assert again is not None and again.task == task and again.last_result == 'done "ok" / ✓'
    assert again.schedule == job.schedule and again.created_at == job.created_at


# ---- limits, numbers, owners -----------------------------------------------------------------


async def test_the_limit_holds_under_concurrent_creates(clients: Callable[[], Redis]) -> None:
    owner = user()
    stores = [ScheduleStore(clients()) for _ in range(10)]
    results = await asyncio.gather(
        *(
            s.create(
                owner=owner,
                room_id=ROOM,
                task=f"task {i}",
                schedule=every(3600, at(60)),
                next_due=at(60),
                max_per_user=3,
                now=T0,
            )
            for i, s in enumerate(stores)
        )
    )
    made = [r for r in results if isinstance(r, ScheduledJob)]
    assert len(made) == 3 and sorted(j.number for j in made) == [1, 2, 3]
    assert all(r == LimitReached(limit=3, live=3) for r in results if not isinstance(r, ScheduledJob))
    assert len(await stores[0].of_user(owner)) == 3


async def test_numbers_are_stable_and_never_reused(store: ScheduleStore) -> None:
    owner = user()
    one, two, three = [await make(store, owner, every(3600, at(60)), at(60), task=f"t{i}") for i in (1, 2, 3)]
    assert (one.number, two.number, three.number) == (1, 2, 3)
    deleted = await store.delete(owner, 2)
    assert deleted is not None and deleted.id == two.id
    assert await store.delete(owner, 2) is None and await store.by_number(owner, 2) is None
    four = await make(store, owner, every(3600, at(60)), at(60), task="t4")
    assert four.number == 4
    assert [(j.number, j.id) for j in await store.of_user(owner)] == [
        (1, one.id),
        (3, three.id),
        (4, four.id),
    ]


async def test_another_users_number_never_reaches_someones_job(store: ScheduleStore) -> None:
    alice, bob = user(), user()
    a1 = await make(store, alice, every(3600, at(60)), at(60), task="alice's")
    await make(store, alice, every(3600, at(60)), at(60), task="alice's 2")
    b1 = await make(store, bob, every(3600, at(60)), at(60), task="bob's")
    assert a1.number == b1.number == 1
    assert await store.pause(bob, 2) is None  # bob has no job 2, alice has
    assert await store.delete(bob, 2) is None and await store.resume(bob, 2, at(99)) is None
    paused = await store.pause(bob, 1)
    assert paused is not None and paused.id == b1.id and paused.paused
    assert (await store.by_number(alice, 1) or b1).paused is False
    assert [j.owner for j in await store.of_user(bob)] == [bob]
    assert await store.delete(bob, 1) is not None
    assert [j.number for j in await store.of_user(alice)] == [1, 2]
    assert [j.task for j in await store.in_room(alice, ROOM)] == ["alice's", "alice's 2"]
    assert await store.in_room(alice, "!other:localhost") == []


async def test_an_operator_lists_and_deletes_any_job(store: ScheduleStore) -> None:
    alice, bob = user(), user()
    a = await make(store, alice, every(3600, at(60)), at(60))
    b = await make(store, bob, every(3600, at(60)), at(60))
    assert {j.id for j in await store.admin_list()} == {a.id, b.id}
    assert (await store.admin_delete(a.id) or b).id == a.id
    assert await store.of_user(alice) == [] and await store.admin_delete(a.id) is None
    assert [j.id for j in await store.admin_list()] == [b.id]
    assert await store.claim_due(at(60), "bot", LEASE, next_after_now) != []


async def test_forgetting_a_user_leaves_no_key_with_their_tasks(store: ScheduleStore, redis: Redis) -> None:
    alice, bob = user(), user()
    secret = "tell Carol the merger code word PELICAN"
    j1 = await make(store, alice, every(60, T0), T0, task=secret)
    await make(store, alice, once(at(300)), at(300), task=secret + " again")
    j3 = await make(store, alice, every(60, T0), T0, task=secret + " paused")
    await store.pause(alice, j3.number)
    kept = await make(store, bob, every(60, T0), T0, task="bob's own")
    await store.set_timezone(alice, "Europe/Oslo")
    for claim, _ in await store.claim_due(at(0), "bot", LEASE, next_after_now):
        if claim.job_id == j1.id:
            await store.started(claim)
            await store.finished(claim, "ran", "answered", at(1))
        # bob's run stays claimed-not-started

    assert await store.delete_all_of(alice) == 3
    left: list[str] = []
    async for key in redis.scan_iter(match="*"):
        name = text(key)
        kind = text(await redis.type(key))
        value: str
        if kind == "string":
            value = text(await redis.get(key))
        elif kind == "zset":
            value = " ".join(map(text, await redis.zrange(key, 0, -1)))
        elif kind == "set":
            value = " ".join(map(text, await redis.smembers(key)))
        else:
            value = repr(await redis.dump(key))
        assert "PELICAN" not in value and alice not in name and alice not in value, name
        left.append(name)
    markers = [k for k in left if k.startswith(redis_keys.schedule_run(""))]
    assert redis_keys.schedule_run(f"{j1.id}@{int(T0.timestamp())}") in markers  # a marker: no text
    assert await store.of_user(alice) == [] and await store.timezone_of(alice, "UTC") == "UTC"
    assert [j.id for j in await store.of_user(bob)] == [kept.id]
    assert await store.claim_due(at(10_000), "bot", LEASE, next_after_now) != []  # bob's still runs
    again = await make(store, alice, once(at(400)), at(400))
    assert again.number == 1  # a forgotten user starts over


async def test_time_zones(store: ScheduleStore) -> None:
    someone = user()
    assert await store.timezone_of(someone, "UTC") == "UTC"
    await store.set_timezone(someone, "Europe/Oslo")
    assert await store.timezone_of(someone, "UTC") == "Europe/Oslo"
    for bad in ("Mars/Olympus", "../../etc/passwd", ""):
        with pytest.raises(ValueError):
            await store.set_timezone(someone, bad)
    assert await store.timezone_of(someone, "UTC") == "Europe/Oslo"


async def test_naive_times_are_refused(store: ScheduleStore) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        await store.create(
            owner=user(),
            room_id=ROOM,
            task="x",
            schedule=once(T0),
            next_due=datetime(2030, 1, 1),
            max_per_user=10,
            now=T0,
        )


async def test_a_due_time_between_seconds_runs_at_the_next_second_never_early(store: ScheduleStore) -> None:
    owner = user()
    job = await make(store, owner, once(at(10.3)), at(10.3))  # "in 90s" asked at x.3 s
    assert job.next_due == at(11)
    assert await store.claim_due(at(10.9), "bot", LEASE, next_after_now) == []
    [(claim, claimed)] = await store.claim_due(at(11.5), "bot", LEASE, next_after_now)
    assert (
        claim.due == at(11)
        and claim.lag_seconds == 0.5
        and claim.run_id == f"{job.id}@{int(at(11).timestamp())}"
    )
    assert claimed.next_due is None  # a one-off: nothing due after it
