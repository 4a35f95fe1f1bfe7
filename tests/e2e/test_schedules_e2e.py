"""Scheduled tasks running end to end in Matrix (docs/schedules.md): real Synapse, bot, graph,
provider and Redis, the scripted LLM stand-in recording every model call.

Jobs are stored with `ScheduleStore.create` (as `!schedule` and the `schedule_task` tool do):
this module tests the running side. A one-off fires once: a "⏰ Scheduled: TASK" line in the
room, the answer in the thread it starts, replying to it. A recurring job (every 2 s: the store
takes any interval; the minimum is the command's and the tool's) fires once per occurrence.
The owner demoted in the provider: the run is skipped with no model call and no message,
audited `schedule_skipped`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta

import pytest
import yaml
from redis.asyncio import Redis

from tests.e2e.conftest import DOMAIN, Stack, down
from tests.e2e.test_bot_e2e import group
from tests.support.llm_server import ScriptedLLMServer
from tests.support.matrix_human import HumanClient, Msg
from vagent_shared.schedule_store import ScheduleStore
from vagent_shared.schedules import SCHEDULED, Schedule, ScheduledJob

pytestmark = pytest.mark.e2e


@pytest.fixture
async def store(stack: Stack) -> AsyncIterator[ScheduleStore]:
    redis = Redis.from_url(stack.redis_url)
    yield ScheduleStore(redis)
    await redis.aclose()


async def schedule(
    store: ScheduleStore, owner: str, room: str, task: str, schedule: Schedule, first: datetime
) -> ScheduledJob:
    job = await store.create(
        owner=owner,
        room_id=room,
        task=task,
        schedule=schedule,
        next_due=first,
        max_per_user=100,
        now=datetime.now(UTC),
        domain=DOMAIN,
    )
    assert isinstance(job, ScheduledJob)
    return job


def in_seconds(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


async def clock_lines(human: HumanClient, stack: Stack, room: str, task: str) -> list[Msg]:
    return [m for m in await human.messages_from(stack.users.bot, room) if m.body == SCHEDULED + task]


def answering(root: str) -> Callable[[Msg], bool]:
    """The echo stand-in's answer in the thread `root` (a ⏰ line) starts."""
    return lambda m: m.thread_root == root and "You said" in m.body


def asked(llm: ScriptedLLMServer, task: str) -> int:
    """Model calls whose last user message is the task."""
    count = 0
    for request in llm.requests:
        users = [m for m in request["messages"] if m["role"] == "user"]
        if users and task in str(users[-1].get("content")):
            count += 1
    return count


async def test_a_one_off_fires_once_with_the_clock_line_and_the_answer_replying_to_it(
    stack: Stack, alice: HumanClient, bob: HumanClient, llm: ScriptedLLMServer, store: ScheduleStore
) -> None:
    room = await group(alice, stack, "schedules")
    task = f"remind me to call Bob {uuid.uuid4().hex[:6]}"
    when = in_seconds(3)
    job = await schedule(store, stack.users.alice, room, task, Schedule(kind="at", at=when), when)
    line = await alice.wait_for_reply(stack.users.bot, room, lambda m: m.body == SCHEDULED + task, 30)
    assert line.thread_root is None  # in the room's timeline: everyone sees why the agent speaks
    answer = await alice.wait_for_reply(
        stack.users.bot, room, lambda m: m.body == f"You said: {task}" and m.thread_root == line.event_id, 30
    )
    assert answer.in_reply_to == line.event_id
    await bob.wait_for_reply(stack.users.bot, room, lambda m: m.event_id == answer.event_id, 20)
    done = await store.get(job.id)
    assert done is not None and done.last_outcome == "ran" and done.next_due is None
    await alice.assert_no_message_from(stack.users.bot, room, within=3)
    assert len(await clock_lines(alice, stack, room, task)) == 1
    assert asked(llm, task) == 1


async def test_a_recurring_job_fires_once_per_occurrence(
    stack: Stack, alice: HumanClient, bob: HumanClient, llm: ScriptedLLMServer, store: ScheduleStore
) -> None:
    room = await group(alice, stack, "every two seconds")
    task = f"say tick {uuid.uuid4().hex[:6]}"
    first = in_seconds(2).replace(microsecond=0)
    every = Schedule(kind="every", every_seconds=2, anchor=first, text="every 2s")
    job = await schedule(store, stack.users.alice, room, task, every, first)
    deadline = time.monotonic() + 40
    while len(await clock_lines(alice, stack, room, task)) < 3:
        assert time.monotonic() < deadline, "three occurrences never came"
        await asyncio.sleep(0.2)
    assert await store.delete(stack.users.alice, job.number) is not None
    lines = await clock_lines(alice, stack, room, task)
    for line in lines:  # each occurrence answered once, in its own thread
        await alice.wait_for_reply(stack.users.bot, room, answering(line.event_id))
    await asyncio.sleep(3)  # a run claimed just before the delete may still be finishing
    settled = len(await clock_lines(alice, stack, room, task))
    await alice.assert_no_message_from(stack.users.bot, room, within=5)
    assert len(await clock_lines(alice, stack, room, task)) == settled  # nothing after the delete
    answers = [m for m in await alice.messages_from(stack.users.bot, room) if m.body == f"You said: {task}"]
    assert sorted(a.thread_root or "" for a in answers) == sorted(line.event_id for line in lines[:settled])


async def test_an_owner_demoted_in_the_provider_is_skipped_with_no_model_call(
    stack: Stack, alice: HumanClient, bob: HumanClient, llm: ScriptedLLMServer, store: ScheduleStore
) -> None:
    room = await group(alice, stack, "demoted")
    task = f"list my open tickets {uuid.uuid4().hex[:6]}"
    policy = yaml.safe_load(stack.policy.read_text())
    policy["domains"][DOMAIN]["users"][stack.users.alice] = ["guest"]  # no agent access any more
    stack.policy.write_text(yaml.safe_dump(policy))
    try:
        when = in_seconds(2)
        job = await schedule(store, stack.users.alice, room, task, Schedule(kind="at", at=when), when)
        deadline = time.monotonic() + 30
        while (got := await store.get(job.id)) is None or got.last_outcome is None:
            assert time.monotonic() < deadline, "the run was never decided"
            await asyncio.sleep(0.2)
    finally:
        stack.write_policy()
    assert got.last_outcome == "skipped"
    assert got.last_result == "skipped: you no longer have access to this agent"
    assert asked(llm, task) == 0
    assert await clock_lines(alice, stack, room, task) == []
    assert f'"resource": "schedule:{job.id}"' in stack.logs() or f"schedule:{job.id}" in stack.logs()
    assert "schedule_skipped" in stack.logs() and "no_agent_access" in stack.logs()


async def test_a_recurring_job_runs_once_per_occurrence_across_a_bot_kill(
    stack: Stack, alice: HumanClient, bob: HumanClient, llm: ScriptedLLMServer, store: ScheduleStore
) -> None:
    room = await group(alice, stack, "killed bot")
    task = f"say tock {uuid.uuid4().hex[:6]}"
    first = in_seconds(2).replace(microsecond=0)
    every = Schedule(kind="every", every_seconds=2, anchor=first, text="every 2s")
    job = await schedule(store, stack.users.alice, room, task, every, first)

    async def lines_at_least(n: int, within: float) -> None:
        deadline = time.monotonic() + within
        while len(await clock_lines(alice, stack, room, task)) < n:
            assert time.monotonic() < deadline, f"{n} occurrences never came"
            await asyncio.sleep(0.2)

    await lines_at_least(2, 30)
    with down(stack.main_bot, crash=True):  # SIGKILL, maybe mid-run; started again after
        await asyncio.sleep(3)
    before = len(await clock_lines(alice, stack, room, task))
    await lines_at_least(before + 2, 90)  # the restarted bot goes on
    assert await store.delete(stack.users.alice, job.number) is not None
    await asyncio.sleep(3)  # a run claimed just before the delete may still be finishing
    lines = await clock_lines(alice, stack, room, task)
    answers = [m for m in await alice.messages_from(stack.users.bot, room) if m.body == f"You said: {task}"]
    roots = [a.thread_root for a in answers]
    assert len(roots) == len(set(roots)), "an occurrence was answered twice"
    assert set(roots) <= {line.event_id for line in lines}
    assert asked(llm, task) <= len(lines)  # never a model call without its own ⏰ line
    assert len(answers) >= len(lines) - 1  # at most the run cut off by the kill has no answer
