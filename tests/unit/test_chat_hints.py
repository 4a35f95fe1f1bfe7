"""`make chat`'s hints and addressing: `!help` typed in a group room reaches the bot (the form
the bot parses as its command), a message without a reply gets one line saying the bot is
silent for people without access by design, a homeserver that goes away and comes back is one
line each, and a stored login the homeserver refuses means logging in again."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from nio import RoomSendError, RoomSendResponse

from vagent_bot.conversation.commands import Command
from vagent_bot.conversation.commands import parse_command as bot_command
from vagent_bot.conversation.routing import parse_message, should_answer
from vagent_dev.chat import Chat, Transcript
from vagent_dev.chat_hints import (
    DEFAULT_SILENCE_HINT_SECONDS,
    SILENCE_HINT,
    HomeserverStatus,
    SilenceWatch,
    address_bot,
    data_dir,
    login_failed,
    relogged_in,
    silence_hint_seconds,
    token_refused,
    why_note,
)
from vagent_shared.settings import BotSettings

BOT = "@vagent:localhost"


def bot_reads(body: str) -> tuple[bool, Command | None]:
    """What the bot makes of `body` sent by alice in a group room: answered?, which command."""
    event = {
        "type": "m.room.message",
        "event_id": "$e",
        "sender": "@alice:localhost",
        "content": {"msgtype": "m.text", "body": body},
    }
    msg = parse_message(event, "!room:localhost")
    assert msg is not None
    decision = should_answer(
        msg,
        bot_user_id=BOT,
        bot_display_name="vagent",
        is_dm=False,
        prefix=BotSettings.model_fields["COMMAND_PREFIX"].default,
        replied_to_sender=None,
        bot_in_thread=False,
    )
    return decision.answer, bot_command(decision.text) if decision.answer else None


@pytest.mark.parametrize(
    ("typed", "sent", "command"),
    [
        ("!help", "!ai !help", "help"),
        ("!reset", "!ai !reset", "reset"),
        ("  !stop ", "!ai !stop", "stop"),
        ("!ai !why", "!ai !why", "why"),
        ("what was the Q3 revenue?", "!ai what was the Q3 revenue?", None),
        ("!AI hello", "!AI hello", None),
        ("!aiden is here", "!ai !aiden is here", None),
        ("yes", "!ai yes", None),
    ],
)
def test_group_room_lines_and_commands_reach_the_bot(typed: str, sent: str, command: str | None) -> None:
    assert address_bot(typed) == sent
    answered, parsed = bot_reads(sent)
    assert answered
    assert (parsed.name if parsed else None) == command
    # what the old client sent for a command reaches nobody
    if command is not None and not typed.strip().startswith("!ai"):
        assert bot_reads(typed.strip()) == (False, None)


def test_a_custom_prefix_is_used_and_an_empty_line_stays_empty() -> None:
    assert address_bot("!help", "@bot") == "@bot !help"
    assert address_bot("   ") == ""


def test_the_silence_hint_comes_once_per_unanswered_message_and_never_after_a_reply() -> None:
    watch = SilenceWatch(15)
    assert not watch.due(100)  # nothing sent
    watch.sent(100)
    assert not watch.due(114.9)
    assert watch.due(115)
    assert not watch.due(200)  # once
    watch.sent(300)
    watch.bot_spoke()  # a reply (or the bot typing)
    assert not watch.due(400)
    watch.sent(500)
    watch.sent(510)  # a second message while the first waits: one hint, counted from the first
    assert watch.due(515) and not watch.due(530)
    off = SilenceWatch(0)
    off.sent(0)
    assert not off.due(1000)


def test_the_silence_hint_delay_comes_from_the_chat_s_own_variable() -> None:
    assert silence_hint_seconds({}) == DEFAULT_SILENCE_HINT_SECONDS == 15
    assert silence_hint_seconds({"CHAT_SILENCE_HINT_SECONDS": "2.5"}) == 2.5
    assert silence_hint_seconds({"CHAT_SILENCE_HINT_SECONDS": "0"}) == 0
    assert silence_hint_seconds({"CHAT_SILENCE_HINT_SECONDS": "soon"}) == 15
    assert silence_hint_seconds({"CHAT_SILENCE_HINT_SECONDS": "-3"}) == 15


def test_the_homeserver_going_away_and_back_is_one_line_each() -> None:
    status = HomeserverStatus("http://127.0.0.1:8008")
    assert status.worked() is None  # up from the start: nothing to say
    assert status.failed() == "homeserver http://127.0.0.1:8008 is unreachable; retrying…"
    assert status.failed() is None and status.failed() is None
    assert status.worked() == "homeserver is back"
    assert status.worked() is None
    assert status.failed() is not None  # down again: said again


def test_only_an_unknown_token_means_logging_in_again() -> None:
    assert token_refused("M_UNKNOWN_TOKEN")
    for other in ("M_FORBIDDEN", "M_LIMIT_EXCEEDED", None, "500"):
        assert not token_refused(other)
    assert relogged_in("@alice:localhost") == (
        "Stored login was refused by the homeserver (new homeserver?); logged in again as @alice:localhost."
    )
    line = login_failed("@alice:localhost", "Invalid password", "http://127.0.0.1:8008", Path(".data/chat/a"))
    assert "\n" not in line and "Invalid password" in line and "delete .data/chat/a" in line


def test_why_names_the_event_for_vagent_trace_show() -> None:
    assert why_note("$abc:localhost") == "🔍 asked about $abc:localhost (vagent trace show '$abc:localhost')"


def test_the_chat_s_files_follow_vagent_data_dir() -> None:
    assert data_dir({}) == Path(".data")
    assert data_dir({"VAGENT_DATA_DIR": "/tmp/other"}) == Path("/tmp/other")


# --------------------------------------------------------------------------- the chat itself


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeClient:
    """Stands in for nio's AsyncClient: records what is sent, answers as told."""

    def __init__(self, answer: Any = None) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.answer = answer if answer is not None else RoomSendResponse("$sent", "!r")
        self.rooms: dict[str, Any] = {}

    async def room_send(self, room_id: str, event_type: str, content: dict[str, Any], **_: Any) -> Any:
        if isinstance(self.answer, BaseException):
            raise self.answer
        self.sent.append((event_type, content))
        return self.answer


def make_chat(client: FakeClient, prefix: str | None = None) -> tuple[Chat, io.StringIO, Clock]:
    out, clock = io.StringIO(), Clock()
    chat = Chat(client, BOT, Transcript(out, clock))  # type: ignore[arg-type]
    chat.room_id, chat.prefix = "!r:localhost", prefix
    chat.silence = SilenceWatch(15)
    return chat, out, clock


async def test_in_a_group_room_the_chat_sends_commands_with_the_prefix() -> None:
    client = FakeClient()
    chat, _, _ = make_chat(client, prefix="!ai")
    await chat.send_text("!help")
    await chat.send_text("how many records?")
    assert [c["body"] for _, c in client.sent] == ["!ai !help", "!ai how many records?"]
    dm_client = FakeClient()
    dm, _, _ = make_chat(dm_client)
    await dm.send_text("!help")
    assert [c["body"] for _, c in dm_client.sent] == ["!help"]


async def test_a_message_without_a_reply_gets_the_hint_line_once() -> None:
    chat, out, clock = make_chat(FakeClient())
    await chat.send_text("hello?")
    clock.now = 14
    chat.tick()
    assert SILENCE_HINT not in out.getvalue()
    clock.now = 15
    chat.tick()
    clock.now = 60
    chat.tick()
    assert out.getvalue().count(SILENCE_HINT) == 1


async def test_a_reply_means_no_hint() -> None:
    chat, out, clock = make_chat(FakeClient())
    await chat.send_text("what was the Q3 revenue?")
    chat.transcript.new("$answer", "EUR 18.4 million")
    chat.silence.bot_spoke()  # what on_sync does for every message of the bot
    clock.now = 60
    chat.tick()
    assert SILENCE_HINT not in out.getvalue()


async def test_a_send_to_an_unreachable_homeserver_is_one_line_and_no_hint() -> None:
    chat, out, clock = make_chat(FakeClient(ConnectionRefusedError(111, "Connection refused")))
    await chat.send_text("hello?")
    assert "chat: not sent, the homeserver is unreachable" in out.getvalue()
    clock.now = 60
    chat.tick()
    assert SILENCE_HINT not in out.getvalue()  # nothing was sent, nothing to wait for
    refused, out2, _ = make_chat(FakeClient(RoomSendError("You are not in the room", "M_FORBIDDEN")))
    await refused.send_text("hello?")
    assert "chat: not sent: You are not in the room" in out2.getvalue()


async def test_why_says_which_event_it_asks_about() -> None:
    client = FakeClient()
    chat, out, _ = make_chat(client)
    chat.last_answer = "$answer:localhost"
    await chat.why()
    assert client.sent[0][1]["m.relates_to"] == {
        "rel_type": "m.annotation",
        "event_id": "$answer:localhost",
        "key": "🔍",
    }
    assert "🔍 asked about $answer:localhost (vagent trace show '$answer:localhost')" in out.getvalue()
