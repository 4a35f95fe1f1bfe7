"""How the agent's question is shown in the room. Pure: no I/O.

A confirmation shows every character the call will send (the graph's tools/confirmation.py), so
it can be longer than one message of the bot (`size_budget.MAX_TEXT_BYTES`; a Matrix event
may not exceed 64 KiB at all). Then the message keeps the first line (what is asked, and
the options) and says where the rest is: the whole question, as a text file sent with it in
the same thread. The answer is given as always: yes or no in the thread, or a reaction to
the message.
"""

from __future__ import annotations

from dataclasses import dataclass

from vagent_bot.answers.size_budget import MAX_TEXT_BYTES
from vagent_shared.hitl import format_question

#: The name of the file a long question is sent in.
FILENAME = "question.txt"
#: A longer first line is cut in the message (the file has all of it).
MAX_HEADLINE_CHARS = 1000


@dataclass(frozen=True)
class QuestionMessage:
    """The message's text and, for a long question, the whole question as the text of the
    file sent with it (None: the message shows all of it)."""

    text: str
    attachment: str | None = None


def question_message(
    question: str, options: list[str] | tuple[str, ...], limit_bytes: int = MAX_TEXT_BYTES
) -> QuestionMessage:
    """The question as one message when it fits in `limit_bytes`; else its first line, the
    options and where the whole question is, with the whole question as the file's text."""
    full = format_question(question, options)
    if len(full.encode()) <= limit_bytes:
        return QuestionMessage(full)
    first = question.split("\n", 1)[0]
    if len(first) > MAX_HEADLINE_CHARS:
        first = first[: MAX_HEADLINE_CHARS - 1] + "…"
    size = f"{len(full):,}".replace(",", " ")
    note = (
        f"📎 This question is too long for one message: all of it ({size} characters, everything "
        f"that will be used) is in the file `{FILENAME}` sent with it. Read it before you answer."
    )
    return QuestionMessage(format_question(f"{first}\n{note}", options), full)
