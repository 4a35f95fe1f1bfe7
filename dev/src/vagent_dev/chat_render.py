"""The bot's Markdown as `make chat` prints it: readable in a terminal, not raw `**markers**`.

A terminal (stdout is a TTY) gets bold as ANSI bold, headings bold and list bullets as "• ".
A pipe (tests, `make chat | tee`) gets plain text: bold markers and heading `#`s are dropped,
list markers stay `- ` and inline code keeps its backticks, so what a script matches stays
stable.

Why it is built to stream: the bot's answer arrives as growing edits and the transcript writes
only what is new. `render_markdown(text, final=False)` of a longer text therefore always starts
with the rendering of a shorter one: markers are toggles decided by what came before, and the
few characters whose meaning the next character decides (a lone trailing `*`, a line that so
far is only `#`, `-` or a backtick) are held back until it comes or the answer is final.

A "🧠 Remembered: …" line (vagent_shared.memory.REMEMBERED) is shown exactly as written, in a
terminal and through a pipe: it shows what the agent stored, so a planted "remember that
**…**" must be seen with its markers, not turned into bold.
"""

from __future__ import annotations

import re

from vagent_shared.memory import REMEMBERED, remembered_text

BOLD, NOT_BOLD = "\033[1m", "\033[22m"
BULLET = "• "
_FENCE = "```"
_HEADING = re.compile(r"(#{1,6})[ \t]+(.*)", re.DOTALL)
_LIST_ITEM = re.compile(r"([ \t]*)([-*+])[ \t]+(.*)", re.DOTALL)
#: A partial line that the next character may still turn into a heading, a list item or a fence.
_UNDECIDED_START = re.compile(r"[ \t]*(#{1,6}|[-*+]|`{1,2})")


def render_markdown(text: str, *, tty: bool, final: bool = True) -> str:
    """`text` (Markdown) as terminal text; `final=False` while the answer may still grow."""
    lines = text.split("\n")
    out: list[str] = []
    in_fence = False
    for i, line in enumerate(lines):
        complete = final or i < len(lines) - 1
        if not complete:
            line = _decided_part(line)
        if line.lstrip().startswith(_FENCE):
            in_fence = not in_fence
            out.append(line)
        elif in_fence:
            out.append(line)
        elif line.startswith(REMEMBERED):  # escaped for Matrix's Markdown: shown as stored
            out.append(REMEMBERED + remembered_text(line if complete else _held_escape(line)))
        else:
            out.append(_render_line(line, tty=tty, complete=complete))
    return "\n".join(out)


def _held_escape(line: str) -> str:
    """A 🧠 line still being written, without a trailing `\\` whose escaped character is to come."""
    trailing = len(line) - len(line.rstrip("\\"))
    return line[:-1] if trailing % 2 else line


def _decided_part(line: str) -> str:
    """The part of a line still being written whose rendering cannot change."""
    if _UNDECIDED_START.fullmatch(line):
        return ""
    trailing = len(line) - len(line.rstrip("*"))
    if trailing % 2:  # "**x*": the last `*` may open or close bold with the next one
        return line[:-1]
    return line


def _render_line(line: str, *, tty: bool, complete: bool) -> str:
    heading = _HEADING.fullmatch(line)
    if heading:
        body = _inline(heading.group(2), tty=tty, complete=complete)
        return f"{BOLD}{body}{NOT_BOLD if complete else ''}" if tty else body
    item = _LIST_ITEM.fullmatch(line)
    if item:
        indent, marker, rest = item.groups()
        shown = BULLET if tty else f"{marker} "
        return indent + shown + _inline(rest, tty=tty, complete=complete)
    return _inline(line, tty=tty, complete=complete)


def _inline(text: str, *, tty: bool, complete: bool) -> str:
    """`**bold**` outside inline code: ANSI bold on a TTY, dropped markers otherwise."""
    out: list[str] = []
    bold = in_code = False
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "`":
            in_code = not in_code
        elif not in_code and text.startswith("**", i):
            bold = not bold
            if tty:
                out.append(BOLD if bold else NOT_BOLD)
            i += 2
            continue
        out.append(ch)
        i += 1
    if tty and bold and complete:
        out.append(NOT_BOLD)  # bold never runs on into the next line
    return "".join(out)
