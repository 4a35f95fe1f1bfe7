"""`make chat`: each line of the conversation on its own line. The bot's answer grows in place
while it streams, and once the bot is done the cursor is back at the start of a line, so what
the person types next is never glued to the bot's last words."""

from __future__ import annotations

import io

from vagent_dev.chat import QUIET_SECONDS, RESET, Transcript


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def plain(out: io.StringIO) -> str:
    return out.getvalue().replace("\033[36m", "").replace(RESET, "")


def test_an_answer_grows_in_place_and_ends_its_line_when_the_bot_is_done() -> None:
    out, clock = io.StringIO(), Clock()
    t = Transcript(out, clock)
    t.new("$a", "The travel")
    t.edit("$a", "The travel policy says (`budget-2027`)")
    t.tick()
    assert plain(out) == "vagent: The travel policy says (`budget-2027`)"  # still streaming
    clock.now += QUIET_SECONDS
    t.tick()
    assert plain(out) == "vagent: The travel policy says (`budget-2027`)\n"
    # the next answer starts on a line of its own, not after the person's input
    t.new("$b", "You have 2 open tickets.")
    clock.now += QUIET_SECONDS
    t.tick()
    assert plain(out).endswith("(`budget-2027`)\nvagent: You have 2 open tickets.\n")


def test_no_line_is_ended_while_the_bot_is_still_typing() -> None:
    out, clock = io.StringIO(), Clock()
    t = Transcript(out, clock)
    t.bot_typing = True
    t.new("$a", "Looking it up")
    clock.now += 10 * QUIET_SECONDS
    t.tick()
    assert not plain(out).endswith("\n")
    t.bot_typing = False
    t.tick()
    assert plain(out).endswith("Looking it up\n")


def test_an_answer_that_goes_on_after_its_line_was_ended_loses_no_text_and_doubles_no_break() -> None:
    out, clock = io.StringIO(), Clock()
    t = Transcript(out, clock)
    t.new("$a", "Sources:")
    clock.now += QUIET_SECONDS
    t.tick()
    t.edit("$a", "Sources:\n- [1] travel-policy")
    assert plain(out) == "vagent: Sources:\n- [1] travel-policy"


def test_an_edit_that_rewrites_earlier_text_is_shown_whole_on_a_new_line() -> None:
    out, clock = io.StringIO(), Clock()
    t = Transcript(out, clock)
    t.new("$a", "Deleting…")
    t.edit("$a", "Deleted 12 records.")
    assert plain(out) == "vagent: Deleting…\nvagent (edited): Deleted 12 records."


def test_a_streamed_markdown_answer_is_shown_readably_without_being_rewritten() -> None:
    """`/why`'s account came as raw Markdown (`**How this answer came about:**`); now it reads
    as text, grows in place however the edits cut it, and nothing is shown twice."""
    out, clock = io.StringIO(), Clock()
    t = Transcript(out, clock)
    t.new("$w", "🔍 *")
    t.edit("$w", "🔍 **How this answer came about:** ans")
    t.edit("$w", "🔍 **How this answer came about:** answered\n\n**Steps**\n1. model call\n-")
    t.edit("$w", "🔍 **How this answer came about:** answered\n\n**Steps**\n1. model call\n- 📄 policy")
    clock.now += QUIET_SECONDS
    t.tick()
    assert plain(out) == (
        "vagent: 🔍 How this answer came about: answered\n\nSteps\n1. model call\n- 📄 policy\n"
    )


def test_what_was_held_back_shows_once_the_bot_is_done() -> None:
    out, clock = io.StringIO(), Clock()
    t = Transcript(out, clock)
    t.new("$a", "2 * 3 is 6 *")
    assert plain(out) == "vagent: 2 * 3 is 6 "
    clock.now += QUIET_SECONDS
    t.tick()
    assert plain(out) == "vagent: 2 * 3 is 6 *\n"


def test_a_terminal_shows_bold_as_bold() -> None:
    out = io.StringIO()
    t = Transcript(out, Clock(), tty=True)
    t.new("$a", "**Total:** 3\n- one")
    assert plain(out) == "vagent: \033[1mTotal:\033[22m 3\n• one"
