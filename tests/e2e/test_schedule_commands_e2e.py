"""The schedule commands in Matrix (local Synapse, the real bot process): alice's
`!schedule in 1h: …` in a group room is answered with the job's number and next run, as a reply
to her command; `!schedules` lists it; bob (another member with agent access) cannot delete it
by its number and is not told it exists; alice's own `!unschedule` deletes it."""

from __future__ import annotations

import re
import uuid

import pytest

from tests.e2e.conftest import Stack
from tests.e2e.test_bot_e2e import group
from tests.support.matrix_human import HumanClient

pytestmark = pytest.mark.e2e


async def test_schedule_list_and_unschedule_only_by_the_owner(
    stack: Stack, alice: HumanClient, bob: HumanClient
) -> None:
    room = await group(alice, stack, "schedules")
    task = f"check the backlog {uuid.uuid4().hex[:6]}"
    asked = await alice.send(room, f"!ai !schedule in 1h: {task}")
    created = await alice.wait_for_reply(
        stack.users.bot, room, lambda m: m.body.startswith("⏰ Scheduled task") and task in m.body
    )
    assert created.in_reply_to == asked
    found = re.fullmatch(
        rf"⏰ Scheduled task (\d+): “{task}”, once — next run \w{{3}} \d+ \w{{3}} \d{{4}} \d\d:\d\d UTC\.",
        created.body,
    )
    assert found, created.body
    number = int(found.group(1))

    asked = await alice.send(room, "!ai !schedules")
    listed = await alice.wait_for_reply(
        stack.users.bot, room, lambda m: m.body.startswith("⏰ Your scheduled tasks") and task in m.body
    )
    assert listed.in_reply_to == asked
    assert any(line.startswith(f"{number}. “{task}” — once, ") for line in listed.body.splitlines())

    asked = await bob.send(room, f"!ai !unschedule {number}")
    refused = await bob.wait_for_reply(stack.users.bot, room, lambda m: m.in_reply_to == asked)
    assert refused.body == f"You have no scheduled task {number}."

    asked = await alice.send(room, f"!ai !unschedule {number}")
    deleted = await alice.wait_for_reply(stack.users.bot, room, lambda m: m.in_reply_to == asked)
    assert deleted.body == f"🗑️ Deleted scheduled task {number}: “{task}”."

    asked = await alice.send(room, "!ai !schedules")
    after = await alice.wait_for_reply(stack.users.bot, room, lambda m: m.in_reply_to == asked)
    assert task not in after.body
