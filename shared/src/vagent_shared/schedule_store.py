"""Scheduled jobs in Redis (docs/schedules.md): each due run claimed exactly once, across bot
restarts, kills and replicas. Pure I/O: when a job is due next is the caller's policy
(`schedule_times`), passed in as a time or a callable; this module only applies it atomically.

Keys (vagent_shared.redis_keys):
- `schedule_job(id)`: the job, a `ScheduledJob` as JSON;
- `SCHEDULE_DUE`: job ids scored by their next due time (whole epoch seconds); a paused or
  finished job is not in it;
- `schedule_jobs_of(user)`: the ids a user owns; `schedule_numbers(user)`: the counter that
  numbers them (INCR: a number is never reused, so `!unschedule 3` always means one job);
- `schedule_run(run_id)`: the run's marker, SET NX at the claim and kept `RUN_MARKER_TTL_SECONDS`:
  `claimed:{claimant}` -> `started:{claimant}` -> the outcome (`ran`, `failed`, `skipped`,
  `missed`), or `cancelled` (its job was deleted or paused before it started). Markers name a job
  id, a time and a bot, never the task's text or its owner;
- `SCHEDULE_CLAIMED`: runs claimed but not started, scored by the end of the claimant's lease;
- `schedule_timezone(user)`: the user's IANA zone.

A run's life: `claim_due` (one Lua call per job: only if the job's score is still the due time
read, it moves the score to the next due, SETs the marker NX and leases the run) -> the caller
checks the owner's rights -> `started` (only the claimant holding the marker may start it, and
only while the job exists and is not paused) -> `finished`. A claimant that dies before
`started` leaves the run in `SCHEDULE_CLAIMED`; once its lease ran out, `take_over` hands it to
exactly one other claimant. One that dies after `started` leaves it started: never run again
(at most once from then on; a run cut off mid-way is not repeated).

Due times are whole epoch seconds (rounded up), so `RunClaim.run_id` (`{job}@{seconds}`)
names exactly one due time. Lease times come from the caller's clock (`now`): replicas' clocks
should agree to well within a lease.

On a Redis error every method raises (redis.RedisError) and what it did is all or nothing
(each write is one script). What a caller sees and should do:
- `create` / `delete` / `pause` / `resume` raise: the user is told it failed; if the write did
  happen (the reply was lost), `!schedules` shows it.
- `claim_due` raises: claims made before the error are lost to this caller, but not to the
  system: they sit in `SCHEDULE_CLAIMED` with this claimant's lease, and `take_over` hands them
  out once it ran out. A run is never lost and never claimed twice.
- `started` raises: do NOT run. If the marker was set to started, nobody runs it (at most once);
  if not, the lease runs out and `take_over` gives it to someone. `started` is idempotent for
  its claimant, so calling it again (redis-py retries) answers the same.
- `finished` raises: the run's result is not recorded; calling it again is safe (idempotent: a
  run whose marker already holds an outcome is not counted twice).
"""

from __future__ import annotations

import math
import uuid
import zoneinfo
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import structlog
from pydantic import ValidationError
from redis.asyncio import Redis

from vagent_shared import redis_keys
from vagent_shared.schedules import (
    MAX_SKIPS_IN_A_ROW,
    JobOrigin,
    RunClaim,
    RunOutcome,
    Schedule,
    ScheduledJob,
)

log = structlog.get_logger(__name__)

#: How long a run's marker is kept: the same (job, due) is never claimed again within it.
RUN_MARKER_TTL_SECONDS: Final = 7 * 24 * 3600
#: How long a job nothing is due for any more (a one-off that ran or was missed) stays listed.
FINISHED_KEEP_SECONDS: Final = 7 * 24 * 3600
#: The longest `last_result` kept (a short sentence for listings).
RESULT_MAX_CHARS: Final = 200
#: How long a started run is leased to its runner unless renewed (`renew_running`): a bot
#: killed mid-run has its run recorded failed this long after its last renewal.
RUN_LEASE_SECONDS: Final = 30.0
#: Jobs read per batch by the operator's `admin_list`.
SCAN_BATCH: Final = 200

#: The caller's next-due policy: (job, the due time just claimed, now) -> the next due time, or
#: None when nothing is due any more. Must return a time after `now` for a job to run again
#: later (a recurring job that missed several occurrences runs once, never a burst).
NextDue = Callable[[ScheduledJob, datetime, datetime], datetime | None]

_MARKER_PREFIX: Final = redis_keys.schedule_run("")
_JOB_PREFIX: Final = redis_keys.schedule_job("")
_USER_PREFIX: Final = redis_keys.schedule_jobs_of("")

# A job counts against its owner's limit while it is live: paused or something still due.
# KEYS: the owner's set, their number counter, the new job's key, the due set.
# ARGV: limit, the job JSON (its number is replaced), job id, due score, job key prefix.
_CREATE = """
local live = 0
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local raw = redis.call('GET', ARGV[5] .. id)
  if raw then
    local j = cjson.decode(raw)
    if j.paused == true or j.next_due ~= cjson.null then live = live + 1 end
  else
    redis.call('SREM', KEYS[1], id)
  end
end
if live >= tonumber(ARGV[1]) then return {0, tostring(live)} end
local job = cjson.decode(ARGV[2])
job.number = redis.call('INCR', KEYS[2])
local body = cjson.encode(job)
redis.call('SET', KEYS[3], body)
redis.call('SADD', KEYS[1], ARGV[3])
redis.call('ZADD', KEYS[4], ARGV[4], ARGV[3])
return {1, body}
"""

# KEYS: the due set, the job, the run's marker, the claimed set. ARGV: job id, the due score
# read, the next score ("" = none), the next due as ISO ("" = none), lease end, marker TTL,
# run id, claimant. Returns the job JSON after the claim, or nil when not claimed.
_CLAIM = """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if (not score) or tonumber(score) ~= tonumber(ARGV[2]) then return false end
local raw = redis.call('GET', KEYS[2])
if not raw then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return false
end
local job = cjson.decode(raw)
if job.paused == true then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return false
end
if ARGV[3] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  job.next_due = cjson.null
else
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
  job.next_due = ARGV[4]
end
local body = cjson.encode(job)
redis.call('SET', KEYS[2], body, 'KEEPTTL')
if not redis.call('SET', KEYS[3], 'claimed:' .. ARGV[8], 'NX', 'EX', ARGV[6]) then
  return false
end
redis.call('ZADD', KEYS[4], ARGV[5], ARGV[7])
return body
"""

# KEYS: the run's marker, the claimed set, the job, the running set. ARGV: run id, claimant,
# lease end. 1: go ahead; 0: not this claimant's to run (taken over, done, or its job
# deleted/paused).
_STARTED = """
local m = redis.call('GET', KEYS[1])
if m == 'started:' .. ARGV[2] then return 1 end
if m ~= 'claimed:' .. ARGV[2] then
  if (not m) or string.sub(m, 1, 8) ~= 'claimed:' then redis.call('ZREM', KEYS[2], ARGV[1]) end
  return 0
end
redis.call('ZREM', KEYS[2], ARGV[1])
local raw = redis.call('GET', KEYS[3])
if (not raw) or cjson.decode(raw).paused == true then
  redis.call('SET', KEYS[1], 'cancelled', 'KEEPTTL')
  return 0
end
redis.call('SET', KEYS[1], 'started:' .. ARGV[2], 'KEEPTTL')
redis.call('ZADD', KEYS[4], ARGV[3], ARGV[1])
return 1
"""

# KEYS: the run's marker, the claimed set, the job, the due set, the running set. ARGV: run
# id, claimant, outcome, result ("" = none), when (ISO), skips that pause, seconds a finished job stays,
# job id. Returns {recorded, paused now, job JSON or ""}.
_FINISHED = """
local m = redis.call('GET', KEYS[1])
if m ~= 'claimed:' .. ARGV[2] and m ~= 'started:' .. ARGV[2] then return {0, 0, ''} end
redis.call('SET', KEYS[1], ARGV[3], 'KEEPTTL')
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
local raw = redis.call('GET', KEYS[3])
if not raw then return {1, 0, ''} end
local job = cjson.decode(raw)
job.last_run_at = ARGV[5]
job.last_outcome = ARGV[3]
if ARGV[4] == '' then job.last_result = cjson.null else job.last_result = ARGV[4] end
if ARGV[3] == 'skipped' then
  job.skips_in_a_row = job.skips_in_a_row + 1
elseif ARGV[3] == 'ran' or ARGV[3] == 'failed' then
  job.skips_in_a_row = 0
end
local paused_now = 0
if ARGV[3] == 'skipped' and job.skips_in_a_row >= tonumber(ARGV[6]) and job.paused ~= true then
  job.paused = true
  job.next_due = cjson.null
  redis.call('ZREM', KEYS[4], ARGV[8])
  paused_now = 1
end
local body = cjson.encode(job)
if job.paused ~= true and job.next_due == cjson.null then
  redis.call('SET', KEYS[3], body, 'EX', ARGV[7])
else
  redis.call('SET', KEYS[3], body, 'KEEPTTL')
end
return {1, paused_now, body}
"""

# KEYS: the running set. ARGV: now, batch, marker prefix. Runs started whose runner's lease
# ran out (it died mid-run): each (run id, claimant) pair handed to exactly one caller, to be
# recorded failed; never run again.
_ABANDONED = """
local runs = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local out = {}
for _, rid in ipairs(runs) do
  redis.call('ZREM', KEYS[1], rid)
  local m = redis.call('GET', ARGV[3] .. rid)
  if m and string.sub(m, 1, 8) == 'started:' then
    table.insert(out, rid)
    table.insert(out, string.sub(m, 9))
  end
end
return out
"""

# KEYS: the claimed set. ARGV: lease end, claimant, marker prefix, then run ids.
_RENEW = """
local n = 0
for i = 4, #ARGV do
  if redis.call('GET', ARGV[3] .. ARGV[i]) == 'claimed:' .. ARGV[2] then
    n = n + redis.call('ZADD', KEYS[1], 'XX', 'CH', ARGV[1], ARGV[i])
  end
end
return n
"""

# KEYS: the claimed set. ARGV: now, lease end, claimant, batch, marker prefix, job prefix.
# Runs whose lease ran out and that nobody started: (run id, job JSON) pairs, re-leased.
_TAKE_OVER = """
local runs = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[4]))
local out = {}
for _, rid in ipairs(runs) do
  local mk = ARGV[5] .. rid
  local m = redis.call('GET', mk)
  if m and string.sub(m, 1, 8) == 'claimed:' then
    local jid = string.match(rid, '^(.+)@%-?%d+$')
    local raw = false
    if jid then raw = redis.call('GET', ARGV[6] .. jid) end
    if raw and cjson.decode(raw).paused ~= true then
      redis.call('SET', mk, 'claimed:' .. ARGV[3], 'KEEPTTL')
      redis.call('ZADD', KEYS[1], ARGV[2], rid)
      table.insert(out, rid)
      table.insert(out, raw)
    else
      redis.call('SET', mk, 'cancelled', 'KEEPTTL')
      redis.call('ZREM', KEYS[1], rid)
    end
  else
    redis.call('ZREM', KEYS[1], rid)
  end
end
return out
"""

# KEYS: the job, the due set. ARGV: job id, owners' set prefix, the owner ("" = anyone's).
_DELETE = """
local raw = redis.call('GET', KEYS[1])
if not raw then return false end
local job = cjson.decode(raw)
if ARGV[3] ~= '' and job.owner ~= ARGV[3] then return false end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('SREM', ARGV[2] .. job.owner, ARGV[1])
return raw
"""

# KEYS: the job, the due set. ARGV: job id, owner. Pauses a job that has something due.
_PAUSE = """
local raw = redis.call('GET', KEYS[1])
if not raw then return false end
local job = cjson.decode(raw)
if job.owner ~= ARGV[2] then return false end
if job.paused == true or job.next_due == cjson.null then return raw end
job.paused = true
job.next_due = cjson.null
redis.call('ZREM', KEYS[2], ARGV[1])
local body = cjson.encode(job)
redis.call('SET', KEYS[1], body, 'KEEPTTL')
return body
"""

# KEYS: the job, the due set. ARGV: job id, owner, next score, next due (ISO).
_RESUME = """
local raw = redis.call('GET', KEYS[1])
if not raw then return false end
local job = cjson.decode(raw)
if job.owner ~= ARGV[2] then return false end
if job.paused ~= true then return raw end
job.paused = false
job.skips_in_a_row = 0
job.next_due = ARGV[4]
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
local body = cjson.encode(job)
redis.call('SET', KEYS[1], body)
return body
"""

# KEYS: the owner's set, the due set, their number counter, their time zone. ARGV: job prefix.
_FORGET = """
local n = 0
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  n = n + redis.call('DEL', ARGV[1] .. id)
  redis.call('ZREM', KEYS[2], id)
end
redis.call('DEL', KEYS[1], KEYS[3], KEYS[4])
return n
"""


@dataclass(frozen=True)
class LimitReached:
    """`create` refused: the owner already has `limit` live jobs (paused ones count; one-offs
    that already ran do not)."""

    limit: int
    live: int


@dataclass(frozen=True)
class Finished:
    """What `finished` recorded. `recorded` False: the run was not this claimant's (taken
    over, or already finished): nothing changed. `job` None: the job is gone (deleted
    meanwhile; it is not written back). `paused_now`: this run was the
    MAX_SKIPS_IN_A_ROW-th skip in a row and paused the job: tell its owner in a DM."""

    recorded: bool
    job: ScheduledJob | None = None
    paused_now: bool = False


def due_seconds(when: datetime) -> int:
    """A due time as the whole epoch second it is stored as (rounded up, so a run never fires
    early and the next due after a claimed one is always a later second)."""
    if when.tzinfo is None:
        raise ValueError("schedule times must be timezone-aware")
    return math.ceil(when.timestamp())


def _at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).isoformat()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _job(raw: Any) -> ScheduledJob | None:
    if raw is None or raw is False:
        return None
    try:
        return ScheduledJob.model_validate_json(raw)
    except ValidationError:
        log.warning("schedule_job_unreadable")
        return None


def _run_parts(run_id: str) -> tuple[str, datetime]:
    job_id, _, seconds = run_id.rpartition("@")
    return job_id, _at(int(seconds))


class ScheduleStore:
    """Scheduled jobs and their runs in Redis. Owner-facing methods take the owner and their
    job number: another user's number never reaches someone else's job."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._create = redis.register_script(_CREATE)
        self._claim = redis.register_script(_CLAIM)
        self._started = redis.register_script(_STARTED)
        self._finished = redis.register_script(_FINISHED)
        self._renew = redis.register_script(_RENEW)
        self._take_over = redis.register_script(_TAKE_OVER)
        self._abandoned = redis.register_script(_ABANDONED)
        self._delete = redis.register_script(_DELETE)
        self._pause = redis.register_script(_PAUSE)
        self._resume = redis.register_script(_RESUME)
        self._forget = redis.register_script(_FORGET)

    # ---- creating, reading, changing ------------------------------------------------------

    async def create(
        self,
        *,
        owner: str,
        room_id: str,
        task: str,
        schedule: Schedule,
        next_due: datetime,
        max_per_user: int,
        now: datetime,
        domain: str | None = None,
        thread_root: str | None = None,
        origin: JobOrigin = "command",
    ) -> ScheduledJob | LimitReached:
        """A new job of `owner`, first due at `next_due` (the caller's policy checked it), with
        the owner's next number; atomically refused when they already have `max_per_user` live
        jobs. Raises pydantic's ValidationError for a task that is empty or too long."""
        score = due_seconds(next_due)
        job = ScheduledJob(
            id=_new_id(),
            number=1,  # the script gives the real one
            owner=owner,
            domain=domain,
            room_id=room_id,
            thread_root=thread_root,
            task=task,
            schedule=schedule,
            origin=origin,
            created_at=now,
            next_due=_at(score),
        )
        ok, body = await self._create(
            keys=[
                redis_keys.schedule_jobs_of(owner),
                redis_keys.schedule_numbers(owner),
                redis_keys.schedule_job(job.id),
                redis_keys.SCHEDULE_DUE,
            ],
            args=[max_per_user, job.model_dump_json(), job.id, score, _JOB_PREFIX],
        )
        if not int(ok):
            return LimitReached(limit=max_per_user, live=int(_text(body)))
        created = _job(body)
        assert created is not None
        return created

    async def get(self, job_id: str) -> ScheduledJob | None:
        return _job(await self.redis.get(redis_keys.schedule_job(job_id)))

    async def of_user(self, owner: str) -> list[ScheduledJob]:
        """The owner's jobs by number (paused and recently finished ones included)."""
        ids = [_text(i) for i in await self.redis.smembers(redis_keys.schedule_jobs_of(owner))]
        if not ids:
            return []
        raws = await self.redis.mget([redis_keys.schedule_job(i) for i in ids])
        jobs = [j for j in map(_job, raws) if j is not None and j.owner == owner]
        return sorted(jobs, key=lambda j: j.number)

    async def by_number(self, owner: str, number: int) -> ScheduledJob | None:
        return next((j for j in await self.of_user(owner) if j.number == number), None)

    async def in_room(self, owner: str, room_id: str) -> list[ScheduledJob]:
        """The owner's jobs made in `room_id` (`!schedules` in a room; in a DM: `of_user`)."""
        return [j for j in await self.of_user(owner) if j.room_id == room_id]

    async def delete(self, owner: str, number: int) -> ScheduledJob | None:
        """Deletes the owner's job `number`; None when they have no such job. A run of it
        already claimed but not started is not started (`started` says False)."""
        job = await self.by_number(owner, number)
        return None if job is None else await self._delete_id(job.id, owner)

    async def pause(self, owner: str, number: int) -> ScheduledJob | None:
        """Pauses the owner's job `number` (out of the due set); the job as it is now, or None
        when they have no such job. A job with nothing due (a one-off that ran) is returned
        unchanged (`paused` stays False)."""
        job = await self.by_number(owner, number)
        if job is None:
            return None
        return _job(
            await self._pause(
                keys=[redis_keys.schedule_job(job.id), redis_keys.SCHEDULE_DUE], args=[job.id, owner]
            )
        )

    async def resume(self, owner: str, number: int, next_due: datetime) -> ScheduledJob | None:
        """Resumes the owner's paused job `number` at `next_due` (the caller computes it from
        now), its skips in a row back to 0. A job that was not paused is returned unchanged."""
        job = await self.by_number(owner, number)
        if job is None:
            return None
        score = due_seconds(next_due)
        return _job(
            await self._resume(
                keys=[redis_keys.schedule_job(job.id), redis_keys.SCHEDULE_DUE],
                args=[job.id, owner, score, _iso(_at(score))],
            )
        )

    async def delete_all_of(self, owner: str) -> int:
        """Erasure (`vagent admin forget`): every job of `owner`, their number counter and
        time zone. Run markers stay until they expire; they hold no text and no user id.
        Returns how many jobs were deleted."""
        return int(
            await self._forget(
                keys=[
                    redis_keys.schedule_jobs_of(owner),
                    redis_keys.SCHEDULE_DUE,
                    redis_keys.schedule_numbers(owner),
                    redis_keys.schedule_timezone(owner),
                ],
                args=[_JOB_PREFIX],
            )
        )

    async def admin_list(self) -> list[ScheduledJob]:
        """Every job of every user, by owner then number (`vagent schedules list`)."""
        jobs: list[ScheduledJob] = []
        pattern = redis_keys.glob_escape(_JOB_PREFIX) + "*"
        batch: list[Any] = []
        async for key in self.redis.scan_iter(match=pattern, count=SCAN_BATCH):
            batch.append(key)
            if len(batch) >= SCAN_BATCH:
                jobs += [j for j in map(_job, await self.redis.mget(batch)) if j is not None]
                batch = []
        if batch:
            jobs += [j for j in map(_job, await self.redis.mget(batch)) if j is not None]
        return sorted(jobs, key=lambda j: (j.owner, j.number))

    async def admin_delete(self, job_id: str) -> ScheduledJob | None:
        """Deletes any user's job by id (`vagent schedules delete`, superusers only)."""
        return await self._delete_id(job_id, "")

    async def _delete_id(self, job_id: str, owner: str) -> ScheduledJob | None:
        raw = await self._delete(
            keys=[redis_keys.schedule_job(job_id), redis_keys.SCHEDULE_DUE],
            args=[job_id, _USER_PREFIX, owner],
        )
        return _job(raw)

    # ---- running ---------------------------------------------------------------------------

    async def claim_due(
        self,
        now: datetime,
        claimant: str,
        lease_seconds: float,
        next_due: NextDue,
        limit: int = 50,
    ) -> list[tuple[RunClaim, ScheduledJob]]:
        """Claims up to `limit` runs due at `now`, each for this claimant only: the job's due
        score moves to `next_due(job, due, now)` (out of the due set when None) in the same
        atomic step. A job deleted, paused or claimed by someone else since it was read is not
        claimed. The jobs returned carry their new `next_due`. Call `started` before running
        each one, then `finished`; `renew` while deciding takes longer than the lease."""
        now_s = now.timestamp()
        due: list[Any] = await self.redis.zrangebyscore(
            redis_keys.SCHEDULE_DUE, "-inf", now_s, start=0, num=limit, withscores=True
        )
        claims: list[tuple[RunClaim, ScheduledJob]] = []
        for raw_id, score in due:
            job_id, due_s = _text(raw_id), int(score)
            job = await self.get(job_id)
            if job is None:
                continue
            due_at = _at(due_s)
            try:
                following = next_due(job, due_at, now)
            except Exception as exc:  # one broken job must not stop the others
                log.warning("schedule_next_due_failed", job_id=job_id, error_type=type(exc).__name__)
                continue
            next_s = due_seconds(following) if following is not None else None
            if next_s is not None and next_s <= due_s:
                log.warning("schedule_next_due_not_later", job_id=job_id)
                continue
            claim = RunClaim(
                job_id=job_id, due=due_at, lag_seconds=max(0.0, now_s - due_s), claimant=claimant
            )
            body = await self._claim(
                keys=[
                    redis_keys.SCHEDULE_DUE,
                    redis_keys.schedule_job(job_id),
                    redis_keys.schedule_run(claim.run_id),
                    redis_keys.SCHEDULE_CLAIMED,
                ],
                args=[
                    job_id,
                    due_s,
                    "" if next_s is None else next_s,
                    "" if next_s is None else _iso(_at(next_s)),
                    now_s + lease_seconds,
                    RUN_MARKER_TTL_SECONDS,
                    claim.run_id,
                    claimant,
                ],
            )
            claimed = _job(body)
            if claimed is not None:
                claims.append((claim, claimed))
        return claims

    async def started(
        self, claim: RunClaim, now: datetime | None = None, lease_seconds: float = RUN_LEASE_SECONDS
    ) -> bool:
        """True: run it now (the run is marked started and can never be handed out again;
        it is leased for `lease_seconds`, renewed with `renew_running` while it answers).
        False: do not run it: another claimant took it over, it is done, or its job was
        deleted or paused since the claim. On a Redis error: do not run it (see the module)."""
        at = (now or datetime.now(UTC)).timestamp()
        return bool(
            await self._started(
                keys=[
                    redis_keys.schedule_run(claim.run_id),
                    redis_keys.SCHEDULE_CLAIMED,
                    redis_keys.schedule_job(claim.job_id),
                    redis_keys.SCHEDULE_RUNNING,
                ],
                args=[claim.run_id, claim.claimant, at + lease_seconds],
            )
        )

    async def renew_running(self, claims: list[RunClaim], now: datetime, lease_seconds: float) -> int:
        """Extends the lease of runs this process still answers (those not yet recorded
        abandoned: XX never re-adds one); how many."""
        if not claims:
            return 0
        lease_end = now.timestamp() + lease_seconds
        mapping = {claim.run_id: lease_end for claim in claims}
        return int(await self.redis.zadd(redis_keys.SCHEDULE_RUNNING, mapping, xx=True, ch=True) or 0)

    async def abandoned(self, now: datetime, limit: int = 50) -> list[RunClaim]:
        """Runs started whose runner's lease ran out by `now` (its bot died mid-run), each
        handed to exactly one caller, with the dead claimant: record them with `finished`
        ("failed"). They are never run again."""
        flat = await self._abandoned(
            keys=[redis_keys.SCHEDULE_RUNNING], args=[now.timestamp(), limit, _MARKER_PREFIX]
        )
        out: list[RunClaim] = []
        for raw_id, raw_claimant in zip(flat[::2], flat[1::2], strict=True):
            job_id, due = _run_parts(_text(raw_id))
            out.append(RunClaim(job_id=job_id, due=due, claimant=_text(raw_claimant)))
        return out

    async def finished(
        self, claim: RunClaim, outcome: RunOutcome, result: str | None, now: datetime
    ) -> Finished:
        """Records how the run ended, on its marker and its job (`last_run_at`, `last_outcome`,
        `last_result`; `skips_in_a_row` +1 on "skipped", back to 0 on "ran"/"failed", kept on
        "missed"). The MAX_SKIPS_IN_A_ROW-th skip in a row pauses the job in the same step
        (`paused_now`). Also for a run decided without `started` (skipped, missed). A deleted
        job is not written back; a job with nothing due any more is kept
        FINISHED_KEEP_SECONDS for listings. `result` is a short sentence, never a secret."""
        recorded, paused_now, body = await self._finished(
            keys=[
                redis_keys.schedule_run(claim.run_id),
                redis_keys.SCHEDULE_CLAIMED,
                redis_keys.schedule_job(claim.job_id),
                redis_keys.SCHEDULE_DUE,
                redis_keys.SCHEDULE_RUNNING,
            ],
            args=[
                claim.run_id,
                claim.claimant,
                outcome,
                (result or "")[:RESULT_MAX_CHARS],
                _iso(now),
                MAX_SKIPS_IN_A_ROW,
                FINISHED_KEEP_SECONDS,
                claim.job_id,
            ],
        )
        return Finished(
            recorded=bool(int(recorded)), job=_job(body or None), paused_now=bool(int(paused_now))
        )

    async def renew(self, claims: list[RunClaim], now: datetime, lease_seconds: float) -> int:
        """Extends the lease of runs still claimed (not started) by their claimant; how many."""
        renewed = 0
        by_claimant: dict[str, list[str]] = {}
        for claim in claims:
            by_claimant.setdefault(claim.claimant, []).append(claim.run_id)
        for claimant, run_ids in by_claimant.items():
            renewed += int(
                await self._renew(
                    keys=[redis_keys.SCHEDULE_CLAIMED],
                    args=[now.timestamp() + lease_seconds, claimant, _MARKER_PREFIX, *run_ids],
                )
            )
        return renewed

    async def take_over(
        self, now: datetime, claimant: str, lease_seconds: float, limit: int = 50
    ) -> list[tuple[RunClaim, ScheduledJob]]:
        """Runs claimed but never started whose lease ran out by `now` (their claimant died),
        each handed to exactly one caller, leased to `claimant`: then `started`, `finished` as
        for `claim_due`. Runs started or finished are never handed out again; runs of a job
        deleted or paused meanwhile are cancelled."""
        flat = await self._take_over(
            keys=[redis_keys.SCHEDULE_CLAIMED],
            args=[
                now.timestamp(),
                now.timestamp() + lease_seconds,
                claimant,
                limit,
                _MARKER_PREFIX,
                _JOB_PREFIX,
            ],
        )
        taken: list[tuple[RunClaim, ScheduledJob]] = []
        for raw_id, raw in zip(flat[::2], flat[1::2], strict=True):
            job = _job(raw)
            if job is None:
                continue
            job_id, due_at = _run_parts(_text(raw_id))
            lag = max(0.0, now.timestamp() - due_at.timestamp())
            taken.append((RunClaim(job_id=job_id, due=due_at, lag_seconds=lag, claimant=claimant), job))
        return taken

    async def run_state(self, claim: RunClaim) -> str | None:
        """The run's marker (`claimed:…`, `started:…`, an outcome, `cancelled`), None if none."""
        raw = await self.redis.get(redis_keys.schedule_run(claim.run_id))
        return None if raw is None else _text(raw)

    # ---- time zones -----------------------------------------------------------------------

    async def set_timezone(self, user: str, tz: str) -> None:
        """Sets the user's zone; ValueError for a name zoneinfo does not know."""
        try:
            zoneinfo.ZoneInfo(tz)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown time zone {tz!r}") from exc
        await self.redis.set(redis_keys.schedule_timezone(user), tz)

    async def timezone_of(self, user: str, default: str) -> str:
        raw = await self.redis.get(redis_keys.schedule_timezone(user))
        return default if raw is None else _text(raw)


def _new_id() -> str:
    return uuid.uuid4().hex
