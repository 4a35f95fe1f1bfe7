"""Is this a valid answer to the pending question? (shared by the bot and the graph)"""

from __future__ import annotations

import pytest

from vagent_shared.hitl import format_question, normalize_answer, reaction_answer

YN = ["yes", "no"]


@pytest.mark.parametrize(
    "text,expected",
    [
        ("yes", "yes"),
        ("YES", "yes"),
        ("  Yes. ", "yes"),
        ("y", "yes"),
        ("✅", "yes"),
        ("👍", "yes"),
        ("no", "no"),
        ("No!", "no"),
        ("n", "no"),
        ("❌", "no"),
        ("👎", "no"),
        ("maybe", None),
        ("", None),
        ("yes please delete everything", None),
        ("yesno", None),
    ],
)
def test_yes_no(text: str, expected: str | None) -> None:
    assert normalize_answer(text, YN) == expected


def test_options_match_case_insensitively_and_keep_their_spelling() -> None:
    opts = ["Production", "staging"]
    assert normalize_answer("production", opts) == "Production"
    assert normalize_answer(" STAGING ", opts) == "staging"
    assert normalize_answer("prod", opts) is None
    assert normalize_answer("y", opts) is None  # short forms only for yes/no questions


def test_free_text_takes_anything_but_blank() -> None:
    assert normalize_answer("  the blue one ", []) == "the blue one"
    assert normalize_answer("   ", []) is None


def test_reactions_count_only_for_yes_no() -> None:
    assert reaction_answer("✅", YN) == "yes"
    assert reaction_answer("👎", YN) == "no"
    assert reaction_answer("🎉", YN) is None
    assert reaction_answer("✅", ["production", "staging"]) is None


def test_question_format() -> None:
    assert format_question("Delete 3 records?", YN) == "❓ Delete 3 records? (yes/no)"
    assert format_question("Your name?", []) == "❓ Your name?"
