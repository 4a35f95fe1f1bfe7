"""Cutting a long answer into messages that each fit one Matrix event and read on their own.

A part is at most `size_budget.MAX_TEXT_BYTES` (why that number: `size_budget`); a code
block cut in two is closed and reopened, so both halves still render as code. Pure: no I/O.
"""

from __future__ import annotations

import bisect
import re
import unicodedata
from dataclasses import dataclass

from vagent_bot.answers.size_budget import MAX_TEXT_BYTES

#: The smallest limit split_message accepts.
MIN_LIMIT_BYTES = 16


@dataclass(frozen=True)
class _Fence:
    """A fenced code block: offsets into the text (close_* = len(text) when never closed)."""

    line_start: int
    content_start: int
    close_start: int
    close_end: int
    opener: str  # the opening line, e.g. "```python"
    closer: str  # what closes it, e.g. "```"


def split_message(text: str, limit_bytes: int = MAX_TEXT_BYTES) -> list[str]:
    """Cut `text` into parts of at most `limit_bytes` UTF-8 bytes, each readable on its own.

    Cuts prefer a paragraph break, then a line break, then a space (when one lies in the
    second half of the room left), else the last character that fits (never inside a code
    point, and not inside an emoji sequence or before a combining mark when avoidable). A
    code block cut in two is closed at the end of one part and reopened with the same
    opening line in the next. Only white space at the cuts is dropped: the parts without
    the added fence lines are, in order, the original text. Fences whose opening line is
    longer than a quarter of the limit are treated as plain text. Never returns an empty
    list (a long run of nothing but white space gives `[""]`).
    """
    if limit_bytes < MIN_LIMIT_BYTES:
        raise ValueError(f"limit_bytes must be at least {MIN_LIMIT_BYTES}")
    if _size(text) <= limit_bytes:
        return [text]
    fences = _Fences(_fences(text, limit_bytes // 4))
    reserve = max((_size(f.closer) + 1 for f in fences.all), default=0)
    parts: list[str] = []
    pos = _skip_blank_lines(text, 0)
    head = ""
    while pos < len(text):
        if _skip_white(text, pos) == len(text):
            break
        room = limit_bytes - _size(head)
        if len(text) - pos <= room and _size(text[pos:]) <= room:
            parts.append(head + text[pos:])
            break
        end = _fit(text, pos, room - reserve)
        cut, resume = _choose_cut(text, pos, end, fences)
        if not text[pos:cut].strip():  # a run of white space longer than a whole part
            pos = _skip_white(text, pos)
            continue
        inside = fences.open_at_cut(cut)
        tail = "\n" + inside.closer if inside else ""
        if inside and inside.close_start < inside.close_end and not text[cut : inside.close_start].strip():
            resume = inside.close_end  # only the closing line was left: the added one replaces it
        parts.append(head + text[pos:cut] + tail)
        reopen = fences.reopen_at(resume)
        head = reopen.opener + "\n" if reopen else ""
        pos = resume
    return parts or [""]  # only white space, longer than a part


def _size(s: str) -> int:
    return len(s.encode("utf-8"))


def _fit(text: str, pos: int, budget: int) -> int:
    """The largest end such that text[pos:end] is at most `budget` bytes (a code-point boundary)."""
    lo, hi = pos, min(len(text), pos + budget)
    if _size(text[pos:hi]) <= budget:
        return hi
    while lo < hi:  # invariant: text[pos:lo] fits, text[pos:hi+1] does not
        mid = (lo + hi + 1) // 2
        if _size(text[pos:mid]) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


_OPEN_FENCE = re.compile(r"( {0,3})(`{3,}|~{3,})(.*)")


_LINES = re.compile(r"[^\n]*\n?")


def _fences(text: str, max_opener_bytes: int) -> list[_Fence]:
    """Fenced code blocks (CommonMark rules: closed by the same character, at least as many)."""
    fences: list[_Fence] = []
    current: tuple[int, int, str, str, str] | None = None  # line_start, content_start, opener, indent, fence
    for line in _LINES.finditer(text):
        if not line.group():
            break
        start, bare = line.start(), line.group().rstrip("\r\n")
        if current is None:
            m = _OPEN_FENCE.fullmatch(bare)
            if m and not (m.group(2)[0] == "`" and "`" in m.group(3)) and _size(bare) <= max_opener_bytes:
                current = (start, line.end(), bare, m.group(1), m.group(2))
            continue
        line_start, content_start, opener, indent, fence = current
        stripped = bare.strip(" ")
        if (
            len(bare) - len(bare.lstrip(" ")) <= 3
            and stripped
            and set(stripped) == {fence[0]}
            and (len(stripped) >= len(fence))
        ):
            fences.append(_Fence(line_start, content_start, start, start + len(bare), opener, indent + fence))
            current = None
    if current is not None:
        line_start, content_start, opener, indent, fence = current
        fences.append(_Fence(line_start, content_start, len(text), len(text), opener, indent + fence))
    return fences


class _Fences:
    """The code blocks of a text, found by position (they are sorted and never overlap)."""

    def __init__(self, fences: list[_Fence]) -> None:
        self.all = fences
        self._starts = [f.line_start for f in fences]

    def near(self, lo: int, hi: int) -> list[_Fence]:
        """The blocks touching [lo, hi]."""
        first = max(0, bisect.bisect_right(self._starts, lo) - 1)
        return [f for f in self.all[first : bisect.bisect_right(self._starts, hi)] if f.close_end >= lo]

    def _at(self, i: int) -> _Fence | None:
        k = bisect.bisect_left(self._starts, i) - 1  # the last block starting before i
        return self.all[k] if k >= 0 else None

    def forbids(self, cut: int) -> bool:
        """Cuts inside a fence line, or right after an opening one (an empty block), are not used."""
        f = self._at(cut)
        return f is not None and (f.line_start < cut <= f.content_start or f.close_start < cut < f.close_end)

    def open_at_cut(self, cut: int) -> _Fence | None:
        """The code block a part ending at `cut` leaves open."""
        f = self._at(cut)
        return f if f is not None and f.line_start < cut <= f.close_start else None

    def reopen_at(self, resume: int) -> _Fence | None:
        """The code block a part starting at `resume` is inside of (and must reopen)."""
        f = self._at(resume + 1)
        return f if f is not None and f.content_start <= resume <= f.close_start else None


_BREAK = re.compile(r"[ \t\r]*\n(?:[ \t\r]*\n)*")  # a line break, with any blank lines after it
_SPACE = re.compile(r"(?<=\S)[ \t]+|(?<=[。！？；])")  # between words; after CJK sentence punctuation
_PARAGRAPH, _LINE, _WORD = 3, 2, 1


def _choose_cut(text: str, pos: int, end: int, fences: _Fences) -> tuple[int, int]:
    """Where the part starting at `pos` ends (`cut`) and the next one starts (`resume`).

    `end` is the last cut that fits. White space between cut and resume is dropped; a line
    break keeps the next line's indentation (code!).
    """
    window = text[pos:end]
    first = end - len(window.lstrip())  # a part must hold more than white space
    candidates: list[tuple[int, int, int]] = []  # (cut, resume, level)
    for m in _BREAK.finditer(text, pos, end + 1):
        full = _BREAK.match(text, m.start())  # the run may go on past `end`
        assert full is not None
        candidates.append((m.start(), full.end(), _PARAGRAPH if full.group().count("\n") > 1 else _LINE))
    for m in _SPACE.finditer(text, pos, end + 1):
        candidates.append((m.start(), m.end(), _WORD))
    valid = [cand for cand in candidates if first < cand[0] <= end and not fences.forbids(cand[0])]
    half = pos + (end - pos) / 2
    for level in (_PARAGRAPH, _LINE, _WORD):
        best = max((cand for cand in valid if cand[2] == level and cand[0] >= half), default=None)
        if best is not None:
            return best[0], best[1]
    if valid:
        c, r, _ = max(valid, key=lambda cand: (cand[0], cand[2]))
        return c, r
    cut = _hard_cut(text, pos, end, fences.near(pos, end))
    return cut, cut


def _hard_cut(text: str, pos: int, end: int, fences: list[_Fence]) -> int:
    """No white space to cut at: the last fitting character boundary outside a fence line."""
    cut = end
    for _ in range(32):  # do not split an emoji sequence or a letter from its accent
        if cut - 1 <= pos or not _joined(text, cut):
            break
        cut -= 1
    if _joined(text, cut):
        cut = end  # an absurdly long cluster: a code-point boundary has to do
    for f in fences:  # move out of a fence line when there is room before it
        if f.line_start < cut <= f.content_start and f.line_start > pos:
            return f.line_start
        if f.close_start < cut < f.close_end and f.close_start > pos:
            return f.close_start
    return cut


_RI = range(0x1F1E6, 0x1F200)
#: Variation selectors, skin-tone modifiers, emoji tag characters: always part of the previous character.
_EXTENDERS = ((0xFE00, 0xFE0F), (0x1F3FB, 0x1F3FF), (0xE0020, 0xE007F), (0xE0100, 0xE01EF))


def _joined(text: str, i: int) -> bool:
    """Would cutting before text[i] split what is shown as one character?"""
    if i <= 0 or i >= len(text):
        return False
    before, after = text[i - 1], text[i]
    cp = ord(after)
    if before == "\u200d" or after == "\u200d" or (before == "\r" and after == "\n"):
        return True
    if unicodedata.category(after) in ("Mn", "Me", "Mc"):
        return True
    if any(lo <= cp <= hi for lo, hi in _EXTENDERS):
        return True
    if cp in _RI:  # regional indicators pair up into flags
        n = 0
        while i - 1 - n >= 0 and ord(text[i - 1 - n]) in _RI:
            n += 1
        return n % 2 == 1
    return False


_BLANK_LINES = re.compile(r"(?:[ \t\r]*\n)*")
_WHITE = re.compile(r"\s*")


def _skip_blank_lines(text: str, i: int) -> int:
    m = _BLANK_LINES.match(text, i)
    return m.end() if m else i


def _skip_white(text: str, i: int) -> int:
    m = _WHITE.match(text, i)
    return m.end() if m else i
