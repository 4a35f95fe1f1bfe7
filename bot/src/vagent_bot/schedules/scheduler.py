"""The bot's scheduler (docs/schedules.md): due jobs run as a new turn of their owner, with
their rights checked again at every run, exactly once across restarts and replicas.

Every bot replica runs one `Scheduler`. Its loop claims due runs (`ScheduleStore.claim_due`:
atomic, leased to this process), takes over runs whose claimant died before starting them
(`take_over`), and keeps the leases of runs still being checked (`renew`). Each claimed run
then: missed? (a one-off too late: its owner is told) -> the checks, fail closed (the room's
tenant, the owner still joined, agent access fetched fresh from the provider, the room's
audience: `schedule_runs.decide`) -> `started` (only then, and only once, does it run) ->
"⏰ Scheduled: TASK" posted -> the task answered as the owner's turn, replying to that line
(`Conversations.run_scheduled`) -> `finished`. A run started is never started again, not even
by this process after a crash: the store's marker says so.

The Matrix side (checks, posting, the turn, DMs) is the `RunSide` protocol, so the claim
logic runs against a real Redis in tests without a homeserver; `MatrixSide` is the real one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Protocol

import structlog
from nio import AsyncClient, RoomCreateResponse
from redis.exceptions import RedisError

from vagent_bot.access.audience import joined_members
from vagent_bot.answers.event_content import message_content
from vagent_bot.conversation.conversations import Conversations
from vagent_bot.matrix import client as matrix
from vagent_bot.observability import metrics
from vagent_bot.schedules.runs import (
    RAN_RESULT,
    SKIP_SENTENCES,
    STOPPED_BY_OWNER,
    STOPPED_RESULT,
    Skip,
    access_skip,
    failed_result,
    is_missed,
    membership_skip,
    missed_notice,
    next_due_policy,
    paused_notice,
    poll_delay,
    tenant_skip,
)
from vagent_shared import redis_keys
from vagent_shared.access_provider import AccessResult
from vagent_shared.audit import AuditEventType, Decision
from vagent_shared.audit_trail import AuditTrail
from vagent_shared.knowledge import Audience
from vagent_shared.schedule_store import ScheduleStore
from vagent_shared.schedules import SCHEDULED, RunClaim, RunOutcome, ScheduledJob
from vagent_shared.settings import BotSettings

log = structlog.get_logger(__name__)

#: How long a claim is leased while its checks run (renewed while they take longer).
LEASE_SECONDS: Final = 30.0
#: The longest sleep between two looks at the due set.
POLL_SECONDS: Final = 1.0
#: How often runs abandoned by a dead claimant are looked for.
TAKE_OVER_SECONDS: Final = 5.0
#: Runs one process handles at the same time (more wait in Redis for the next look).
MAX_IN_FLIGHT: Final = 20


@dataclass(frozen=True)
class Allowed:
    """The checks passed: the owner's fresh access and the room's audience right now."""

    access: AccessResult
    audience: Audience | None


class RunSide(Protocol):
    """Everything a run does outside Redis."""

    async def ready(self) -> None:
        """Returns once runs can be checked and posted (the first sync is done)."""

    async def check(self, job: ScheduledJob) -> Allowed | Skip:
        """The owner's rights and the room's readers, fetched fresh (fail closed)."""

    async def run(
        self, job: ScheduledJob, claim: RunClaim, allowed: Allowed
    ) -> tuple[RunOutcome, str] | Skip:
        """Posts the ⏰ line and answers the task; ("ran" | "failed", a short result), or a
        Skip when the graph refused the turn on the owner's budget (the room saw the notice)."""

    async def tell(self, owner: str, text: str) -> None:
        """A direct message to the owner (missed, paused)."""


def claimant_id() -> str:
    """This process, as the run markers name it: host, pid, and a random part (a pid is
    reused after a restart; a restarted bot must not pass for the one that died)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _now() -> datetime:
    return datetime.now(UTC)



def reraise_if_cancelled(exc: BaseException | None = None) -> None:
    """End the task if it was asked to: a command cut off by a cancel (shutdown, or a kill in
    tests) can surface from redis-py as a ConnectionError, and on Python 3.11 a timeout that
    fires together with a cancel may swallow it; the request is still counted on the task."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from exc

class Scheduler:
    """The loop of one bot process. `run()` until `stop()`."""

    def __init__(
        self,
        store: ScheduleStore,
        side: RunSide,
        *,
        grace_seconds: int,
        audit: AuditTrail | None = None,
        claimant: str | None = None,
        lease_seconds: float = LEASE_SECONDS,
        poll_seconds: float = POLL_SECONDS,
        take_over_seconds: float = TAKE_OVER_SECONDS,
        max_in_flight: int = MAX_IN_FLIGHT,
        clock: Callable[[], datetime] = _now,
    ) -> None:
        self.store, self.side, self.audit = store, side, audit
        self.claimant = claimant or claimant_id()
        self.grace_seconds = grace_seconds
        self.lease, self.poll, self.take_over_every = lease_seconds, poll_seconds, take_over_seconds
        self.max_in_flight, self.clock = max_in_flight, clock
        self._next_due = next_due_policy(grace_seconds)
        self._stopping = asyncio.Event()
        #: Runs this process is handling, by run id (never two tasks for one run).
        self._runs: dict[str, asyncio.Task[None]] = {}
        #: Claims still being checked (not started): their leases are renewed.
        self._checking: dict[str, RunClaim] = {}
        #: Runs started and answering: their leases are renewed (a dead bot's run out).
        self._answering: dict[str, RunClaim] = {}
        #: Loop rounds done (tests wait on it instead of on the clock).
        self.rounds = 0

    # ---- the loop --------------------------------------------------------------------------
    async def run(self) -> None:
        """Claim, take over, renew, sleep; until stop(). A Redis error costs one round."""
        await self.side.ready()
        import vagent_shared.schedule_times  # noqa: F401 (dateparser: ~0.3 s, once, now)

        log.info("scheduler_started", claimant=self.claimant)
        last_take_over = last_renew = 0.0
        while not self._stopping.is_set():
            reraise_if_cancelled()
            try:
                now = self.clock()
                room = self.max_in_flight - len(self._runs)
                if room > 0:
                    for claim, job in await self.store.claim_due(
                        now, self.claimant, self.lease, self._next_due, limit=room
                    ):
                        self._start(claim, job)
                if time.monotonic() - last_take_over >= self.take_over_every:
                    last_take_over = time.monotonic()
                    for claim, job in await self.store.take_over(now, self.claimant, self.lease):
                        self._start(claim, job)
                    for claim in await self.store.abandoned(now):
                        await self._abandoned(claim)
                if (self._checking or self._answering) and time.monotonic() - last_renew >= self.lease / 3:
                    last_renew = time.monotonic()
                    await self.store.renew(list(self._checking.values()), self.clock(), self.lease)
                    answering = list(self._answering.values())
                    await self.store.renew_running(answering, self.clock(), self.lease)
                delay = poll_delay(await self._earliest_due(), self.clock().timestamp(), self.poll)
            except RedisError as exc:
                reraise_if_cancelled(exc)
                log.warning("scheduler_redis_failed", error_type=type(exc).__name__)
                delay = self.poll
            self.rounds += 1
            # asyncio.timeout, not wait_for: on 3.11 wait_for may swallow a cancel (a kill)
            # that comes with its timeout, and the loop would go on
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(delay, 0.05)):
                    await self._stopping.wait()

    async def _earliest_due(self) -> float | None:
        first = await self.store.redis.zrange(redis_keys.SCHEDULE_DUE, 0, 0, withscores=True)
        return float(first[0][1]) if first else None

    async def stop(self, grace_seconds: float = 20.0) -> None:
        """Shutdown: no new claims. Runs being checked are dropped (their lease runs out and
        another replica takes them over); runs started get `grace_seconds` to finish, then
        are cancelled and recorded failed: a started run is never started again."""
        self._stopping.set()
        running = list(self._runs.values())
        if running:
            await asyncio.wait(running, timeout=grace_seconds)
        for task in list(self._runs.values()):
            task.cancel()
        await asyncio.gather(*self._runs.values(), return_exceptions=True)

    def _start(self, claim: RunClaim, job: ScheduledJob) -> None:
        if claim.run_id in self._runs:  # our own claim, re-leased by take_over: already handled
            return
        self._checking[claim.run_id] = claim
        task = asyncio.create_task(self._handle(claim, job), name=f"schedule:{claim.run_id}")
        self._runs[claim.run_id] = task
        task.add_done_callback(lambda _: self._runs.pop(claim.run_id, None))

    # ---- one run ---------------------------------------------------------------------------
    async def _handle(self, claim: RunClaim, job: ScheduledJob) -> None:
        structlog.contextvars.bind_contextvars(run_id=claim.run_id, job_id=job.id)
        try:
            if is_missed(job, claim.due, self.clock(), self.grace_seconds):
                await self._missed(claim, job)
                return
            try:
                verdict: Allowed | Skip = await self.side.check(job)
            except Exception:
                log.exception("schedule_check_failed")
                verdict = Skip("check_failed")
            if isinstance(verdict, Skip):
                await self._skipped(claim, job, verdict)
                return
            reraise_if_cancelled()
            if self._stopping.is_set():
                return  # not started: the lease runs out and another replica takes it over
            if not await self.store.started(claim, self.clock(), self.lease):
                log.info("schedule_run_not_started")  # taken over, deleted or paused meanwhile
                return
            self._checking.pop(claim.run_id, None)
            self._answering[claim.run_id] = claim
            await self._run(claim, job, verdict)
        except RedisError as exc:
            reraise_if_cancelled(exc)
            # before `started`: the lease runs out, someone takes it over; after: never again
            log.warning("schedule_run_redis_failed", error_type=type(exc).__name__)
        finally:
            self._checking.pop(claim.run_id, None)
            self._answering.pop(claim.run_id, None)
            structlog.contextvars.unbind_contextvars("run_id", "job_id")

    async def _run(self, claim: RunClaim, job: ScheduledJob, allowed: Allowed) -> None:
        lag = max(0.0, self.clock().timestamp() - claim.due.timestamp())
        metrics.SCHEDULE_LAG.observe(lag)
        log.info("schedule_run_started", lag_seconds=round(lag, 3))
        outcome: RunOutcome = "failed"
        result = STOPPED_RESULT
        skip: Skip | None = None
        try:
            ended = await self.side.run(job, claim, allowed)
            if isinstance(ended, Skip):
                skip = ended
            else:
                outcome, result = ended
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("schedule_run_failed")
            outcome, result = "failed", failed_result("something went wrong")
        finally:
            # recorded even when cancelled by a shutdown (shielded: it must not be cut off)
            if skip is not None:
                await asyncio.shield(self._skipped(claim, job, skip))
            else:
                await asyncio.shield(self._record_run(claim, job, outcome, result, lag))

    async def _record_run(
        self, claim: RunClaim, job: ScheduledJob, outcome: RunOutcome, result: str, lag: float
    ) -> None:
        metrics.SCHEDULE_RUNS.labels(outcome).inc()
        decision: Decision = "done" if outcome == "ran" else "error"
        self._audit("schedule_run", job, claim, decision, outcome, lag_seconds=round(lag, 3))
        try:
            await self.store.finished(claim, outcome, result, self.clock())
        except RedisError as exc:
            log.warning("schedule_finish_failed", error_type=type(exc).__name__)

    async def _abandoned(self, claim: RunClaim) -> None:
        """A run whose bot died while it answered: recorded failed (the room saw a cut-off
        answer), never run again."""
        done = await self.store.finished(claim, "failed", STOPPED_RESULT, self.clock())
        if not done.recorded or done.job is None:
            return
        metrics.SCHEDULE_RUNS.labels("failed").inc()
        log.warning("schedule_run_abandoned", run_id=claim.run_id, dead_claimant=claim.claimant)
        self._audit("schedule_run", done.job, claim, "error", "abandoned")

    async def _missed(self, claim: RunClaim, job: ScheduledJob) -> None:
        done = await self.store.finished(claim, "missed", SKIP_SENTENCES["missed"], self.clock())
        if not done.recorded:
            return
        metrics.SCHEDULE_RUNS.labels("missed").inc()
        self._audit("schedule_skipped", job, claim, "denied", "missed")
        tz = job.schedule.tz
        await self._tell(job.owner, missed_notice(job, claim.due, tz))

    async def _skipped(self, claim: RunClaim, job: ScheduledJob, skip: Skip) -> None:
        done = await self.store.finished(claim, "skipped", skip.sentence, self.clock())
        if not done.recorded:
            return
        metrics.SCHEDULE_RUNS.labels("skipped").inc()
        log.info("schedule_run_skipped", reason=skip.code)
        self._audit("schedule_skipped", job, claim, "denied", skip.code)
        if done.paused_now:
            self._audit("schedule_paused", job, claim, "done", f"{skip.code} (skipped runs in a row)")
            await self._tell(job.owner, paused_notice(job, skip))

    async def _tell(self, owner: str, text: str) -> None:
        try:
            await self.side.tell(owner, text)
        except Exception:
            log.exception("schedule_tell_failed")

    def _audit(
        self,
        event_type: AuditEventType,
        job: ScheduledJob,
        claim: RunClaim,
        decision: Decision,
        reason: str,
        **extra: object,
    ) -> None:
        """One audit record: job id, number, due time and run id; the task's text only as
        AUDIT_INCLUDE_CONTENT allows (otherwise its length)."""
        if self.audit is None:
            return
        task: dict[str, object] = (
            {"task": job.task} if self.audit.include_content else {"task_chars": len(job.task)}
        )
        self.audit.record(
            event_type,
            user_id=job.owner,
            domain=job.domain,
            resource=f"schedule:{job.id}",
            decision=decision,
            reason=reason,
            metadata={
                "job_id": job.id,
                "number": job.number,
                "room_id": job.room_id,
                "due": claim.due.isoformat(),
                "run_id": claim.run_id,
                **task,
                **extra,
            },
        )


class MatrixSide:
    """The real `RunSide`: the checks as the message path makes them, posting and the turn
    through `Conversations`, DMs to owners."""

    def __init__(self, client: AsyncClient, conversations: Conversations, settings: BotSettings) -> None:
        self.client, self.conversations, self.settings = client, conversations, settings
        self._dms: dict[str, str] = {}

    async def ready(self) -> None:
        await self.client.synced.wait()

    async def check(self, job: ScheduledJob) -> Allowed | Skip:
        conv = self.conversations
        domain = await conv.tenants.domain(job.room_id)
        skip = tenant_skip(domain, job.domain)
        if skip is not None or domain is None:
            return skip or Skip("no_tenant")
        skip = membership_skip(job.owner, await joined_members(self.client, job.room_id))
        if skip is not None:
            return skip
        access = await conv.access.check(job.owner, domain)
        skip = access_skip(access.allowed and access.ac is not None, access.reason)
        if skip is not None:
            return skip
        return Allowed(access, await conv.resolve_audience(job.room_id, job.owner))

    async def run(
        self, job: ScheduledJob, claim: RunClaim, allowed: Allowed
    ) -> tuple[RunOutcome, str] | Skip:
        """The ⏰ line in the job's room (in its thread if it had one), then the answer as a
        reply to it: in the job's thread, or in a thread the ⏰ line starts (the room's main
        timeline stays one line per run; a confirmation is asked, and answered, in there).
        Messages get transaction ids from the run's identity (`matrix.handling`)."""
        with matrix.handling(claim.run_id):
            content = message_content(SCHEDULED + job.task, thread_root=job.thread_root)
            clock_line = await matrix.send(self.client, job.room_id, content)
            if clock_line is None:
                return "failed", failed_result("the ⏰ line could not be posted")
            ended = await self.conversations.run_scheduled(
                owner=job.owner,
                room_id=job.room_id,
                thread_root=job.thread_root or clock_line,
                reply_to=clock_line,
                text=job.task,
                access=allowed.access,
                audience=allowed.audience,
                sent_at=claim.due.timestamp(),
            )
        if ended.over_budget:
            return Skip("over_budget")
        if ended.stopped:
            return "ran", STOPPED_BY_OWNER
        return ("ran", RAN_RESULT) if ended.failure is None else ("failed", failed_result(ended.failure))

    async def tell(self, owner: str, text: str) -> None:
        room_id = await self._dm_with(owner)
        if room_id is not None:
            await matrix.send(self.client, room_id, message_content(text))

    async def _dm_with(self, owner: str) -> str | None:
        """A room of just the bot and the owner: one the bot is in already, else a new one
        the owner is invited to."""
        if owner in self._dms:
            return self._dms[owner]
        for room in self.client.rooms.values():
            if room.member_count == 2 and owner in room.users:
                self._dms[owner] = str(room.room_id)
                return self._dms[owner]
        resp = await self.client.room_create(is_direct=True, invite=[owner])
        if not isinstance(resp, RoomCreateResponse):
            log.warning("schedule_dm_failed", error=getattr(resp, "status_code", type(resp).__name__))
            return None
        self._dms[owner] = str(resp.room_id)
        return self._dms[owner]
