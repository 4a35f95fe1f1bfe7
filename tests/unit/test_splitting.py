"""Splitting long answers into messages (`vagent_bot.answers.splitting.split_message`)."""

from __future__ import annotations

import random
import re
import time

import pytest

from vagent_bot.answers.rendering import render_markdown
from vagent_bot.answers.size_budget import MAX_TEXT_BYTES
from vagent_bot.answers.splitting import split_message


def size(s: str) -> int:
    return len(s.encode("utf-8"))


FENCE_LINE = re.compile(r" {0,3}(`{3,}|~{3,})")


WHITE = re.compile(r"\s*")
CLOSING_LINE = re.compile(r"\s*(?:`{3,}|~{3,})[ \t]*")


def assert_round_trip(text: str, parts: list[str]) -> None:
    """Without the fence lines split_message added, each part follows the previous one in `text`
    with only white space in between.

    A part that ends inside a code block gets a closing fence line; the next part then either
    starts with the reopened opening line, or (when only the original closing line was left)
    continues after that line. Every reading of the parts is tried; one must fit the text.
    """
    states = {(0, False)}  # (position in text, did the previous part close a block early?)
    for part in parts:
        assert part.strip() or parts == [text], "no empty parts"
        following: set[tuple[int, bool]] = set()
        for i, closed_early in states:
            starts: list[tuple[str, re.Pattern[str]]] = [(part, CLOSING_LINE if closed_early else WHITE)]
            opener, newline, rest = part.partition("\n")
            if closed_early and newline and FENCE_LINE.match(opener):
                starts.append((rest, WHITE))
            for piece, gap in starts:
                head, newline, last = piece.rpartition("\n")
                ends = [(piece, False)] + ([(head, True)] if newline and FENCE_LINE.fullmatch(last) else [])
                m = gap.match(text, i)
                if m is None:
                    continue
                lo = m.end() if gap is CLOSING_LINE else i
                hi = m.end() + len(text[m.end() :]) - len(text[m.end() :].lstrip())
                for j in range(lo, hi + 1):
                    for body, early in ends:
                        if text.startswith(body, j):
                            following.add((j + len(body), early))
        assert following, f"part does not continue the text: {part[:60]!r}"
        states = following
    assert any(ends_here(text, i, early) for i, early in states), "the parts end before the text"


def ends_here(text: str, i: int, closed_early: bool) -> bool:
    """Only white space is left, or a closing line the last part's added one replaced."""
    m = CLOSING_LINE.match(text, i) if closed_early else None
    return not text[m.end() if m else i :].strip()


def assert_split(text: str, limit: int) -> list[str]:
    parts = split_message(text, limit)
    assert all(size(p) <= limit for p in parts), [size(p) for p in parts]
    assert_round_trip(text, parts)
    return parts


def test_short_text_is_returned_unchanged() -> None:
    for text in ("", "hi", "  spaced  \n\n", "x" * MAX_TEXT_BYTES):
        assert split_message(text) == [text]


def test_default_limit() -> None:
    parts = split_message("word " * 5000)
    assert len(parts) > 1 and all(size(p) <= MAX_TEXT_BYTES for p in parts)


def test_prefers_paragraph_boundaries() -> None:
    paragraphs = [f"Paragraph {i}. " + "lorem ipsum dolor\n" * 8 for i in range(40)]
    text = "\n\n".join(p.rstrip() for p in paragraphs)
    parts = assert_split(text, 1000)
    for part in parts[:-1]:
        end = text.index(part) + len(part)
        assert text.startswith("\n\n", end), repr(text[end - 20 : end + 5])


def test_then_line_boundaries() -> None:
    text = "\n".join(f"line {i} " + "x" * 30 for i in range(200))
    parts = assert_split(text, 500)
    for part in parts:
        assert part.startswith("line ") and re.fullmatch(r"line \d+ x{30}", part.split("\n")[-1])


def test_then_word_boundaries() -> None:
    words = [f"w{i}" + "y" * (i % 7) for i in range(3000)]
    text = " ".join(words)
    parts = assert_split(text, 300)
    assert [w for p in parts for w in p.split(" ")] == words


def test_a_single_200_kb_word() -> None:
    word = "".join(random.Random(1).choice("abcdefghij") for _ in range(200_000))
    parts = assert_split(word, MAX_TEXT_BYTES)
    assert "".join(parts) == word
    assert all(size(p) == MAX_TEXT_BYTES for p in parts[:-1])


@pytest.mark.parametrize("char", ["é", "中", "😀", "𝔘"])
def test_multibyte_characters_are_never_cut(char: str) -> None:
    text = char * 20_000
    parts = assert_split(text, 1001)
    assert "".join(parts) == text
    assert all(set(p) == {char} for p in parts)
    assert all(size(p) > 1001 - size(char) for p in parts[:-1])  # as full as possible


def test_cjk_prose_is_cut_after_sentence_punctuation() -> None:
    text = "这是一个很长的句子，用来测试分割。" * 400
    parts = assert_split(text, 900)
    assert all(p.endswith("。") for p in parts)


@pytest.mark.parametrize(
    "cluster",
    [
        "👩\u200d👩\u200d👧\u200d👦",
        "🇫🇷",
        "👍🏽",
        "e\u0301",
        "1\ufe0f\u20e3",
        "🏴\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f",
    ],
)
def test_emoji_sequences_and_accents_are_not_torn_apart(cluster: str) -> None:
    text = cluster * 3000
    parts = assert_split(text, 997)
    assert "".join(parts) == text
    for p in parts:
        assert len(p) % len(cluster) == 0 and p == cluster * (len(p) // len(cluster))


def code_answer(lines: int = 400, info: str = "python") -> str:
    code = "\n".join(
        f"    value_{i} = compute({i})  # step {i}" if i % 5 else f"def f{i}():" for i in range(lines)
    )
    return f"Here is the code:\n\n```{info}\n{code}\n```\n\nAnd that is all.\n"


def test_split_code_block_is_closed_and_reopened() -> None:
    text = code_answer()
    parts = assert_split(text, 2000)
    assert len(parts) > 3
    for i, part in enumerate(parts):
        fence_lines = [line for line in part.split("\n") if FENCE_LINE.match(line)]
        assert len(fence_lines) % 2 == 0, f"part {i} leaves a code block open"
        if 0 < i < len(parts) - 1:
            assert part.startswith("```python\n") and part.endswith("\n```")
    code_lines = [line for line in text.split("\n") if "value_" in line or line.startswith("def f")]
    all_lines = {line for p in parts for line in p.split("\n")}
    assert all(line in all_lines for line in code_lines)  # whole lines, indentation kept


def test_every_part_renders_its_code_as_code() -> None:
    parts = split_message(code_answer(), 2000)
    for part in parts[1:-1]:
        html = render_markdown(part)
        assert html.startswith('<pre><code class="language-python">') and "```" not in html


@pytest.mark.parametrize("info", ["", 'js title="a b"', "c++"])
def test_fence_info_string_is_kept(info: str) -> None:
    parts = assert_split(code_answer(300, info), 1500)
    assert all(p.startswith(f"```{info}\n") for p in parts[1:-1])


def test_tilde_fence_with_backticks_inside() -> None:
    body = "\n".join("```not a fence``` line " + str(i) if i % 3 else "```" for i in range(300))
    text = f"intro\n\n~~~markdown\n{body}\n~~~\n\noutro"
    parts = split_message(text, 1200)
    assert all(size(p) <= 1200 for p in parts)
    for part in parts[1:-1]:
        assert part.startswith("~~~markdown\n") and part.endswith("\n~~~")


def test_unclosed_fence_runs_to_the_end() -> None:
    text = "start\n\n```sql\n" + "\n".join(f"SELECT {i};" for i in range(500))
    parts = assert_split(text, 1000)
    assert all(p.startswith("```sql\n") for p in parts[1:])
    assert all(p.endswith("\n```") for p in parts[1:-1]) and not parts[-1].endswith("```")


def test_huge_fence_line_is_plain_text() -> None:
    text = "`" * 3 + "x" * 5000 + "\n" + "word " * 2000
    assert_split(text, 1000)


def test_long_white_space_only_text_gives_one_empty_part() -> None:
    assert split_message(" \n\t" * 3000) == [""]


def test_leading_blank_lines_and_whitespace_only_tails() -> None:
    text = "\n\n   \n" + "alpha beta " * 300 + "\n\n\n   \n\t"
    parts = assert_split(text, 500)
    assert parts[0].startswith("alpha") and parts[-1].strip()


def test_crlf_line_endings() -> None:
    text = "\r\n".join("line number " + str(i) for i in range(400))
    parts = assert_split(text, 400)
    assert not any(p.endswith("\r") or p.startswith("\n") for p in parts)


@pytest.mark.parametrize("limit", [0, 15])
def test_too_small_limit_is_refused(limit: int) -> None:
    with pytest.raises(ValueError):
        split_message("x" * 100, limit)


def test_tiny_limits_still_work() -> None:
    text = code_answer(20) + " 😀👩\u200d👩\u200d👧 " * 5
    for limit in (16, 17, 23, 40):
        parts = split_message(text, limit)
        assert all(size(p) <= limit for p in parts)


ALPHABET = [
    "word",
    "longerword",
    "é",
    "中文",
    "😀",
    "🇫🇷",
    " ",
    " ",
    "  ",
    "\n",
    "\n",
    "\n\n",
    "\n\n\n",
    "\t",
    "    indented",
    "- item",
    "**bold**",
    "<b>&amp;",
    "\r\n",
    "x" * 300,
]


@pytest.mark.parametrize("seed", range(120))
def test_random_texts(seed: int) -> None:
    rnd = random.Random(seed)
    chunks: list[str] = []
    for _ in range(rnd.randint(1, 400)):
        if rnd.random() < 0.03:
            info = rnd.choice(["", "py", "json"])
            code = "".join(rnd.choice(ALPHABET) for _ in range(rnd.randint(0, 60))).replace("```", "")
            chunks.append(f"\n```{info}\n{code}\n```\n")
        else:
            chunks.append(rnd.choice(ALPHABET))
    text = "".join(chunks)
    limit = rnd.choice([16, 24, 64, 200, 1000, MAX_TEXT_BYTES])
    assert_split(text, limit)


def test_splitting_is_fast_enough() -> None:
    text = (code_answer() + "Some prose with words. " * 200 + "\n\n") * 20  # ~1 MB
    start = time.perf_counter()
    split_message(text)
    assert time.perf_counter() - start < 5
