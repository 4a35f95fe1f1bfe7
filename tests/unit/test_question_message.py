"""A question of the agent too long for one Matrix message is asked in a short message with
the whole question as a file (question_message.py); every message the bot builds for it fits
an event."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from vagent_bot.answers.event_content import message_content
from vagent_bot.answers.question_message import FILENAME, MAX_HEADLINE_CHARS, question_message
from vagent_bot.answers.size_budget import CONTENT_MAX_BYTES, MAX_TEXT_BYTES, content_size
from vagent_shared.hitl import format_question

YES_NO = ["yes", "no"]


def test_a_question_that_fits_is_one_message() -> None:
    q = "Create this ticket?\n`title`: `Printer jam`"
    shown = question_message(q, YES_NO)
    assert shown.text == "❓ Create this ticket? (yes/no)\n`title`: `Printer jam`"
    assert shown.attachment is None


def test_a_long_question_is_asked_briefly_and_sent_whole_as_a_file() -> None:
    planted = "CONFIDENTIAL: the merger closes on 3 March."
    body = "filler " * 2000 + planted + " filler" * 2000
    head = "Create this ticket in the ticket service, in your name?"
    q = f"{head}\n`description` (28 043 characters):\n```\n{body}\n```"
    shown = question_message(q, YES_NO)
    assert shown.attachment == format_question(q, YES_NO)  # every character, as the graph wrote it
    first, note = shown.text.split("\n")
    assert first == "❓ Create this ticket in the ticket service, in your name? (yes/no)"
    size = f"{len(shown.attachment):,}".replace(",", " ")
    assert f"all of it ({size} characters" in note and f"`{FILENAME}`" in note
    assert planted not in shown.text and len(shown.text.encode()) < 1000


def test_a_long_first_line_is_cut_in_the_message_only() -> None:
    q = "Which of these? " + "option " * 1000
    shown = question_message(q, [])
    assert shown.attachment == format_question(q, [])
    first = shown.text.split("\n")[0]
    assert first.endswith("…") and len(first) == len("❓ ") + MAX_HEADLINE_CHARS


@settings(max_examples=80, deadline=None)
@given(
    question=st.text(min_size=1, max_size=30_000),
    multiplier=st.integers(1, 8),
    options=st.sampled_from([YES_NO, [], ["production", "staging"]]),
)
def test_every_question_becomes_messages_that_fit_and_lose_nothing(
    question: str, multiplier: int, options: list[str]
) -> None:
    question = question * multiplier
    shown = question_message(question, options)
    full = format_question(question, options)
    if shown.attachment is None:
        assert shown.text == full and len(full.encode()) <= MAX_TEXT_BYTES
    else:
        assert shown.attachment == full and len(full.encode()) > MAX_TEXT_BYTES
    for reply_to in (None, "$q"):
        assert content_size(message_content(shown.text, reply_to=reply_to)) <= CONTENT_MAX_BYTES
