"""Confirmations and scheduled tasks end to end in Matrix (docs/schedules.md): real Synapse,
bot, graph, provider and Redis, the scripted LLM stand-in deciding by what each model call
was sent (so no answer is taken by the wrong turn).

- The model's `schedule_task` asks first: the question names the task, the schedule and the
  next run; nothing is stored before the answer; "yes" makes exactly that job (origin `tool`,
  in that room), "no" makes nothing.
- A confirmation during a scheduled run is asked in the run's thread and waits for the job's
  owner: another member's "yes" (in the thread, as a reply, as a ✅ reaction) runs nothing;
  the owner's "yes" runs the tool once and the answer arrives in that thread.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml
from redis.asyncio import Redis

from tests.e2e.conftest import DOMAIN, Stack, echo_llm
from tests.e2e.test_bot_e2e import add_old_record, dm_with_bot, group, older_than
from tests.support.llm_server import PlannedResponse, ScriptedLLMServer, TextResponse, ToolCallResponse
from tests.support.matrix_human import HumanClient, Msg
from vagent_shared import SessionId, redis_keys
from vagent_shared.schedule_store import ScheduleStore
from vagent_shared.schedules import SCHEDULE_TOOL, SCHEDULED, Schedule, ScheduledJob

pytestmark = pytest.mark.e2e

JSON = dict[str, Any]


@pytest.fixture
async def store(stack: Stack) -> AsyncIterator[ScheduleStore]:
    redis = Redis.from_url(stack.redis_url)
    yield ScheduleStore(redis)
    await redis.aclose()


@contextmanager
def scheduling_allowed(stack: Stack) -> Iterator[None]:
    """Operators hold `tool:schedule_task` for the block (the provider re-reads its file)."""
    policy = yaml.safe_load(stack.policy.read_text())
    operator = policy["domains"][DOMAIN]["roles"]["operator"]
    if f"tool:{SCHEDULE_TOOL}" not in operator:
        operator.append(f"tool:{SCHEDULE_TOOL}")
    stack.policy.write_text(yaml.safe_dump(policy))
    try:
        yield
    finally:
        stack.write_policy()


def text_of(message: JSON) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def scripted(
    asks: dict[str, tuple[str, JSON]], after_tool: Callable[[str], str]
) -> Callable[[JSON], PlannedResponse]:
    """A model that calls a tool when the turn's (last) user message contains one of `asks`'
    phrases, answers `after_tool(result)` when the last message is a tool's result, and
    echoes otherwise (as the stack's default model does)."""

    def respond(request: JSON) -> PlannedResponse:
        messages = request["messages"]
        last = messages[-1] if messages else {}
        if last.get("role") == "tool":
            return TextResponse(after_tool(text_of(last)))
        if last.get("role") == "user":
            for phrase, (tool, args) in asks.items():
                if phrase in text_of(last):
                    return ToolCallResponse([(tool, args)])
        return echo_llm(request)

    return respond


def job_ids(jobs: list[ScheduledJob]) -> set[str]:
    return {j.id for j in jobs}


async def test_the_models_schedule_task_asks_first_and_yes_creates_exactly_that(
    stack: Stack, alice: HumanClient, llm: ScriptedLLMServer, store: ScheduleStore
) -> None:
    from vagent_shared.schedule_times import ParsedSchedule, describe, schedule_from_tool, when_text

    tag = uuid.uuid4().hex[:6]
    task, stretch = f"check the build {tag}", f"stretch {tag}"
    llm.set_default(
        scripted(
            {
                f"to check the build {tag}": (SCHEDULE_TOOL, {"task": task, "cron": "0 9 * * 1-5"}),
                f"to stretch {tag}": (SCHEDULE_TOOL, {"task": stretch, "every": "2h"}),
            },
            lambda result: "Scheduled it." if result.startswith("Scheduled task") else f"Not done: {result}",
        )
    )
    room = await dm_with_bot(alice, stack)
    before = job_ids(await store.of_user(stack.users.alice))
    with scheduling_allowed(stack):
        asked = await alice.send(room, f"remind me every weekday at 09:00 to check the build {tag}")
        question = await alice.wait_for_reply(
            stack.users.bot, room, lambda m: m.body.startswith("❓ Schedule this task"), 30
        )
        await stack.question_saved(question.event_id)
        expected = schedule_from_tool(task, None, None, "0 9 * * 1-5", datetime.now(UTC), "UTC", 900)
        assert isinstance(expected, ParsedSchedule)
        first_line = question.body.split("\n", 1)[0]
        assert first_line == (
            f"❓ Schedule this task {describe(expected.schedule)}, "
            f"next run {when_text(expected.first_run, 'UTC')}? (yes/no)"
        ), question.body
        assert "every weekday at 09:00" in first_line  # the schedule, in words
        assert task in question.body and "0 9 * * 1-5" in question.body  # the task, the call
        assert question.in_reply_to == asked
        called = [i for i, r in enumerate(llm.requests) if tag in text_of(r["messages"][-1])]
        assert called and SCHEDULE_TOOL in llm.offered_tool_names(called[0])
        assert job_ids(await store.of_user(stack.users.alice)) == before  # nothing before the answer

        await alice.send(room, "yes")
        await alice.wait_for_reply(stack.users.bot, room, lambda m: m.body == "Scheduled it.", 30)
        made = [j for j in await store.of_user(stack.users.alice) if j.id not in before]
        assert len(made) == 1, made
        (job,) = made
        assert (job.task, job.origin, job.room_id, job.thread_root) == (task, "tool", room, None)
        assert (job.schedule.kind, job.schedule.cron, job.schedule.tz) == ("cron", "0 9 * * 1-5", "UTC")
        assert job.next_due == expected.first_run and not job.paused

        # a second conversation: "no" makes nothing
        await alice.send(room, f"remind me every two hours to stretch {tag}")
        again = await alice.wait_for_reply(
            stack.users.bot, room, lambda m: m.body.startswith("❓ Schedule this task every 2 hours"), 30
        )
        assert stretch in again.body
        await stack.question_saved(again.event_id)
        await alice.send(room, "no")
        await alice.wait_for_reply(stack.users.bot, room, lambda m: m.body.startswith("Not done: "), 30)
    try:
        after = await store.of_user(stack.users.alice)
        assert [j.id for j in after if j.id not in before] == [job.id]
        assert all(j.task != stretch for j in after)
    finally:
        await store.delete(stack.users.alice, job.number)  # alice's other tests stay under the limit


async def due_soon(store: ScheduleStore, stack: Stack, room: str, task: str) -> ScheduledJob:
    """alice's one-off job in `room`, due in 3 s."""
    when = datetime.now(UTC) + timedelta(seconds=3)
    job = await store.create(
        owner=stack.users.alice,
        room_id=room,
        task=task,
        schedule=Schedule(kind="at", at=when),
        next_due=when,
        max_per_user=100,
        now=datetime.now(UTC),
        domain=DOMAIN,
    )
    assert isinstance(job, ScheduledJob)
    return job


def replying_to(event_id: str) -> Callable[[Msg], bool]:
    return lambda m: m.in_reply_to == event_id


async def reaction_ignored(stack: Stack, thread_root: str, timeout: float = 20) -> None:  # noqa: ASYNC109
    """Until the bot has logged that it ignored a reaction in the session of `thread_root`."""
    deadline = time.monotonic() + timeout
    while not any(
        "hitl_reaction_ignored" in line and thread_root in line for line in stack.logs().splitlines()
    ):
        assert time.monotonic() < deadline, "the bot never handled the reaction"
        await asyncio.sleep(0.2)


async def test_a_confirmation_during_a_scheduled_run_asks_the_owner_in_its_thread(
    stack: Stack, alice: HumanClient, bob: HumanClient, llm: ScriptedLLMServer, store: ScheduleStore
) -> None:
    tag = uuid.uuid4().hex[:6]
    task = f"clean up the old records {tag}"
    cutoff = "2012-06-01"
    add_old_record(stack, "2012-03-04")  # earlier tests may have deleted the seeded ones
    old = older_than(stack, cutoff)
    assert old > 0
    done = f"Deleted them as scheduled {tag}."
    llm.set_default(scripted({task: ("delete_records", {"older_than": cutoff})}, lambda _: done))
    room = await group(alice, stack, "scheduled confirmation")
    await due_soon(store, stack, room, task)

    line = await alice.wait_for_reply(stack.users.bot, room, lambda m: m.body == SCHEDULED + task, 30)
    root = line.event_id
    question = await alice.wait_for_reply(
        stack.users.bot, room, lambda m: m.thread_root == root and m.body.startswith("❓"), 30
    )
    records = "record" if old == 1 else "records"
    assert question.body == f"❓ Delete {old} {records} older than {cutoff}? (yes/no)"
    await stack.question_saved(question.event_id)

    # bob, a member with agent access, cannot answer alice's question
    in_thread = await bob.send(room, "yes", thread_root=root)
    replying = await bob.send(room, "yes", thread_root=root, reply_to=question.event_id)
    await bob.react(room, question.event_id, "✅")
    for his in (in_thread, replying):  # each is bob's own request (the echo), never the answer
        got = await bob.wait_for_reply(stack.users.bot, room, replying_to(his), 30)
        assert got.body.startswith("You said:") and got.thread_root == root, got.body
    await reaction_ignored(stack, root)
    assert older_than(stack, cutoff) == old  # nothing ran
    assert not any(r["messages"][-1].get("role") == "tool" for r in llm.requests)
    sid = SessionId(room_id=room, thread_id=root, user_id=stack.users.alice).format()
    redis = Redis.from_url(stack.redis_url)
    try:  # the question still waits for alice
        assert (
            await redis.exists(redis_keys.hitl_pending(sid), redis_keys.hitl_question(question.event_id)) == 2
        )
    finally:
        await redis.aclose()

    await alice.send(room, "yes", thread_root=root)
    answer = await alice.wait_for_reply(stack.users.bot, room, lambda m: m.body == done, 30)
    assert answer.thread_root == root
    assert older_than(stack, cutoff) == 0
    await alice.assert_no_message_from(stack.users.bot, room, within=2)
    ran = [r for r in llm.requests if r["messages"][-1].get("role") == "tool"]
    assert len(ran) == 1, ran  # the tool ran once, on alice's word
    answers: list[Msg] = [m for m in await alice.messages_from(stack.users.bot, room) if m.body == done]
    assert len(answers) == 1
    lines = [m for m in await alice.messages_from(stack.users.bot, room) if m.body == SCHEDULED + task]
    assert len(lines) == 1


async def test_the_owners_stop_in_its_thread_stops_a_scheduled_answer_and_anothers_does_not(
    stack: Stack, alice: HumanClient, bob: HumanClient, llm: ScriptedLLMServer, store: ScheduleStore
) -> None:
    """`!stop` works on a scheduled run as on a message: only its owner's, in its thread;
    `!schedules` then shows the run as stopped."""
    tag = uuid.uuid4().hex[:6]
    task = f"write the long weekly report {tag}"
    report = " ".join(f"line{i}" for i in range(120))

    def respond(request: JSON) -> PlannedResponse:
        if task in text_of(request["messages"][-1]):
            return TextResponse(report, chunks=120, delay=0.25)  # ~30 s: stopped long before its end
        return echo_llm(request)

    llm.set_default(respond)
    room = await group(alice, stack, "scheduled stop")
    job = await due_soon(store, stack, room, task)
    line = await alice.wait_for_reply(stack.users.bot, room, lambda m: m.body == SCHEDULED + task, 30)
    root = line.event_id
    await alice.wait_for_reply(
        stack.users.bot, room, lambda m: m.thread_root == root and m.body.startswith("line0"), 30
    )

    def stopped(m: Msg) -> bool:
        return m.thread_root == root and m.body == "⏹️ Stopped."

    await bob.send(room, "!stop", thread_root=root)  # bob's own session: nothing of his runs
    await asyncio.sleep(2)
    assert not [m for m in await alice.messages_from(stack.users.bot, room) if stopped(m)]

    await alice.send(room, "!stop", thread_root=root)
    await alice.wait_for_reply(stack.users.bot, room, stopped, 30)
    deadline = time.monotonic() + 20
    while (got := await store.get(job.id)) is None or got.last_result is None:
        assert time.monotonic() < deadline, "the run's end was never recorded"
        await asyncio.sleep(0.2)
    assert (got.last_outcome, got.last_result) == ("ran", "stopped with !stop")
    answer = [m for m in await alice.messages_from(stack.users.bot, room) if m.body.startswith("line0")]
    assert len(answer) == 1 and not answer[0].body.endswith("line119")  # cut off, not finished
