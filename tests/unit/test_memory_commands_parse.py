"""`!remember`, `!memory` and `!forget` as the user types them (vagent_shared.memory): every
form the docs name is understood, a mistyped one answers with how to type it, and anything
else is an ordinary message for the model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vagent_shared.memory import (
    FORGET_USAGE,
    REMEMBER_USAGE,
    Forget,
    ListMemories,
    Malformed,
    MemoryCommand,
    Remember,
    parse_memory_command,
)


@pytest.mark.parametrize(
    ("text", "command"),
    [
        ("!remember answer in German", Remember("answer in German")),
        ("!remember --everywhere answer in German", Remember("answer in German", everywhere=True)),
        ("!memory", ListMemories()),
        ("!memories", ListMemories()),
        ("!forget 1", Forget(1)),
        ("!forget 12", Forget(12)),
        ("!forget all", Forget(None)),
    ],
)
def test_every_documented_form(text: str, command: MemoryCommand) -> None:
    assert parse_memory_command(text) == command


@pytest.mark.parametrize(
    ("text", "command"),
    [
        ("!REMEMBER I prefer short answers", Remember("I prefer short answers")),
        ("!Remember --EVERYWHERE Call me Al", Remember("Call me Al", everywhere=True)),
        ("!MEMORY", ListMemories()),
        ("!Forget ALL", Forget(None)),
        ("!FORGET 3", Forget(3)),
        ("  !memory  \n", ListMemories()),
        ("\t!forget   2 ", Forget(2)),
        ("!forget\nall", Forget(None)),
        ("!forget 007", Forget(7)),
    ],
)
def test_case_and_whitespace_do_not_matter_around_the_command(text: str, command: MemoryCommand) -> None:
    assert parse_memory_command(text) == command


def test_the_text_keeps_its_own_case_and_line_breaks() -> None:
    assert parse_memory_command("!remember\nline one\n  line two\n") == Remember("line one\n  line two")
    assert parse_memory_command("!remember   My Team Is ÉQUIPE-7  ") == Remember("My Team Is ÉQUIPE-7")
    assert parse_memory_command("!remember --everywhere\n\nDeutsch, bitte") == Remember(
        "Deutsch, bitte", everywhere=True
    )
    # the flag only counts as the first word, and only spelt exactly
    assert parse_memory_command("!remember use --everywhere sparingly") == Remember(
        "use --everywhere sparingly"
    )
    assert parse_memory_command("!remember --everywherex y") == Remember("--everywherex y")
    assert parse_memory_command("!remember -everywhere y") == Remember("-everywhere y")
    assert parse_memory_command("!remember all") == Remember("all")


@pytest.mark.parametrize(
    ("text", "usage"),
    [
        ("!remember", REMEMBER_USAGE),
        ("!remember    \n ", REMEMBER_USAGE),
        ("!remember --everywhere", REMEMBER_USAGE),
        ("!remember --everywhere   \n", REMEMBER_USAGE),
        ("!forget", FORGET_USAGE),
        ("!forget 0", FORGET_USAGE),
        ("!forget -1", FORGET_USAGE),
        ("!forget +1", FORGET_USAGE),
        ("!forget 1 2", FORGET_USAGE),
        ("!forget 1.5", FORGET_USAGE),
        ("!forget everything", FORGET_USAGE),
        ("!forget all of it", FORGET_USAGE),
        ("!forget two", FORGET_USAGE),
        # digits that are not ASCII: `str.isdigit` says yes, `int()` raises (once a crash)
        ("!forget ²", FORGET_USAGE),
        ("!forget ³3", FORGET_USAGE),
        ("!forget " + "1" * 5000, FORGET_USAGE),  # beyond int()'s digit limit (once a crash)
    ],
)
def test_a_mistyped_command_says_how_to_type_it(text: str, usage: str) -> None:
    assert parse_memory_command(text) == Malformed(usage)


def test_memory_takes_no_argument() -> None:
    found = parse_memory_command("!memory 3")
    assert isinstance(found, Malformed) and "!memory" in found.usage


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "remember this: answer in German",
        "please !remember this",
        "what do you remember about me?",
        "!rememberme",
        "!remembered that",
        "!remember-all",
        "!remember:foo",
        "!memoryx",
        "!memory_list",
        "!forgetful",
        "!forget-all",
        "! remember x",
        "!!remember x",
        "!reset",
        "!help",
        "forget 1",
    ],
)
def test_anything_else_is_not_a_memory_command(text: str) -> None:
    assert parse_memory_command(text) is None


@settings(max_examples=300, deadline=None)
@given(text=st.text())
def test_no_text_makes_the_parser_fail(text: str) -> None:
    """Whatever a user types (the bot forwards every message), the parser answers."""
    for candidate in (text, f"!forget {text}", f"!remember {text}", f"!memory {text}"):
        found = parse_memory_command(candidate)
        if isinstance(found, Remember):
            assert found.text and found.text == found.text.strip()
        if isinstance(found, Forget):
            assert found.number is None or found.number > 0


@settings(max_examples=200, deadline=None)
@given(text=st.text(min_size=1).filter(lambda t: t.strip() and t.split()[0].lower() != "--everywhere"))
def test_remember_stores_exactly_what_was_typed(text: str) -> None:
    assert parse_memory_command(f"!remember {text}") == Remember(text.strip())
    assert parse_memory_command(f"!remember --everywhere {text}") == Remember(text.strip(), everywhere=True)
