"""`make chat` prints the bot's Markdown readably: no raw `**How this answer came about:**`,
bold as bold on a terminal, bullets as bullets, and through a pipe plain text whose list
markers and inline code stay as scripts match them. While an answer streams in, what is
shown never has to be taken back (the transcript only appends)."""

from __future__ import annotations

import pytest

from vagent_dev.chat_render import BOLD, BULLET, NOT_BOLD, render_markdown
from vagent_shared.memory import remembered_line

WHY = """🔍 **How this answer came about:** answered in 1.2 s

**Steps**
1. model call · 120 in / 30 out tokens
2. `database_query` · 4 characters back

**Sources**
- 📄 Travel policy (`travel-policy`)

**Total:** 120 in / 30 out tokens · 1 model call"""


def test_a_pipe_gets_plain_text_without_bold_markers_and_keeps_list_markers_and_code() -> None:
    shown = render_markdown(WHY, tty=False)
    assert "**" not in shown
    assert shown.startswith("🔍 How this answer came about: answered in 1.2 s\n\nSteps\n1. model call")
    assert "\nSources\n- 📄 Travel policy (`travel-policy`)\n" in shown
    assert shown.endswith("\nTotal: 120 in / 30 out tokens · 1 model call")
    assert render_markdown("## Revenue\n* EUR 18.4 million", tty=False) == "Revenue\n* EUR 18.4 million"


def test_a_terminal_gets_bold_headings_and_bullets() -> None:
    shown = render_markdown("# Q3\n**Total:** 3\n- one\n  * two\n1. first", tty=True)
    assert shown == (f"{BOLD}Q3{NOT_BOLD}\n{BOLD}Total:{NOT_BOLD} 3\n{BULLET}one\n  {BULLET}two\n1. first")
    assert "**" not in render_markdown(WHY, tty=True)


def test_bold_never_runs_on_into_the_next_line_on_a_terminal() -> None:
    assert render_markdown("**open\nplain", tty=True) == f"{BOLD}open{NOT_BOLD}\nplain"


def test_code_is_left_as_written() -> None:
    text = "run `a**b**c` then\n```\n# not a heading\n- **x**\n```\n- **y**"
    assert render_markdown(text, tty=False) == ("run `a**b**c` then\n```\n# not a heading\n- **x**\n```\n- y")


@pytest.mark.parametrize("tty", [False, True])
def test_a_streamed_answer_only_ever_grows(tty: bool) -> None:
    """Every prefix renders to a prefix of the next one (the transcript appends only), and the
    final rendering extends the last streamed one."""
    text = WHY + "\n# Heading\n- a **b** c\n```\ncode **x**\n```\n* last *item*"
    before = ""
    for end in range(len(text) + 1):
        now = render_markdown(text[:end], tty=tty, final=False)
        assert now.startswith(before), (text[:end], before, now)
        before = now
    assert render_markdown(text, tty=tty, final=True).startswith(before)


def test_what_the_next_character_decides_is_held_back_until_the_answer_is_final() -> None:
    assert render_markdown("Total *", tty=False, final=False) == "Total "
    assert render_markdown("Total *", tty=False, final=True) == "Total *"
    assert render_markdown("a\n#", tty=False, final=False) == "a\n"
    assert render_markdown("a\n-", tty=False, final=False) == "a\n"
    assert render_markdown("a\n-", tty=False, final=True) == "a\n-"


#: As the graph sends it: the 🧠 line escaped for Matrix's Markdown (remembered_line).
MEMORY_ANSWER = (
    f"Noted.\n\n{remembered_line('I prefer answers in **German** (not `Swiss` German)')}\n**Total:** 1"
)


@pytest.mark.parametrize("tty", [False, True])
def test_the_remembered_line_is_shown_exactly_as_stored(tty: bool) -> None:
    """What was remembered is shown as stored, markers and all: a planted memory is seen for
    what it is; the rest of the answer is rendered as usual."""
    shown = render_markdown(MEMORY_ANSWER, tty=tty).splitlines()
    assert shown[2] == "🧠 Remembered: I prefer answers in **German** (not `Swiss` German)"
    assert shown[3] == (f"{BOLD}Total:{NOT_BOLD} 1" if tty else "Total: 1")


@pytest.mark.parametrize("tty", [False, True])
def test_a_streamed_remembered_line_only_ever_grows(tty: bool) -> None:
    before = ""
    for end in range(len(MEMORY_ANSWER) + 1):
        now = render_markdown(MEMORY_ANSWER[:end], tty=tty, final=False)
        assert now.startswith(before), (MEMORY_ANSWER[:end], before, now)
        before = now
    assert render_markdown(MEMORY_ANSWER, tty=tty).startswith(before)
