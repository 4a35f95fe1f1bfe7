"""The content of the events the bot sends (`vagent_bot.answers.event_content.message_content`), and
that every event built from a part of a split answer fits Matrix's size limit (`size_budget`)."""

from __future__ import annotations

import json
import math
import random

import pytest

from vagent_bot.answers.event_content import message_content
from vagent_bot.answers.size_budget import CONTENT_MAX_BYTES, MAX_TEXT_BYTES
from vagent_bot.answers.splitting import split_message


def size(s: str) -> int:
    return len(s.encode("utf-8"))


def test_plain_message() -> None:
    assert message_content("hello **you**") == {
        "msgtype": "m.text",
        "body": "hello **you**",
        "m.mentions": {},
        "format": "org.matrix.custom.html",
        "formatted_body": "hello <strong>you</strong>",
    }


def test_plain_text_and_notice() -> None:
    assert message_content("x", html=False) == {"msgtype": "m.text", "body": "x", "m.mentions": {}}
    assert message_content("x", notice=True, html=False) == {
        "msgtype": "m.notice",
        "body": "x",
        "m.mentions": {},
    }


def test_thread_message() -> None:
    content = message_content("hi", thread_root="$root", html=False)
    assert content["m.relates_to"] == {
        "rel_type": "m.thread",
        "event_id": "$root",
        "is_falling_back": True,
        "m.in_reply_to": {"event_id": "$root"},
    }
    latest = message_content("hi", thread_root="$root", reply_to="$latest", html=False)
    assert latest["m.relates_to"]["m.in_reply_to"] == {"event_id": "$latest"}


def test_plain_reply() -> None:
    content = message_content("hi", reply_to="$q", html=False)
    assert content == {
        "msgtype": "m.text",
        "body": "hi",
        "m.mentions": {},
        "m.relates_to": {"m.in_reply_to": {"event_id": "$q"}},
    }


def test_edit() -> None:
    content = message_content("new *text*", replaces="$orig", thread_root="$root", reply_to="$x", notice=True)
    assert content == {
        "msgtype": "m.notice",
        "body": "* new *text*",
        "m.mentions": {},
        "format": "org.matrix.custom.html",
        "formatted_body": "* new <em>text</em>",
        "m.new_content": {
            "msgtype": "m.notice",
            "body": "new *text*",
            "m.mentions": {},
            "format": "org.matrix.custom.html",
            "formatted_body": "new <em>text</em>",
        },
        "m.relates_to": {"rel_type": "m.replace", "event_id": "$orig"},
    }


def test_script_is_escaped_in_content() -> None:
    content = message_content("<script>alert('x')</script>", replaces="$e")
    assert "<script" not in content["formatted_body"]
    assert "<script" not in content["m.new_content"]["formatted_body"]
    assert content["m.new_content"]["body"] == "<script>alert('x')</script>"  # the body is plain text


# worst cases: every event the bot builds from a part must fit Matrix's 65536-byte limit


EVENT_ID = "$" + "A" * 254  # the longest event id the spec allows (255 bytes)
ROOM_ID = "!" + "r" * 254


def adversarial_texts() -> dict[str, str]:
    n = MAX_TEXT_BYTES
    table_head = "|" + "a|" * 60 + "\n|" + "-|" * 60 + "\n"
    return {
        "ampersands": "&" * n * 3,
        "angle brackets": "<" * n * 3,
        "quotes and backslashes": '"\\' * n * 2,
        "control characters": "\x01\x1f" * n,
        "newlines": "x\n" * n * 2,
        "2-byte letters": "é" * n * 2,
        "C1 controls": "\x85\x9f" * n,
        "CJK": "中文" * n,
        "emoji": "😀" * n,
        "ZWJ families": "👩\u200d👩\u200d👧\u200d👦" * n,
        "empty table cells": table_head + ("|" * 61 + "\n") * (n // 20),
        "reference link bomb": "[r]: https://example.org/" + "x" * 1200 + "\n\n" + "[a][r] " * n,
        "emphasis": "*a* " * n * 2,
        "list items": "- a\n" * n * 2,
        "links": "<https://a.b> " * n,
        "code with specials": "```\n" + 'if a<b && c>d: s = "\\\\"\n' * n + "```",
        "mixed": "".join(
            random.Random(7).choice(["&", "<", "😀", "é", '"', "\\", "|", "\n", "a", "\x01"])
            for _ in range(n * 3)
        ),
    }


def encrypted_event_size(content: dict[str, object]) -> int:
    """What the event weighs in an encrypted room: nio's compact ASCII JSON, Megolm, base64, envelope."""
    plaintext = json.dumps(
        {"type": "m.room.message", "content": content, "room_id": ROOM_ID}, separators=(",", ":")
    ).encode()
    megolm = len(plaintext) + 16 + 1 + 6 + 8 + 64  # padding, version, index, MAC, signature
    return math.ceil(megolm * 4 / 3) + 2500  # + algorithm/keys/relations + PDU (auth, hashes, signatures)


@pytest.mark.parametrize("name", list(adversarial_texts()))
def test_every_event_built_from_a_part_fits(name: str) -> None:
    text = adversarial_texts()[name]
    parts = split_message(text)
    assert len(parts) > 1
    for part in parts:
        for content in (
            message_content(part, replaces=EVENT_ID),
            message_content(part, thread_root=EVENT_ID, reply_to=EVENT_ID, notice=True),
            message_content(part, reply_to=EVENT_ID),
        ):
            assert len(json.dumps(content).encode()) <= CONTENT_MAX_BYTES
            assert len(json.dumps(content).encode()) + 1024 < 65536
            assert len(json.dumps(content, ensure_ascii=False).encode()) + 1024 < 65536  # canonical JSON
            assert encrypted_event_size(content) < 65536
            assert content["body"].endswith(part.replace("\x01", "").replace("\x1f", "")[-10:])


@pytest.mark.parametrize(
    "text",
    [
        ("The quick brown fox jumps over the lazy dog. **bold** `code` [link](https://example.org)\n" * 100),
        ("## 标题\n\n**粗体** 中文文本，这是一个测试。\n" * 200),
        ("```python\n" + 'if a < b and c > d: print("x & y")\n' * 200 + "```\n"),
        ("| name | value |\n|---|---|\n" + "| key | 42 |\n" * 400),
        ("Ünïcödé ➜ résumé naïve café — “quotes” • bullets\n" * 200),
    ],
)
def test_ordinary_answers_keep_their_formatting_at_full_size(text: str) -> None:
    part = split_message(text)[0]
    assert size(part) > MAX_TEXT_BYTES * 0.9
    assert "formatted_body" in message_content(part, replaces=EVENT_ID)


def test_html_is_dropped_only_when_it_would_not_fit() -> None:
    bomb = "[r]: https://example.org/" + "x" * 1200 + "\n\n" + "[a][r] " * 500
    assert size(bomb) <= MAX_TEXT_BYTES
    content = message_content(bomb, replaces=EVENT_ID)
    assert "formatted_body" not in content and "format" not in content
    assert content["m.new_content"] == {"msgtype": "m.text", "body": bomb, "m.mentions": {}}
    assert "formatted_body" in message_content(bomb[: bomb.index("[a]") + 7 * 5], replaces=EVENT_ID)
