"""The bot's own commands and its help text."""

from __future__ import annotations

import pytest

from vagent_bot.answers.rendering import render_markdown
from vagent_bot.conversation.commands import Command, parse_command
from vagent_bot.conversation.commands import help_text as make_help
from vagent_bot.conversation.routing import Decision, parse_message, should_answer
from vagent_shared.memory import Forget, ListMemories, Remember, parse_memory_command


def routed(body: str) -> Decision:
    """What routing makes of `body` sent into a group room (prefix `!ai`, the bot not mentioned
    otherwise): whether the bot answers, and the text its commands are parsed from."""
    raw = {
        "type": "m.room.message",
        "event_id": "$e",
        "sender": "@a:example.org",
        "content": {"msgtype": "m.text", "body": body},
    }
    m = parse_message(raw, "!r:example.org")
    assert m is not None
    return should_answer(
        m,
        bot_user_id="@vagent:example.org",
        bot_display_name="vagent",
        is_dm=False,
        prefix="!ai",
        replied_to_sender=None,
        bot_in_thread=False,
    )


@pytest.mark.parametrize(
    "text,expected",
    [
        ("!help", Command("help", "")),
        ("!HELP", Command("help", "")),
        ("  !Reset  ", Command("reset", "")),
        ("!reset everything please", Command("reset", "everything please")),
        ("!stop\n now", Command("stop", "now")),
        ("!stop\t", Command("stop", "")),
        ("!reset  a\nb  ", Command("reset", "a\nb")),
    ],
)
def test_known_commands(text: str, expected: Command) -> None:
    assert parse_command(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "!",
        "help",
        "reset",
        "! help",
        "!helpme",
        "!help!",
        "!help:",
        "!stop-it",
        "!foo",
        "!foo bar",
        "please !stop",
        "!!help",
        "!ｈｅｌｐ",
        "!ai !help",
        "/help",
    ],
)
def test_everything_else_is_a_normal_message(text: str) -> None:
    assert parse_command(text) is None


def test_commands_after_prefix_or_mention_via_routing() -> None:
    for body in ("!ai !reset", "vagent: !RESET", "@vagent:example.org !reset now"):
        d = routed(body)
        cmd = parse_command(d.text)
        assert d.answer and cmd is not None and cmd.name == "reset"


def test_help_text_explains_addressing_commands_and_confirmations() -> None:
    text = make_help("!bot", agent_name="Ada")
    for needle in (
        "Ada",
        "`!bot`",
        "`!help`",
        "`!reset`",
        "`!stop`",
        "yes",
        "no",
        "✅",
        "❌",
        "thread",
        "Direct chat",
        "Group room",
        "mention",
        "reply",
        "(yes/no)",
    ):
        assert needle in text, needle
    assert "vagent" not in text


def test_help_text_defaults_and_renders() -> None:
    text = make_help("!ai")
    assert "**vagent**" in text and "`!ai`" in text
    html = render_markdown(text)
    assert html.count("<li>") == 14 and "<strong>vagent</strong>" in html and "<blockquote>" in html
    assert "<code>!ai</code>" in html


def test_help_lists_the_memory_commands_and_says_reset_keeps_memories() -> None:
    text = make_help("!ai", agent_name="Ada")
    for needle in (
        "`!remember TEXT`",
        "`!remember --everywhere TEXT`",
        "`!memory`",
        "`!forget N`",
        "`!forget all`",
    ):
        assert needle in text, needle
    reset = next(line for line in text.splitlines() if line.startswith("- `!reset`"))
    assert "does **not** forget your memories" in reset
    assert "🧠 Remembered" in text
    assert "its own memory" not in text  # a thread has its own history; memories follow the person


@pytest.mark.parametrize(
    "body,expected",
    [
        ("!ai !remember I prefer answers in German", Remember("I prefer answers in German")),
        ("vagent: !remember --everywhere answer in German", Remember("answer in German", everywhere=True)),
        ("@vagent:example.org !memory", ListMemories()),
        ("!ai !forget 2", Forget(2)),
        ("!ai !FORGET all", Forget(None)),
    ],
)
def test_memory_commands_are_not_the_bots_and_go_to_the_graph_as_typed(body: str, expected: object) -> None:
    """The graph answers them (it holds the memories): the bot's parser leaves them alone, and
    what routing passes on is what the graph's parser reads."""
    d = routed(body)
    assert d.answer and parse_command(d.text) is None
    assert parse_memory_command(d.text) == expected


def test_a_memory_command_in_a_group_room_needs_the_prefix_or_a_mention() -> None:
    d = routed("!remember my PIN hint")
    assert not d.answer
