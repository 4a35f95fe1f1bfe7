"""The bot's own commands and its help text."""

from __future__ import annotations

import pytest

from vagent_bot.commands import Command, parse_command
from vagent_bot.commands import help_text as make_help
from vagent_bot.rendering import render_markdown
from vagent_bot.routing import parse_message, should_answer


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
        raw = {
            "type": "m.room.message",
            "event_id": "$e",
            "sender": "@a:example.org",
            "content": {"msgtype": "m.text", "body": body},
        }
        m = parse_message(raw, "!r:example.org")
        assert m is not None
        d = should_answer(
            m,
            bot_user_id="@vagent:example.org",
            bot_display_name="vagent",
            is_dm=False,
            prefix="!ai",
            replied_to_sender=None,
            bot_in_thread=False,
        )
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
    assert html.count("<li>") == 7 and "<strong>vagent</strong>" in html and "<blockquote>" in html
    assert "<code>!ai</code>" in html
