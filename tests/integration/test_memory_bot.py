"""The bot's part in memory (docs/memory.md), through its real parts (router -> conversation /
questions, real Redis, a real nio client against tests/integration/test_bot_media.py's stand-in
for the homeserver, the access provider and the graph): the memory commands reach the graph as
typed (the graph answers them), and a group room whose readers the bot does not check
(AUDIENCE_FILTER=off) is flagged `audience_unchecked`, so the graph recalls only `--everywhere`
memories there, for a new message and for an answer to the agent's question alike."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.integration import test_bot_media as harness
from tests.integration.test_bot_media import BotFactory
from vagent_bot.conversation.conversations import readers_unchecked
from vagent_bot.conversation.hitl_store import HitlStore
from vagent_shared.hitl import PendingQuestion
from vagent_shared.session import SessionId

pytestmark = pytest.mark.timeout(60)

# the harness' fixtures, used here by name
outside = harness.outside
make_bot = harness.make_bot


def text(body: str) -> dict[str, Any]:
    return {"msgtype": "m.text", "body": body}


@pytest.mark.parametrize(
    "is_dm,enabled,unchecked",
    [(False, False, True), (False, True, False), (True, False, False), (True, True, False)],
)
def test_only_a_group_room_without_the_audience_filter_has_unchecked_readers(
    is_dm: bool, enabled: bool, unchecked: bool
) -> None:
    assert readers_unchecked(is_dm=is_dm, enabled=enabled) is unchecked


async def test_memory_commands_reach_the_graph_as_typed_and_an_unchecked_group_room_says_so(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot()  # AUDIENCE_FILTER=off
    bot.outside.graph_script = [("text_final", {"content": "🧠 Remembered: I prefer answers in German"})]
    await bot.handle(bot.dm, text("!remember I prefer answers in German"))
    await bot.handle(bot.group, text("!ai !memory"))
    await bot.handle(bot.group, text("!forget 1"))  # not addressed in a group room: not for the bot
    dm, group = bot.outside.graph_requests
    assert dm["message"] == "!remember I prefer answers in German" and dm["audience_unchecked"] is False
    assert group["message"] == "!memory" and group["audience_unchecked"] is True
    assert group["audience"] is None
    assert bot.outside.bodies(bot.dm) == ["🧠 Remembered: I prefer answers in German"]


async def test_with_the_audience_filter_on_a_group_room_sends_its_audience_not_the_flag(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(AUDIENCE_FILTER="on")
    bot.outside.graph_script = [("text_final", {"content": "You have no memories here."})]
    await bot.handle(bot.group, text("!ai !memory"))
    [request] = bot.outside.graph_requests
    assert request["audience_unchecked"] is False
    assert request["audience"] is not None  # the stand-in lists no members: public documents only


@pytest.mark.parametrize("room_kind,unchecked", [("group", True), ("dm", False)])
async def test_an_answer_to_the_agents_question_carries_the_flag_too(
    make_bot: BotFactory, room_kind: str, unchecked: bool
) -> None:
    """`!forget all` is confirmed through the agent's yes/no question: the confirmed turn goes
    on with the same readers' rule."""
    bot = await make_bot()
    room = bot.group if room_kind == "group" else bot.dm
    sid = SessionId(room_id=room, thread_id=None, user_id=bot.user)
    await HitlStore(bot.redis).save(
        PendingQuestion(
            session_id=sid.format(),
            room_id=room,
            user_id=bot.user,
            question="Forget all 3 of your memories?",
            options=["yes", "no"],
            interrupt_id=f"int-{uuid.uuid4().hex[:6]}",
        ),
        60,
    )
    bot.outside.graph_script = [("text_final", {"content": "🧹 Forgot 3 memories."})]
    await bot.handle(room, text("!ai yes" if room_kind == "group" else "yes"))
    [feedback] = bot.outside.feedback_requests
    assert feedback["response"] == "yes" and feedback["audience_unchecked"] is unchecked
