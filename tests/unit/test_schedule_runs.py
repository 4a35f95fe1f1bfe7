"""What a claimed scheduled run does (vagent_bot.schedules.runs): run, skip with a reason
(fail closed), or missed; and what the owner is told."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from vagent_bot.schedules.runs import (
    Missed,
    RunIt,
    Skip,
    decide,
    missed_notice,
    next_due_policy,
    paused_notice,
    poll_delay,
)
from vagent_shared.schedules import Schedule, ScheduledJob

T0 = datetime(2030, 1, 7, 9, 0, tzinfo=UTC)
OWNER = "@alice:localhost"
GRACE = 3600


def job(schedule: Schedule, domain: str | None = "localhost") -> ScheduledJob:
    return ScheduledJob(
        id="j1",
        number=3,
        owner=OWNER,
        domain=domain,
        room_id="!room:localhost",
        task="list my open tickets",
        schedule=schedule,
        created_at=T0 - timedelta(days=1),
        next_due=T0,
    )


ONCE = Schedule(kind="at", at=T0, text="at 09:00")
HOURLY = Schedule(kind="every", every_seconds=3600, anchor=T0, text="every 1h")


def verdict(
    j: ScheduledJob,
    *,
    late: float = 1.0,
    domain: str | None = "localhost",
    joined: list[str] | None = None,
    allowed: bool = True,
    reason: str = "granted",
) -> RunIt | Skip | Missed:
    members = [OWNER, "@vagent:localhost"] if joined is None else joined
    return decide(
        j,
        T0,
        T0 + timedelta(seconds=late),
        GRACE,
        domain=domain,
        joined=members,
        access_allowed=allowed,
        access_reason=reason,
    )


def test_a_run_whose_owner_may_still_do_it_runs() -> None:
    assert verdict(job(HOURLY)) == RunIt()
    assert verdict(job(ONCE), late=GRACE) == RunIt()  # late, within the grace


def test_a_one_off_later_than_the_grace_is_missed_whatever_the_access() -> None:
    assert verdict(job(ONCE), late=GRACE + 1) == Missed()
    assert verdict(job(ONCE), late=GRACE + 1, allowed=False, reason="provider_error") == Missed()


def test_a_recurring_job_that_missed_occurrences_runs_once_not_missed() -> None:
    assert verdict(job(HOURLY), late=5 * 3600 + 10) == RunIt()
    following = next_due_policy(GRACE)(job(HOURLY), T0, T0 + timedelta(hours=5, seconds=10))
    assert following == T0 + timedelta(hours=6)  # the next occurrence after now: no burst
    assert next_due_policy(GRACE)(job(ONCE), T0, T0 + timedelta(seconds=1)) is None


@pytest.mark.parametrize(
    ("kwargs", "code", "sentence"),
    [
        ({"joined": ["@bob:localhost", "@vagent:localhost"]}, "left_room", "no longer in this room"),
        ({"joined": []}, "left_room", "no longer in this room"),
        ({"allowed": False, "reason": "no_agent_grant"}, "no_agent_access", "no longer have access"),
        ({"allowed": False, "reason": "provider_denied"}, "no_agent_access", "no longer have access"),
        ({"allowed": False, "reason": "provider_error"}, "provider_unavailable", "could not be checked"),
        ({"allowed": False, "reason": "provider_timeout"}, "provider_unavailable", "could not be checked"),
        ({"domain": None}, "no_tenant", "no tenant"),
        ({"domain": "other.example"}, "tenant_changed", "another tenant"),
    ],
)
def test_every_lost_right_skips_the_run_with_a_reason(
    kwargs: dict[str, object], code: str, sentence: str
) -> None:
    got = verdict(job(HOURLY), **kwargs)  # type: ignore[arg-type]
    assert isinstance(got, Skip)
    assert got.code == code
    assert sentence in got.sentence and got.sentence.startswith("skipped: ")


def test_members_that_cannot_be_listed_are_no_proof_the_owner_is_there() -> None:
    got = decide(
        job(HOURLY),
        T0,
        T0,
        GRACE,
        domain="localhost",
        joined=None,
        access_allowed=True,
        access_reason="granted",
    )
    assert got == Skip("members_unknown")


def test_the_room_leaving_check_comes_before_access() -> None:
    """An owner who left and lost access is told they left (the provider need not be asked)."""
    got = verdict(job(HOURLY), joined=["@vagent:localhost"], allowed=False, reason="no_agent_grant")
    assert got == Skip("left_room")


def test_a_job_made_without_a_tenant_runs_in_the_rooms_current_one() -> None:
    assert verdict(job(HOURLY, domain=None)) == RunIt()


def test_the_owner_reads_when_and_what_was_missed_in_their_zone() -> None:
    j = job(Schedule(kind="at", at=T0, tz="Europe/Oslo", text="at 10:00"))
    text = missed_notice(j, T0, "Europe/Oslo")
    assert text == (
        "⏰ Your task “list my open tickets” scheduled for Mon 7 Jan 2030 10:00 CET was missed: "
        "no bot was running; it will not run."
    )


def test_a_paused_job_tells_its_owner_why_and_how_to_resume() -> None:
    text = paused_notice(job(HOURLY), Skip("no_agent_access"))
    assert "task 3 “list my open tickets” is paused" in text
    assert "its last 3 runs were skipped (you no longer have access to this agent)." in text
    assert "`!schedule resume 3`" in text


def test_a_job_paused_on_a_spent_budget_says_so() -> None:
    text = paused_notice(job(HOURLY), Skip("over_budget"))
    assert "runs were skipped (your usage budget is spent)." in text


def test_the_loop_sleeps_until_the_next_due_run_at_most_the_cap() -> None:
    assert poll_delay(None, 100.0, 1.0) == 1.0
    assert poll_delay(100.4, 100.0, 1.0) == pytest.approx(0.4)
    assert poll_delay(90.0, 100.0, 1.0) == 0.0
    assert poll_delay(500.0, 100.0, 1.0) == 1.0
