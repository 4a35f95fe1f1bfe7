"""Streaming an answer into Matrix as one message that is edited while the text grows.

Pure parts only: when the next edit may go out (EditThrottle), how a long answer is cut
into messages that fit Matrix's event size limit (split_message), and the exact event
content for a message, a thread reply or an edit (message_content). The caller owns the
clock and the network.

Size budget (why MAX_TEXT_BYTES is 5000). The largest event the bot sends is an edit: the
text twice as `body` and twice as `formatted_body` (top-level `* ` fallback and
`m.new_content`). A homeserver refuses events over 65536 bytes, and in an encrypted room
the content is sent as base64 Megolm ciphertext (4/3 of nio's ASCII-escaped JSON, where a
2-byte character like `é` costs 6 bytes) inside an envelope. So every content dict we
build is kept under CONTENT_MAX_BYTES of `json.dumps` output (4/3 x 45000 + ~2.5 KB of
envelope and PDU < 65536). Markdown can expand without bound (one long reference link
used a thousand times), so when the HTML does not fit message_content drops
formatted_body and sends plain text; the plain body of a MAX_TEXT_BYTES part always fits
(2 x 3 x 5000 + relations < 45000), and ordinary text, CJK and code keep their HTML.
"""

from __future__ import annotations

import bisect
import functools
import json
import re
import unicodedata
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import markdown
from markdown.extensions import Extension
from markdown.preprocessors import Preprocessor
from markdown.treeprocessors import Treeprocessor

#: Max UTF-8 size of one message's text (see the module docstring for the arithmetic).
MAX_TEXT_BYTES = 5000
#: Max `json.dumps` size of a content dict built here, so the event fits even encrypted.
CONTENT_MAX_BYTES = 45_000
HTML_FORMAT = "org.matrix.custom.html"
#: The floor of the edit interval, so first_delay=0 still backs off.
MIN_EDIT_INTERVAL = 0.25
#: Link schemes kept in formatted_body (what Matrix clients allow); others become text.
SAFE_SCHEMES = frozenset({"http", "https", "mailto", "matrix", "mxc", "magnet", "ftp", "sftp", "xmpp"})
MIN_LIMIT_BYTES = 16


class EditThrottle:
    """When may the next edit of a streamed message be sent? A pure, clock-free state machine.

    After `start` (the first text was sent) the first edit may follow after `first_delay`;
    each sent edit multiplies the interval by `backoff` up to `max_interval`, so short
    answers update briskly and long ones do not flood the room. At most `max_edits`
    intermediate edits are sent. The FINAL edit (the complete text, at text_final) is
    always allowed: it is neither throttled by the interval nor counted against the cap;
    it only has to wait for a server rate limit (`final_at`). A rate limit
    (M_LIMIT_EXCEEDED) blocks until its retry_after and raises the interval to at least
    that for the rest of the answer.
    """

    def __init__(
        self, first_delay: float = 0.5, max_interval: float = 4.0, backoff: float = 1.5, max_edits: int = 30
    ) -> None:
        if first_delay < 0 or max_interval <= 0 or backoff < 1 or max_edits < 0:
            raise ValueError("need first_delay >= 0, max_interval > 0, backoff >= 1, max_edits >= 0")
        self.first_delay, self.max_interval, self.backoff, self.max_edits = (
            first_delay,
            max_interval,
            backoff,
            max_edits,
        )
        self._interval = first_delay
        self._next: float | None = None
        self._blocked_until = float("-inf")
        self._sent = 0

    @property
    def started(self) -> bool:
        return self._next is not None

    @property
    def edits_left(self) -> int:
        """Intermediate edits still allowed (the final edit does not count)."""
        return self.max_edits - self._sent

    @property
    def interval(self) -> float:
        """The current gap between edits."""
        return self._interval

    def start(self, now: float) -> None:
        """The first text was sent at `now`."""
        self._next = max(now + self.first_delay, self._blocked_until)

    def next_at(self) -> float | None:
        """When the next intermediate edit may be sent; None before start or once the cap is reached."""
        if self._next is None or self.edits_left <= 0:
            return None
        return self._next

    def due(self, now: float) -> bool:
        """May an intermediate edit go out now?"""
        at = self.next_at()
        return at is not None and now >= at

    def sent(self, now: float) -> None:
        """An intermediate edit was sent at `now`."""
        self._sent += 1
        grown = min(self.max_interval, max(self._interval, MIN_EDIT_INTERVAL) * self.backoff)
        self._interval = max(self._interval, grown)  # never shrinks below a rate-limit's retry_after
        self._next = max(now + self._interval, self._blocked_until)

    def rate_limited(self, now: float, retry_after_ms: int) -> None:
        """The server answered M_LIMIT_EXCEEDED: nothing before now + retry_after."""
        retry = max(0, retry_after_ms) / 1000
        self._blocked_until = max(self._blocked_until, now + retry)
        self._interval = max(self._interval, retry)
        if self._next is not None:
            self._next = max(self._next, self._blocked_until)

    def final_at(self, now: float) -> float:
        """When the final edit may be sent: now, unless a rate limit is still running."""
        return max(now, self._blocked_until)


# --------------------------------------------------------------------------------------------
# Splitting


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


# --------------------------------------------------------------------------------------------
# Rendering


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def clean_text(text: str) -> str:
    """Drop control characters (not tab/newline): invisible, and 6 bytes each in JSON.

    NUL in particular is refused by homeservers backed by PostgreSQL, and STX/ETX are
    Python-Markdown's own placeholder markers.
    """
    return _CONTROL.sub("", text)


def _safe_url(url: str) -> bool:
    return _scheme(url) in SAFE_SCHEMES


class _SafeLinks(Treeprocessor):  # type: ignore[misc]  # markdown ships no type hints
    """Links with a scheme clients do not allow (javascript:, data:, relative) become plain text.

    Images become links: Matrix clients only show `mxc://` images, and fetching an
    arbitrary URL would leak the reader's IP address.
    """

    def run(self, root: ET.Element) -> None:
        for el in root.iter():
            if el.tag == "img":
                src, alt = el.get("src", ""), el.get("alt", "")
                if _scheme(src) == "mxc":
                    continue
                el.attrib.clear()
                el.tag, el.text = "a", alt or src
                if _safe_url(src):
                    el.set("href", src)
                else:
                    el.tag = "span"
            elif el.tag == "a" and not _safe_url(el.get("href", "")):
                el.attrib.clear()
                el.tag = "span"


def _scheme(url: str) -> str:
    squeezed = "".join(ch for ch in url if ord(ch) > 0x20)  # browsers ignore these inside schemes
    try:
        return urlsplit(squeezed).scheme.lower()
    except ValueError:
        return ""


_LIST_START = re.compile(r" {0,3}(?:[-*+]|1\.)[ \t]+\S")  # may interrupt a paragraph (CommonMark)
_LIST_ITEM = re.compile(r"\s*(?:[-*+]|\d+\.)[ \t]+\S")


class _ListAfterText(Preprocessor):  # type: ignore[misc]
    """`Steps:` then `- one` on the next line starts a list in CommonMark (and in what LLMs
    write); Python-Markdown needs a blank line first, so one is added. Code blocks are
    already stashed away when this runs."""

    def run(self, lines: list[str]) -> list[str]:
        out: list[str] = []
        in_list = False
        for line in lines:
            if not line.strip():
                in_list = False
            elif _LIST_ITEM.match(line):
                if not in_list and out and out[-1].strip() and _LIST_START.match(line):
                    out.append("")
                in_list = True
            out.append(line)
        return out


class _ChatMarkdown(Extension):  # type: ignore[misc]
    """Markdown as a chat needs it. Raw HTML in the input is shown as text, never passed
    through (the LLM or a quoted message must not inject markup); automatic e-mail links
    are off (their entity "obfuscation" only bloats the event); lists may follow a line
    of text directly."""

    def extendMarkdown(self, md: markdown.Markdown) -> None:
        md.preprocessors.deregister("html_block")
        md.preprocessors.register(_ListAfterText(md), "vagent_list_after_text", 15)  # after fenced code (25)
        md.inlinePatterns.deregister("html")
        md.inlinePatterns.deregister("automail")
        md.treeprocessors.register(_SafeLinks(md), "vagent_safe_links", 5)  # after inline (20)


@functools.cache
def _markdown() -> markdown.Markdown:
    """One converter per process (reset before each use): building one loads five extensions."""
    return markdown.Markdown(extensions=["fenced_code", "tables", "sane_lists", "nl2br", _ChatMarkdown()])


def render_markdown(text: str) -> str:
    """Markdown -> the HTML of formatted_body (fenced code, tables, lists, line breaks kept).

    A single paragraph is returned without its `<p>` wrapper, as Element does for its own
    messages.
    """
    md = _markdown()
    md.reset()
    html: str = md.convert(clean_text(text)).strip()
    if html.startswith("<p>") and html.endswith("</p>") and html.count("<p>") == 1:
        html = html[3:-4]
    return html


def message_content(
    text: str,
    *,
    thread_root: str | None = None,
    reply_to: str | None = None,
    replaces: str | None = None,
    notice: bool = False,
    html: bool = True,
) -> dict[str, Any]:
    """The content of an `m.room.message`: a message, a thread message, a reply, or an edit.

    In a thread, `reply_to` is the event non-thread clients show it as a reply to (the
    thread fallback, `is_falling_back: true`); it defaults to the thread root. An edit
    (`replaces`) carries only the replace relation: thread and reply are inherited from
    the original event, so thread_root/reply_to are ignored. When the content with HTML
    would exceed CONTENT_MAX_BYTES, formatted_body is left out (see the module docstring).
    """
    text = clean_text(text)
    # empty m.mentions: nothing an LLM writes ("@room", a user id) can ping anyone
    new: dict[str, Any] = {"msgtype": "m.notice" if notice else "m.text", "body": text, "m.mentions": {}}
    if html:
        new["format"] = HTML_FORMAT
        new["formatted_body"] = render_markdown(text)
    content: dict[str, Any]
    if replaces is not None:
        content = {"msgtype": new["msgtype"], "body": "* " + text, "m.mentions": {}}
        if html:
            content["format"] = HTML_FORMAT
            content["formatted_body"] = "* " + new["formatted_body"]
        content["m.new_content"] = new
        content["m.relates_to"] = {"rel_type": "m.replace", "event_id": replaces}
    else:
        content = dict(new)
        if thread_root is not None:
            content["m.relates_to"] = {
                "rel_type": "m.thread",
                "event_id": thread_root,
                "is_falling_back": True,
                "m.in_reply_to": {"event_id": reply_to or thread_root},
            }
        elif reply_to is not None:
            content["m.relates_to"] = {"m.in_reply_to": {"event_id": reply_to}}
    if html and content_size(content) > CONTENT_MAX_BYTES:
        return message_content(
            text, thread_root=thread_root, reply_to=reply_to, replaces=replaces, notice=notice, html=False
        )
    return content


def content_size(content: dict[str, Any]) -> int:
    """Bytes of the content as JSON with non-ASCII escaped: an upper bound of what is sent."""
    return len(json.dumps(content).encode())


_PROGRESS_ESCAPE = re.compile(r"[\\`*\[\]]|(?<!\w)_|_(?!\w)")
MAX_PROGRESS_CHARS = 200


def progress_line(text: str) -> str:
    """A compact italic status shown while tools run, e.g. `_Running database_query…_`.

    One line, at most MAX_PROGRESS_CHARS, Markdown in it escaped so it cannot break the
    italics (an underscore inside a word, as in a tool name, needs no escape).
    """
    words = " ".join(clean_text(text).split()).rstrip(".…").rstrip() or "Working"
    if len(words) > MAX_PROGRESS_CHARS:
        words = words[: MAX_PROGRESS_CHARS - 1].rstrip()
    return f"_{_PROGRESS_ESCAPE.sub(lambda m: chr(92) + m.group(), words)}…_"
