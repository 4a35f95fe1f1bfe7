"""What a claimed scheduled run does (docs/schedules.md): pure decisions, no I/O.

The scheduler (`scheduler`) claims a due run, gathers the facts (the room's tenant now, who is
joined now, the owner's access as the provider answers now) and asks `decide`: run it, skip it
(fail closed, with a reason the owner and the audit trail read), or report it missed. The
texts the owner is told in a DM are here too, so what they read is tested without Matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal

from vagent_shared.access_provider import UNAVAILABLE_REASONS
from vagent_shared.schedule_store import NextDue
from vagent_shared.schedules import MAX_SKIPS_IN_A_ROW, ScheduledJob

#: Why a run did not run: the `schedule_skipped` audit reason (a code) ...
SkipCode = Literal[
    "missed",
    "no_tenant",
    "tenant_changed",
    "members_unknown",
    "left_room",
    "no_agent_access",
    "provider_unavailable",
    "check_failed",
    "over_budget",
]

#: ... and the sentence the owner reads in `!schedules` (the job's `last_result`).
SKIP_SENTENCES: Final[dict[SkipCode, str]] = {
    "missed": "missed: no bot was running at its time",
    "no_tenant": "skipped: this room belongs to no tenant",
    "tenant_changed": "skipped: this room now belongs to another tenant",
    "members_unknown": "skipped: I could not check that you are still in this room",
    "left_room": "skipped: you are no longer in this room",
    "no_agent_access": "skipped: you no longer have access to this agent",
    "provider_unavailable": "skipped: your access could not be checked (the access service is down)",
    "check_failed": "skipped: your access could not be checked",
    "over_budget": "skipped: your usage budget is spent",
}


@dataclass(frozen=True)
class RunIt:
    """Every check passed: start the run (`ScheduleStore.started`), then post and answer."""


@dataclass(frozen=True)
class Skip:
    """Not run now; `code` goes to the audit trail, `sentence` to the job's last result."""

    code: SkipCode

    @property
    def sentence(self) -> str:
        return SKIP_SENTENCES[self.code]


@dataclass(frozen=True)
class Missed:
    """A one-off whose time passed longer ago than the grace while no bot ran: not run, its
    owner told."""


Verdict = RunIt | Skip | Missed


def is_missed(job: ScheduledJob, due: datetime, now: datetime, grace_seconds: int) -> bool:
    """`due_after_missed` says missed (only a one-off can be: a recurring job runs once late)."""
    from vagent_shared.schedule_times import due_after_missed  # dateparser: imported once, lazily

    return due_after_missed(job.schedule, due, now, grace_seconds).missed


def next_due_policy(grace_seconds: int) -> NextDue:
    """The store's next-due callable: a recurring job's first occurrence after now (several
    missed occurrences run once, never a burst); a one-off has nothing next."""
    from vagent_shared.schedule_times import due_after_missed

    def following(job: ScheduledJob, due: datetime, now: datetime) -> datetime | None:
        return due_after_missed(job.schedule, due, now, grace_seconds).next_due

    return following


def tenant_skip(domain: str | None, job_domain: str | None) -> Skip | None:
    """The room's tenant, as the message path reads it now. A job made in one tenant never
    runs with the rights of another."""
    if domain is None:
        return Skip("no_tenant")
    if job_domain is not None and job_domain != domain:
        return Skip("tenant_changed")
    return None


def membership_skip(owner: str, joined: list[str] | None) -> Skip | None:
    """The owner must still be a joined member: a job never posts into a room its owner left.
    A member list that cannot be had is no proof they are there (fail closed)."""
    if joined is None:
        return Skip("members_unknown")
    if owner not in joined:
        return Skip("left_room")
    return None


def access_skip(allowed: bool, reason: str) -> Skip | None:
    """Agent access exactly as for a message (`AccessProvider.check`), fetched fresh."""
    if allowed:
        return None
    return Skip("provider_unavailable" if reason in UNAVAILABLE_REASONS else "no_agent_access")


def decide(
    job: ScheduledJob,
    due: datetime,
    now: datetime,
    grace_seconds: int,
    *,
    domain: str | None,
    joined: list[str] | None,
    access_allowed: bool,
    access_reason: str,
) -> Verdict:
    """The whole decision for one claimed run, in the order the scheduler asks: missed,
    tenant, membership, access."""
    if is_missed(job, due, now, grace_seconds):
        return Missed()
    return (
        tenant_skip(domain, job.domain)
        or membership_skip(job.owner, joined)
        or access_skip(access_allowed, access_reason)
        or RunIt()
    )


def missed_notice(job: ScheduledJob, due: datetime, tz: str) -> str:
    """The DM to the owner of a one-off that was missed."""
    from vagent_shared.schedule_times import when_text

    return (
        f"⏰ Your task “{_short(job.task)}” scheduled for {when_text(due, tz)} was missed: "
        "no bot was running; it will not run."
    )


def paused_notice(job: ScheduledJob, skip: Skip) -> str:
    """The DM to the owner of a job that paused after MAX_SKIPS_IN_A_ROW skipped runs."""
    return (
        f"⏸️ Your scheduled task {job.number} “{_short(job.task)}” is paused: its last "
        f"{MAX_SKIPS_IN_A_ROW} runs were skipped ({skip.sentence.removeprefix('skipped: ')}). "
        f"Resume it with `!schedule resume {job.number}` once that is fixed."
    )


def failed_result(message: str) -> str:
    """A failed run's last result: the user-presentable error the room was shown."""
    return f"failed: {message}"


#: The last result of a run that answered.
RAN_RESULT: Final = "answered"
#: The last result of a run whose owner stopped its answer (`!stop` in its thread).
STOPPED_BY_OWNER: Final = "stopped with !stop"
#: The last result of a run cut off by its bot's shutdown or death (never run again).
STOPPED_RESULT: Final = "failed: the bot stopped while it ran"


def poll_delay(next_due_epoch: float | None, now_epoch: float, cap: float) -> float:
    """How long the loop sleeps: until the earliest due run, at most `cap`, never negative."""
    if next_due_epoch is None:
        return cap
    return max(0.0, min(cap, next_due_epoch - now_epoch))


def _short(task: str, limit: int = 80) -> str:
    one_line = " ".join(task.split())
    return one_line if len(one_line) <= limit else one_line[: limit - 1] + "…"
