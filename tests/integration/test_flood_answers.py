"""Flood control as a user meets it through the bot's real parts (router -> questions /
conversation, real Redis, a real nio client against one local stand-in for the homeserver, the
access provider and the graph: tests/integration/test_bot_media.py's harness): answers to the
bot's own question never count toward the limit nor are refused, a refusal is one console line,
and the bot's messages of a turn (its answer and its ❓ question) both lead `vagent trace show`
to that turn."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import structlog
from redis.asyncio import Redis

from tests.integration import test_bot_media as harness
from tests.integration.test_bot_media import Bot, BotFactory
from tests.support.vagent_cli import run_vagent
from vagent_bot.access.flood import BotFloodControl as FloodControl
from vagent_bot.conversation.hitl_store import HitlStore
from vagent_graph.observability.trace_store import TraceStore
from vagent_shared import redis_keys
from vagent_shared.hitl import PendingQuestion
from vagent_shared.session import SessionId
from vagent_shared.traces import TurnTrace, question_line

pytestmark = pytest.mark.timeout(60)

# the harness' fixtures, used here by name
outside = harness.outside
make_bot = harness.make_bot

TOO_FAST = "⏳ You're sending messages too fast. Please wait a moment."
LIMIT, WINDOW = 10, 60.0


def text(body: str) -> dict[str, Any]:
    return {"msgtype": "m.text", "body": body}


async def limited(make_bot: BotFactory) -> Bot:
    """A bot with the default limit (10 a minute), answering every message with "ok"."""
    bot = await make_bot()
    bot.router.conversations.flood = FloodControl(bot.redis, LIMIT, WINDOW)
    bot.outside.graph_script = [("text_final", {"content": "ok"})]
    return bot


async def ask(bot: Bot, room: str, question: str = "Delete 3 records?") -> SessionId:
    """The agent's pending yes/no question to the test's user in `room` (main timeline)."""
    sid = SessionId(room_id=room, thread_id=None, user_id=bot.user)
    pending = PendingQuestion(
        session_id=sid.format(),
        room_id=room,
        user_id=bot.user,
        question=question,
        options=["yes", "no"],
        interrupt_id=f"int-{uuid.uuid4().hex[:6]}",
    )
    await HitlStore(bot.redis).save(pending, 60)
    return sid


@pytest.mark.parametrize("where", ["dm", "group"])
async def test_answers_to_the_bots_question_go_through_a_full_window_and_do_not_fill_it(
    make_bot: BotFactory, where: str
) -> None:
    """The README walk-through: questions and yes/no answers in one minute. Ten questions fill
    the window; the answers to the bot's questions still reach the graph, the 11th question is
    refused."""
    bot = await limited(make_bot)
    room = bot.dm if where == "dm" else bot.group
    prefix = "" if where == "dm" else "!ai "  # a group room: addressed as `make chat` does
    for i in range(LIMIT):
        await bot.handle(room, text(f"{prefix}question {i}"))
    assert len(bot.outside.graph_requests) == LIMIT
    assert TOO_FAST not in bot.outside.bodies(room)

    for answer in ("yes", "no", "yes"):
        sid = await ask(bot, room)
        await bot.handle(room, text(f"{prefix}{answer}"))
        assert await HitlStore(bot.redis).peek(sid.format()) is None  # taken: the graph resumed
    assert [f["response"] for f in bot.outside.feedback_requests] == ["yes", "no", "yes"]
    assert TOO_FAST not in bot.outside.bodies(room)
    # a word that is no answer is asked again, not refused for flooding (and not counted)
    sid = await ask(bot, room)
    await bot.handle(room, text(f"{prefix}maybe"))
    assert bot.outside.bodies(room)[-1].startswith("Please answer yes or no.")
    assert await HitlStore(bot.redis).peek(sid.format()) is not None
    await HitlStore(bot.redis).drop(sid.format())

    await bot.handle(room, text(f"{prefix}one question too many"))
    assert bot.outside.bodies(room)[-1] == TOO_FAST
    assert len(bot.outside.graph_requests) == LIMIT  # the refused one never reached the graph
    assert await bot.redis.zcard(redis_keys.flood(bot.user)) == LIMIT  # the answers were not counted


async def test_a_flood_refusal_is_one_warning_line_without_the_message(make_bot: BotFactory) -> None:
    bot = await limited(make_bot)
    for i in range(LIMIT):
        await bot.handle(bot.dm, text(f"question {i}"))
    words = "please look at the payroll of Dana"
    with structlog.testing.capture_logs() as logs:
        await bot.handle(bot.dm, text(words))
    assert bot.outside.bodies(bot.dm)[-1] == TOO_FAST
    loud = [e for e in logs if e["log_level"] in ("warning", "error", "critical")]
    assert loud == [
        {
            "event": "flood_limited",
            "log_level": "warning",
            "user_id": bot.user,
            "room_id": bot.dm,
            "limit": LIMIT,
            "window": WINDOW,
        }
    ]
    # on make run's console: the access check every message gets, then the refusal; nothing else
    assert [e["event"] for e in logs if e["log_level"] != "debug"] == ["access_granted", "flood_limited"]
    assert words not in repr([e for e in logs if e["log_level"] != "debug"])

    with structlog.testing.capture_logs() as again:  # once per refused message
        await bot.handle(bot.dm, text("and again"))
        await bot.handle(bot.dm, text("and again"))
    assert [e["event"] for e in again if e["log_level"] == "warning"] == ["flood_limited"] * 2


async def test_the_answer_and_the_question_message_both_lead_trace_show_to_the_turn(
    make_bot: BotFactory, redis_url: str
) -> None:
    """A newcomer may copy either event id of the bot's (the ❓ or the answer after "yes"):
    `vagent trace show` finds the turn, with the question the user asked."""
    bot = await make_bot()
    turn_id = uuid.uuid4().hex
    asked = "delete the records older than 2020"
    bot.outside.graph_script = [
        ("turn", {"turn_id": turn_id}),
        (
            "hitl_request",
            {
                "question": "Delete 691 records older than 2020-01-01?",
                "options": ["yes", "no"],
                "interrupt_id": "int-9",
            },
        ),
    ]
    await bot.handle(bot.dm, text(asked))
    sid = SessionId(room_id=bot.dm, thread_id=None, user_id=bot.user)
    pending = await HitlStore(bot.redis).peek(sid.format())
    assert pending is not None and pending.question_event_id
    bot.outside.graph_script = [("turn", {"turn_id": turn_id}), ("text_final", {"content": "Deleted 691."})]
    await bot.handle(bot.dm, text("yes"))
    answer_id = next(  # the stand-in homeserver names the i-th message it was sent `$bot{i}`
        f"$bot{i}" for i, (_, _, c) in enumerate(bot.outside.sent) if c.get("body") == "Deleted 691."
    )

    # the graph's trace of that turn (as the graph stores it), read back by the operator's CLI
    store_redis = Redis.from_url(redis_url)
    try:
        trace = TurnTrace(
            turn_id=turn_id, session_id=sid.format(), user_id=bot.user, question=question_line(asked)
        )
        assert await TraceStore(store_redis, 3600).save(trace)
    finally:
        await store_redis.aclose()
    for ref in (pending.question_event_id, answer_id):
        shown = await asyncio.to_thread(run_vagent, ["trace", "show", ref], {"REDIS_URL": redis_url})
        assert shown.returncode == 0, shown.stderr
        assert f"Turn {turn_id}: answered" in shown.stdout
        assert f"question '{asked}'" in shown.stdout
