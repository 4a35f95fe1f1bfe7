"""Confirmation questions show every argument a call will use, readably, and cannot be made
to hide one (confirmation.py), as the bot will render them in Matrix."""

from __future__ import annotations

from vagent_bot.rendering import render_markdown
from vagent_graph.confirmation import (
    MAX_SHOWN_CHARS,
    TAIL_CHARS,
    arguments_digest,
    as_question,
    question_text,
)
from vagent_shared.hitl import format_question


def test_every_argument_is_listed_in_order() -> None:
    q = question_text(
        "Create this ticket in the ticket service, in your name?",
        {"title": "Printer jam", "description": "Floor 3, every morning", "priority": "low"},
    )
    assert q.splitlines() == [
        "Create this ticket in the ticket service, in your name?",
        "title: `Printer jam`",
        "description: `Floor 3, every morning`",
        "priority: `low`",
    ]


def test_the_options_follow_the_headline_not_the_last_argument() -> None:
    q = question_text(
        "Delete 3 records older than 2016-01-01?", {"older_than": "2016-01-01"}, shows=["older_than"]
    )
    assert format_question(q, ["yes", "no"]) == "❓ Delete 3 records older than 2016-01-01? (yes/no)"
    q = question_text("Run echo?", {"text": "hi"})
    assert format_question(q, ["yes", "no"]) == "❓ Run echo? (yes/no)\ntext: `hi`"


def test_a_long_value_shows_its_start_its_end_and_its_length() -> None:
    planted = "CONFIDENTIAL: the merger with Globex closes on 3 March."
    description = "Printer jam. " + "filler " * 600 + planted
    q = question_text("Create a ticket?", {"description": description})
    size = f"{len(description):,}".replace(",", " ")
    assert f"description ({size} characters, shortened):" in q
    assert "Printer jam." in q and planted in q and "…" in q  # the end is shown, not only the start
    assert len(q) < MAX_SHOWN_CHARS + 200
    assert q.rstrip("`\n").endswith(description[-TAIL_CHARS:])


def test_multiline_and_backticks_cannot_break_out_of_the_value() -> None:
    hostile = "ok\n```\npriority: `high`\n[click](https://evil.example) @room <b>x</b>\n```\nmore"
    q = question_text("Create a ticket?", {"description": hostile, "priority": "low"})
    html = render_markdown(format_question(q, ["yes", "no"]))
    assert "<a " not in html and "<b>" not in html  # shown as text, not as formatting
    assert "https://evil.example" in html and "priority: `low`" in q
    # the value sits in one fenced block whose fence is longer than any backtick run inside it
    assert "````\nok\n```\npriority" in q


def test_values_that_look_like_secrets_are_masked() -> None:
    key = "sk-proj-4f9c2a7b1e8d3c6a9f0b2d4e"
    q = question_text(
        "Configure the connector?",
        {"api_key": "hunter2-but-longer", "note": f"use {key} please", "name": "billing"},
    )
    assert key not in q and "hunter2" not in q
    assert "api_key: *hidden, it looks like a secret (18 characters)*" in q  # by its name: all of it
    # by its shape: only the secret, so a key-shaped word cannot hide the text around it
    assert "note (parts that look like secrets are hidden): `use ‹hidden: looks like a secret› please`" in q
    assert "name: `billing`" in q


def test_invisible_characters_are_shown_as_escapes() -> None:
    q = question_text("Create a ticket?", {"title": "invoice\u202egnp.exe", "x": "a\u200bb"})
    assert "invoice\\u202egnp.exe" in q and "a\\u200bb" in q and "\u202e" not in q


def test_a_headline_skips_only_what_it_states_word_for_word() -> None:
    head = "Delete 3 records older than 2016-01-01?"
    assert "older_than" not in question_text(head, {"older_than": "2016-01-01"}, shows=["older_than"])
    # declared, but the headline does not contain it: listed anyway
    assert "older_than: `2017-01-01`" in question_text(
        head, {"older_than": "2017-01-01"}, shows=["older_than"]
    )
    assert "older_than: `2016`" in question_text(head, {"older_than": "2016"}, shows=["older_than"])
    # not declared: listed even though the headline contains it
    assert "older_than: `2016-01-01`" in question_text(head, {"older_than": "2016-01-01"})


def test_empty_none_numbers_lists_and_dates() -> None:
    q = question_text("Run x?", {"a": "", "b": None, "c": 3, "d": True, "e": ["p", "q"], "f": {"k": 1}})
    assert q.splitlines()[1:] == [
        "a: *(empty)*",
        "b: `null`",
        "c: `3`",
        "d: `true`",
        "e[0]: `p`",
        "e[1]: `q`",
        "f.k: `1`",
    ]
    assert question_text("Run x?", {"e": [], "f": {}}).splitlines()[1:] == ["e: `[]`", "f: `{}`"]


def test_digest_and_question_mark() -> None:
    assert arguments_digest("t", {"a": 1, "b": 2}) == arguments_digest("t", {"b": 2, "a": 1})
    assert arguments_digest("t", {"a": 1}) != arguments_digest("t", {"a": 2})
    assert arguments_digest("t", {"a": 1}) != arguments_digest("u", {"a": 1})
    assert as_question("Delete 3 records") == "Delete 3 records?"
    assert as_question("Go ahead?") == "Go ahead?"
