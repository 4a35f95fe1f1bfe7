"""Heading-aware chunking: a parsed document becomes the chunks that are embedded and searched.

Why these rules: a chunk never spans two sections, so its heading path describes all of it; a
long section is cut at the strongest boundary available (paragraph, then sentence, then line,
then word, and only a monster word is cut hard) so chunks read as whole thoughts; consecutive
chunks of one section overlap by whole sentences or words, so a fact across a cut is still
found. Deterministic (chunk ids are derived from positions) and linear in the text length.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from vagent_graph.knowledge.parsing import ParsedDocument

#: Joins a section's heading path into Chunk.section.
SECTION_SEPARATOR: Final = " > "


@dataclass(frozen=True)
class Chunk:
    """`text` is the body only; the caller prepends title and section for embedding."""

    position: int
    section: str
    text: str


def chunk_document(doc: ParsedDocument, *, max_chars: int = 1200, overlap_chars: int = 150) -> list[Chunk]:
    """The chunks of every section in document order. Sections with no text (a heading with
    nothing under it, a blank PDF page) produce no chunk: a heading alone answers nothing."""
    _check_sizes(max_chars, overlap_chars)
    chunks: list[Chunk] = []
    for section in doc.sections:
        path = SECTION_SEPARATOR.join(section.headings)
        for text in split_text(section.text, max_chars=max_chars, overlap_chars=overlap_chars):
            chunks.append(Chunk(len(chunks), path, text))
    return chunks


def split_text(text: str, *, max_chars: int, overlap_chars: int) -> list[str]:
    """One section's text as pieces of at most max_chars, each a substring of the stripped text."""
    _check_sizes(max_chars, overlap_chars)
    text = text.strip()
    pieces: list[str] = []
    start, floor = 0, 0
    while text:
        if len(text) - start <= max_chars:
            pieces.append(text[start:])
            break
        end = _chunk_end(text, start, floor, max_chars)
        pieces.append(text[start:end].rstrip())
        start, floor = _next_start(text, start, end, overlap_chars, max_chars), end
    return pieces


def _check_sizes(max_chars: int, overlap_chars: int) -> None:
    if max_chars < 1:
        raise ValueError(f"max_chars must be positive, not {max_chars}")
    if overlap_chars < 0 or 2 * overlap_chars >= max_chars:
        raise ValueError(
            f"overlap_chars must be >= 0 and < max_chars / 2 ({max_chars / 2:g}), not {overlap_chars}"
        )


# A "gap" is a run of whitespace between two words; a chunk ends where a gap starts and the next
# begins where one ends. Each pattern's group `gap` is one kind of gap. The searches below look
# only at a window around the cut (pos/endpos), which keeps the whole split linear.

_PARAGRAPH_GAP = re.compile(r"(?<=\S)(?P<gap>[^\S\n]*\n[^\S\n]*\n\s*)")
_LINE_GAP = re.compile(r"(?<=\S)(?P<gap>[^\S\n]*\n\s*)")
#: A sentence end (closing quotes/brackets allowed); validated by _is_sentence_end.
_SENTENCE_GAP = re.compile(r"[.!?…。！？][\"'’”)\]»」』]*(?P<gap>\s*)")
_CJK_STOPS: Final = frozenset("。！？")
_WORD_START = re.compile(r"(?<=\s)(?=\S)")
_NON_SPACE = re.compile(r"\S")
#: How far before/after a window the patterns may need to look to see a whole gap.
_SLACK: Final = 16


def _chunk_end(text: str, start: int, floor: int, max_chars: int) -> int:
    """Where the chunk from `start` ends: the strongest boundary in the second half of the
    window (so no chunk is tiny), else the last word boundary, else a hard cut at max_chars.
    The end is always past `floor`, the previous chunk's end, so every chunk adds text."""
    high = start + max_chars
    low = max(start + max_chars // 2, floor + 1)
    for pattern in (_PARAGRAPH_GAP, _SENTENCE_GAP, _LINE_GAP):
        found = [m.start("gap") for m in _gaps(text, pattern, low, high) if m.start("gap") >= low]
        if found:
            return found[-1]
    return _last_word_end(text, floor + 1, high) or high


def _gaps(text: str, pattern: re.Pattern[str], low: int, high: int) -> list[re.Match[str]]:
    """The gaps of `pattern` that start in [low - slack, high]."""
    matches = pattern.finditer(text, max(0, low - _SLACK), min(len(text), high + _SLACK))
    return [m for m in matches if m.start("gap") <= high and _is_gap(text, m, pattern)]


def _is_gap(text: str, match: re.Match[str], pattern: re.Pattern[str]) -> bool:
    if pattern is not _SENTENCE_GAP:
        return True
    gap_start, gap_end = match.span("gap")
    if gap_start == gap_end:  # CJK sentences are not followed by a space
        return text[match.start()] in _CJK_STOPS and gap_end < len(text)
    return gap_end >= len(text) or not text[gap_end].islower()  # "e.g. this" is no sentence end


def _last_word_end(text: str, low: int, high: int) -> int | None:
    """The last gap start in [low, high] (a word's end), found with C-speed rfind."""
    space = max(text.rfind(c, low, high + 1) for c in " \t\n")
    while space > low and text[space - 1].isspace():
        space -= 1
    return space if space >= low and not text[space - 1].isspace() else None


def _next_start(text: str, start: int, end: int, overlap_chars: int, max_chars: int) -> int:
    """Where the next chunk starts: a sentence (else word) start within the last overlap_chars
    of this chunk, so the two overlap; right after the gap when no such start exists or a long
    run of spaces would leave the next chunk little room for new text."""
    content = _NON_SPACE.search(text, end)
    following = content.start() if content else len(text)
    overlap = _overlap_start(text, start, end, overlap_chars) if overlap_chars else None
    if overlap is None or following - overlap > max_chars // 2:
        return following
    return overlap


def _overlap_start(text: str, start: int, end: int, overlap_chars: int) -> int | None:
    low = max(end - overlap_chars, start + 1)
    if low >= end:
        return None
    sentence_starts = [
        m.end("gap")
        for pattern in (_PARAGRAPH_GAP, _SENTENCE_GAP)
        for m in _gaps(text, pattern, low, end)
        if low <= m.end("gap") < end
    ]
    if sentence_starts:
        return min(sentence_starts)
    word = _WORD_START.search(text, low, end)
    return word.start() if word else None
