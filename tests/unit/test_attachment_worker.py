"""The worker's text cap (attachments/worker.py) on every path a document takes, with real
pypdf on crafted PDFs whose pages hold far more than the cap, and as a property over any
mix of section lengths; and the pure parts of its sandbox and of the graph's bound on
what it reads back (sandbox.py, reading.py)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.big_pages import pdf_of_pages
from vagent_graph.attachments.reading import ReadLimits, answer_limit
from vagent_graph.attachments.sandbox import seccomp_program
from vagent_graph.attachments.worker import document_answer, joined_within
from vagent_graph.knowledge.parsing import ParsedDocument, Section, parse_document

CAP = 32_000
HUGE = 400_000  # characters on one page: over ten times the cap


def read_pdf(pages: list[str], max_chars: int = CAP) -> dict[str, object]:
    """What the worker answers for this PDF (parse_document and document_answer, as _document)."""
    return document_answer(
        parse_document(pdf_of_pages(pages), "pdf", "attachment", max_chars=max_chars), max_chars
    )


@pytest.mark.parametrize(
    ("pages", "read", "early"),
    [
        (["a" * HUGE, "b" * HUGE, "c" * HUGE], 1, True),  # the first page is the whole budget, and more
        (["a" * 100, "b" * HUGE, "c" * 100], 2, True),  # the page that reaches the budget is huge
        (["a" * 20_000, "b" * 20_000, "c" * 10], 2, True),  # two ordinary pages pass the budget
        (["a" * 20_000, "b" * HUGE], 2, False),  # read to the end, the last page huge
        (["a" * HUGE], 1, False),  # one page only
    ],
)
def test_a_pdf_text_is_capped_whether_reading_stopped_early_or_not(
    pages: list[str], read: int, early: bool
) -> None:
    answer = read_pdf(pages)
    text = answer["text"]
    assert isinstance(text, str) and len(text) == CAP + 1  # one more: the cut is seen as a cut
    assert text.startswith("[page 1]\n\n" + pages[0][:100])
    assert (answer["pages"], answer["pages_read"]) == (len(pages), read)
    whole = sum(len(f"[page {n}]") + 2 + len(p) for n, p in enumerate(pages, start=1)) + 2 * (len(pages) - 1)
    assert answer["chars"] == (None if early else whole)


def test_a_short_pdf_is_given_whole() -> None:
    answer = read_pdf(["alpha", "beta"])
    assert answer["text"] == "[page 1]\n\nalpha\n\n[page 2]\n\nbeta"
    assert answer["chars"] == len("[page 1]\n\nalpha\n\n[page 2]\n\nbeta")


@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 3000), max_size=8),
    pdf=st.booleans(),
    unread=st.integers(0, 3),
    max_chars=st.integers(0, 2000),
)
def test_no_document_answer_is_longer_than_the_cap(
    lengths: list[int], pdf: bool, unread: int, max_chars: int
) -> None:
    sections = [Section((f"h{n}",), chr(ord("a") + n) * size) for n, size in enumerate(lengths)]
    total = len(sections) + unread if pdf and unread and sections else None
    doc = ParsedDocument("t", "pdf" if pdf else "text", sections, total_pages=total)
    answer = document_answer(doc, max_chars)
    full, _ = joined_within(_parts(doc), 10**9)
    assert answer["text"] == full[: max_chars + 1]
    assert answer["chars"] == (None if total is not None else len(full))


def _parts(doc: ParsedDocument) -> list[str]:
    """The parts as document_answer joins them, written out again."""
    parts: list[str] = []
    previous: tuple[str, ...] = ()
    for number, section in enumerate(doc.sections, start=1):
        if doc.format == "pdf":
            parts.append(f"[page {number}]")
        elif section.headings and section.headings != previous:
            parts.append("#" * len(section.headings) + " " + section.headings[-1])
        previous = section.headings
        if section.text:
            parts.append(section.text)
    return parts


@given(parts=st.lists(st.text(max_size=50), max_size=6), limit=st.integers(0, 400))
def test_joined_within_is_the_join_cut(parts: list[str], limit: int) -> None:
    assert joined_within(parts, limit) == ("\n\n".join(parts)[:limit], len("\n\n".join(parts)))


def test_the_graph_reads_no_more_than_a_capped_answer_can_hold() -> None:
    limits = ReadLimits(max_bytes=1 << 20, timeout=5, memory_mb=256, image_max_side=256, max_chars=1000)
    assert 6 * 1001 < answer_limit("document", limits) < 6 * 1001 + 100_000
    assert 4 * 256 * 256 * 4 // 3 < answer_limit("image", limits) < 4 * 256 * 256 * 5 // 3 + 200_000


def test_the_seccomp_filter_is_known_only_for_architectures_whose_numbers_are_here() -> None:
    assert seccomp_program("riscv64", 1) is None
    for machine in ("x86_64", "aarch64"):
        program = seccomp_program(machine, 1234)
        assert program is not None and len(program) % 8 == 0 and len(program) // 8 < 256
        first = struct.unpack("=HBBI", program[:8])
        assert first == (0x20, 0, 0, 4)  # it starts by checking the architecture
