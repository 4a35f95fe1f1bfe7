"""Where did the bot join? Everything up to its own join is history it must not answer."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from vagent_bot.matrix.sync import joined_at

BOT = "@vagent:localhost"


def member(user: str, membership: str, prev: str | None = None) -> SimpleNamespace:
    src: dict[str, Any] = {
        "type": "m.room.member",
        "state_key": user,
        "sender": user,
        "content": {"membership": membership},
    }
    if prev is not None:
        src["unsigned"] = {"prev_content": {"membership": prev}}
    return SimpleNamespace(source=src)


def text(body: str) -> SimpleNamespace:
    return SimpleNamespace(source={"type": "m.room.message", "content": {"body": body}})


def test_no_join_in_the_events() -> None:
    assert joined_at([], BOT) is None
    assert joined_at([text("hi"), member("@alice:localhost", "join")], BOT) is None


def test_the_bots_join_is_found() -> None:
    assert joined_at([text("old"), member(BOT, "join", prev="invite"), text("new")], BOT) == 1
    assert joined_at([member(BOT, "join")], BOT) == 0  # no prev_content: a first join


def test_the_newest_join_counts() -> None:
    events = [
        member(BOT, "join"),
        text("a"),
        member(BOT, "leave", prev="join"),
        member(BOT, "join", prev="leave"),
    ]
    assert joined_at(events, BOT) == 3


def test_a_profile_change_is_not_a_join() -> None:
    events = [member(BOT, "join", prev="invite"), text("a"), member(BOT, "join", prev="join"), text("b")]
    assert joined_at(events, BOT) == 0


def test_other_members_and_odd_events_are_ignored() -> None:
    odd = [SimpleNamespace(), SimpleNamespace(source=None), member("@alice:localhost", "join", prev="invite")]
    assert joined_at(odd, BOT) is None
    assert joined_at([member(BOT, "invite"), member(BOT, "leave")], BOT) is None
