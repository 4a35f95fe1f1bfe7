"""Is this text a valid answer to a pending question? Used by the bot and the graph.

Answers match the options case-insensitively, ignoring surrounding white space and
trailing punctuation. Yes/no questions also take the usual short forms and the
reaction emoji (✅ 👍 / ❌ 👎).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

YES, NO = "yes", "no"
YES_NO: tuple[str, str] = (YES, NO)
_YES_FORMS = {"yes", "y", "✅", "👍", "👍️", "✔", "✔️"}
_NO_FORMS = {"no", "n", "❌", "👎", "👎️", "✖", "✖️"}
_STRIP = " \t\r\n.!?,;:\"'`"


def is_yes_no(options: list[str] | tuple[str, ...]) -> bool:
    return sorted(o.strip().lower() for o in options) == [NO, YES]


def normalize_answer(text: str, options: list[str] | tuple[str, ...]) -> str | None:
    """The option `text` selects, spelled as in `options`; None when it selects none.

    With no options any non-empty text is a valid (free-text) answer.
    """
    cleaned = text.strip().strip(_STRIP).strip()
    if not options:
        return text.strip() or None
    low = cleaned.lower()
    for option in options:
        if low == option.strip().lower():
            return option
    if is_yes_no(options):
        picked = YES if low in _YES_FORMS else NO if low in _NO_FORMS else None
        if picked is not None:
            return next(o for o in options if o.strip().lower() == picked)
    return None


def reaction_answer(key: str, options: list[str] | tuple[str, ...]) -> str | None:
    """A reaction counts only for yes/no questions."""
    if not is_yes_no(options):
        return None
    return normalize_answer(key, options)


def format_question(question: str, options: list[str] | tuple[str, ...]) -> str:
    """How a question is shown to the human: `❓ Delete 3 records? (yes/no)`. The options
    follow the first line: a confirmation's further lines list what the call will use."""
    suffix = f" ({'/'.join(options)})" if options else ""
    first, newline, rest = question.partition("\n")
    return f"❓ {first}{suffix}{newline}{rest}"


class PendingQuestion(BaseModel):
    """What the bot stores under `hitl_pending:{session_id}` while it waits for the answer."""

    session_id: str
    room_id: str
    user_id: str
    question: str
    options: list[str] = Field(default_factory=list)
    interrupt_id: str
    #: The bot's question message: reactions to it count as answers for yes/no questions.
    question_event_id: str | None = None
    thread_root: str | None = None
    reply_to: str | None = None
    asked_at: float = 0.0
