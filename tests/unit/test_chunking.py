"""Heading-aware chunking: chunks stay inside one section, respect max_chars whatever the input,
cut at the strongest boundary, overlap within a section only, and are deterministic."""

from __future__ import annotations

import time
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vagent_graph.knowledge.chunking import Chunk, chunk_document, split_text
from vagent_graph.knowledge.parsing import ParsedDocument, Section, parse_document

DOCS = Path(__file__).resolve().parent.parent / "fixtures" / "docs"


def doc(*sections: Section) -> ParsedDocument:
    return ParsedDocument("Title", "markdown", list(sections))


def sentence(n: int) -> str:
    return f"Sentence number {n} talks about topic {n} in some detail."


def paragraph(first: int, count: int) -> str:
    return " ".join(sentence(n) for n in range(first, first + count))


def shared_edge(previous: str, following: str) -> str:
    """The longest suffix of `previous` that `following` starts with."""
    for size in range(min(len(previous), len(following)), 0, -1):
        if following.startswith(previous[-size:]):
            return previous[-size:]
    return ""


def test_a_short_section_is_one_chunk_with_its_heading_path() -> None:
    chunks = chunk_document(doc(Section(("Guide", "Setup", "Linux"), "  Install it.\n")))
    assert chunks == [Chunk(position=0, section="Guide > Setup > Linux", text="Install it.")]


def test_text_before_any_heading_has_an_empty_section() -> None:
    assert chunk_document(doc(Section((), "Preface.")))[0].section == ""


def test_empty_and_heading_only_sections_produce_no_chunk_and_positions_stay_contiguous() -> None:
    chunks = chunk_document(
        doc(
            Section(("A",), ""),
            Section(("A", "B"), "bee"),
            Section(("C",), " \n\t\n "),
            Section(("D",), "dee"),
        )
    )
    assert [(c.position, c.section, c.text) for c in chunks] == [(0, "A > B", "bee"), (1, "D", "dee")]


def test_chunks_never_span_two_sections_and_do_not_overlap_across_them() -> None:
    first = "\n\n".join(paragraph(n, 5) for n in range(0, 50, 5)).replace("topic", "apples")
    second = "\n\n".join(paragraph(n, 5) for n in range(0, 50, 5)).replace("topic", "pears")
    chunks = chunk_document(doc(Section(("Apples",), first), Section(("Pears",), second)), max_chars=500)
    assert [c.position for c in chunks] == list(range(len(chunks)))
    apples = [c for c in chunks if c.section == "Apples"]
    pears = [c for c in chunks if c.section == "Pears"]
    assert len(apples) > 1 and len(pears) > 1
    assert all("pears" not in c.text and c.text in first for c in apples)
    assert all("apples" not in c.text and c.text in second for c in pears)
    assert chunks.index(pears[0]) == len(apples)  # document order: every Apples chunk first
    assert pears[0].text.startswith("Sentence number 0 ")  # no carry-over from the last Apples chunk


def test_a_long_section_is_cut_at_paragraph_boundaries() -> None:
    paragraphs = [paragraph(n, 4) for n in range(0, 80, 4)]  # about 240 characters each
    chunks = chunk_document(doc(Section(("S",), "\n\n".join(paragraphs))), max_chars=1000, overlap_chars=0)
    assert len(chunks) > 3
    for chunk in chunks:
        assert len(chunk.text) <= 1000
        assert chunk.text.split("\n\n")[0] in paragraphs  # starts with a whole paragraph
        assert chunk.text.split("\n\n")[-1] in paragraphs  # ends with a whole paragraph
    assert "\n\n".join(c.text for c in chunks) == "\n\n".join(paragraphs)


def test_a_long_paragraph_is_cut_at_sentence_boundaries() -> None:
    text = paragraph(0, 60)
    chunks = split_text(text, max_chars=400, overlap_chars=0)
    assert len(chunks) > 5
    assert all(len(c) <= 400 and c.startswith("Sentence number ") and c.endswith("detail.") for c in chunks)
    assert " ".join(chunks) == text


def test_a_sentence_longer_than_max_chars_is_cut_between_words() -> None:
    words = [f"word{n}" for n in range(300)]
    chunks = split_text(" ".join(words), max_chars=100, overlap_chars=0)
    assert all(len(c) <= 100 for c in chunks)
    assert [w for c in chunks for w in c.split()] == words  # no word was cut


def test_a_monster_word_is_cut_hard() -> None:
    word = "x" * 2500
    chunks = split_text(f"before {word} after", max_chars=1000, overlap_chars=100)
    assert all(len(c) <= 1000 for c in chunks)
    assert chunks[0] == "before"
    assert "".join(c.replace("before", "").replace("after", "").strip() for c in chunks).count("x") >= 2500


def test_consecutive_chunks_of_a_section_overlap_by_whole_sentences() -> None:
    text = paragraph(0, 80)
    chunks = split_text(text, max_chars=600, overlap_chars=150)
    assert len(chunks) > 3
    for previous, following in pairwise(chunks):
        edge = shared_edge(previous, following)
        assert 0 < len(edge) <= 150
        assert edge.startswith("Sentence number ")  # a whole sentence, not a cut word
        assert previous[-len(edge) - 1].isspace()


def test_overlap_falls_back_to_whole_words_in_a_long_sentence() -> None:
    words = [f"w{n:03d}" for n in range(600)]
    chunks = split_text(" ".join(words), max_chars=300, overlap_chars=50)
    for previous, following in pairwise(chunks):
        edge = shared_edge(previous, following)
        assert 0 < len(edge) <= 50
        assert all(word in words for word in edge.split())  # never a partial word
        assert previous[-len(edge) - 1] == " "


def test_chunking_is_deterministic() -> None:
    parsed = parse_document((DOCS / "handbook.md").read_bytes(), "markdown", "handbook.md")
    text = "\n\n".join(paragraph(n, 7) for n in range(0, 140, 7))
    parsed.sections.append(Section(("Appendix",), text))
    first = chunk_document(parsed, max_chars=300, overlap_chars=60)
    assert len(first) > 10
    assert chunk_document(parsed, max_chars=300, overlap_chars=60) == first


def test_parsed_markdown_chunks_carry_heading_paths() -> None:
    parsed = parse_document((DOCS / "handbook.md").read_bytes(), "markdown", "handbook.md")
    sections = [c.section for c in chunk_document(parsed)]
    assert sections == [
        "",
        "Acme Handbook",
        "Acme Handbook > Expenses",
        "Acme Handbook > Expenses > Travel",
        "Acme Handbook > Holidays",
        "Remote work",
    ]


@pytest.mark.parametrize(("max_chars", "overlap_chars"), [(0, 0), (100, 50), (100, 80), (100, -1)])
def test_bad_sizes_are_rejected(max_chars: int, overlap_chars: int) -> None:
    with pytest.raises(ValueError):
        chunk_document(doc(Section((), "text")), max_chars=max_chars, overlap_chars=overlap_chars)


def test_one_megabyte_chunks_well_under_a_second() -> None:
    text = "\n\n".join(paragraph(n, 6) for n in range(0, 100_000, 6))
    monster = "y" * 200_000 + " " + "word " * 40_000
    parsed = doc(Section(("Prose",), text[:800_000]), Section(("Monster",), monster))
    started = time.perf_counter()
    chunks = chunk_document(parsed)
    assert time.perf_counter() - started < 1.0
    assert len(chunks) > 800


# --- properties -------------------------------------------------------------------------------

_PIECES = [*"ab cd.!?\n\t", "xyz", "。", "\u00a0", "  ", "\n\n", "E.", "x" * 40, "é", '"']
_TEXT = st.one_of(st.text(max_size=1500), st.lists(st.sampled_from(_PIECES), max_size=800).map("".join))
_SIZES = st.integers(min_value=1, max_value=400).flatmap(
    lambda m: st.tuples(st.just(m), st.integers(min_value=0, max_value=(m - 1) // 2))
)


@settings(max_examples=300, deadline=None)
@given(text=_TEXT, sizes=_SIZES)
def test_every_chunk_fits_and_comes_from_the_section(text: str, sizes: tuple[int, int]) -> None:
    max_chars, overlap_chars = sizes
    chunks = split_text(text, max_chars=max_chars, overlap_chars=overlap_chars)
    assert all(0 < len(c) <= max_chars and c == c.strip() and c in text for c in chunks)
    if text.strip():
        assert text.strip().startswith(chunks[0]) and text.strip().endswith(chunks[-1])
    else:
        assert chunks == []


@settings(max_examples=300, deadline=None)
@given(text=_TEXT, max_chars=st.integers(min_value=1, max_value=400))
def test_without_overlap_no_text_is_lost_or_repeated(text: str, max_chars: int) -> None:
    chunks = split_text(text, max_chars=max_chars, overlap_chars=0)
    assert "".join("".join(c.split()) for c in chunks) == "".join(text.split())


@settings(max_examples=100, deadline=None)
@given(
    sections=st.lists(st.tuples(st.lists(st.text(max_size=10), max_size=3), _TEXT), max_size=5),
    sizes=_SIZES,
)
def test_positions_are_contiguous_and_sections_kept(
    sections: list[tuple[list[str], str]], sizes: tuple[int, int]
) -> None:
    parsed = doc(*(Section(tuple(h), t) for h, t in sections))
    chunks = chunk_document(parsed, max_chars=sizes[0], overlap_chars=sizes[1])
    assert [c.position for c in chunks] == list(range(len(chunks)))
    paths = [" > ".join(h) for h, t in sections if t.strip()]
    assert [c.section for c in chunks if c.position == 0 or chunks[c.position - 1].section != c.section] == [
        p for i, p in enumerate(paths) if i == 0 or paths[i - 1] != p
    ]


def test_an_abbreviation_before_a_lowercase_word_is_not_a_sentence_end() -> None:
    first = "Alpha beta gamma delta epsilon zeta eta theta iota kappa lambda."
    second = "Use tools e.g. hammers and nails and some more words to fill it up."
    chunks = split_text(f"{first} {second}", max_chars=100, overlap_chars=0)
    assert chunks[0] == first
