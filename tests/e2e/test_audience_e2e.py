"""End to end: the room audience as the real bot resolves it on a real Synapse, with the real
provider (members listed by the homeserver, their AcContexts fetched per message, DMs untouched)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.conftest import Login, Stack
from tests.e2e.test_bot_e2e import ask_delete, dm_with_bot, echoed, reads, said, tenant_room
from tests.support.llm_server import ScriptedLLMServer
from tests.support.matrix_human import HumanClient

pytestmark = pytest.mark.e2e


def audiences(stack: Stack, since: int, room: str) -> list[dict[str, Any]]:
    """The bot's `audience_resolved` lines for `room` written after log offset `since`."""
    lines = [json.loads(ln) for ln in stack.main_bot.logs()[since:].splitlines() if ln.startswith("{")]
    return [ln for ln in lines if ln.get("event") == "audience_resolved" and ln.get("room_id") == room]


async def test_group_rooms_send_the_other_members_and_dms_send_none(
    stack: Stack, alice: HumanClient, carol: HumanClient, humans: Login, llm: ScriptedLLMServer
) -> None:
    """Carol may not use the agent but reads the answer; dave is unknown to the provider."""
    await humans(stack.users.dave)
    u = stack.users
    since = len(stack.main_bot.logs())
    room = await tenant_room(alice, "audience", [u.bot, u.carol, u.dave])
    await alice.send(room, "!ai who reads this?")
    await alice.wait_for_reply(u.bot, room, said("who reads this?"))
    [first] = audiences(stack, since, room)
    assert {"member_count": 4, "members": 2, "unresolved": 1, "public_only": False}.items() <= first.items()
    assert first["unresolved_users"] == [u.dave]  # carol's AcContext went along, dave's could not

    # answering a question resolves the room afresh (members may have changed meanwhile)
    await ask_delete(alice, stack, llm, room, "2024-01-01", "!ai delete records older than 2024")
    llm.push_text("Nothing deleted.")
    await alice.send(room, "no")
    await alice.wait_for_reply(u.bot, room, reads("Nothing deleted."))
    assert len(audiences(stack, since, room)) == 3  # the request, the question's request, the answer

    dm = await dm_with_bot(alice, stack)
    await echoed(alice, stack, dm, "just us")
    assert audiences(stack, since, dm) == []

    new_lines = [json.loads(ln) for ln in stack.main_bot.logs()[since:].splitlines() if ln.startswith("{")]
    denied = {ln.get("user_id") for ln in new_lines if ln.get("event") == "access_denied"}
    assert not denied & {u.carol, u.dave}  # sitting in a room is no request to the agent
