"""Streaming answers as edits: the edit throttle, splitting long answers, rendering, event content."""

from __future__ import annotations

import itertools
import json
import math
import random
import re
import time

import pytest

from vagent_bot.streaming import (
    CONTENT_MAX_BYTES,
    MAX_TEXT_BYTES,
    EditThrottle,
    message_content,
    progress_line,
    render_markdown,
    split_message,
)

# ------------------------------------------------------------------------------ EditThrottle


def test_throttle_before_start_never_due() -> None:
    t = EditThrottle()
    assert not t.started and t.next_at() is None and not t.due(1e9)


def test_first_edit_after_first_delay_then_backoff_up_to_max_interval() -> None:
    t = EditThrottle(first_delay=0.5, max_interval=4.0, backoff=1.5, max_edits=30)
    t.start(10.0)
    assert t.next_at() == 10.5
    assert not t.due(10.49) and t.due(10.5)
    gaps = []
    now = 10.5
    for _ in range(10):
        t.sent(now)
        nxt = t.next_at()
        assert nxt is not None
        gaps.append(nxt - now)
        now = nxt
    assert gaps[:3] == pytest.approx([0.75, 1.125, 1.6875])
    assert gaps == sorted(gaps) and max(gaps) == 4.0 and gaps[-1] == 4.0


def test_not_due_between_edits() -> None:
    t = EditThrottle(first_delay=0.5, max_interval=4.0, backoff=2.0)
    t.start(0.0)
    t.sent(0.5)
    assert t.next_at() == 1.5
    assert not t.due(1.0) and not t.due(1.4999) and t.due(1.5) and t.due(100)


def test_late_edits_measure_the_interval_from_when_they_were_sent() -> None:
    t = EditThrottle(first_delay=0.5, max_interval=4.0, backoff=2.0)
    t.start(0.0)
    t.sent(7.0)  # the text arrived late
    assert t.next_at() == 8.0


def test_zero_first_delay_still_backs_off() -> None:
    t = EditThrottle(first_delay=0.0, max_interval=4.0, backoff=1.5)
    t.start(5.0)
    assert t.due(5.0)
    t.sent(5.0)
    nxt = t.next_at()
    assert nxt is not None and nxt > 5.0


def test_cap_on_intermediate_edits() -> None:
    t = EditThrottle(first_delay=0.0, max_interval=1.0, backoff=1.0, max_edits=3)
    t.start(0.0)
    now = 0.0
    for left in (3, 2, 1):
        assert t.edits_left == left and t.due(now)
        t.sent(now)
        now += 10
    assert t.edits_left == 0 and t.next_at() is None and not t.due(1e9)
    assert t.final_at(now) == now  # the final edit is never capped


def test_zero_edits_allowed_means_only_the_final_one() -> None:
    t = EditThrottle(max_edits=0)
    t.start(0.0)
    assert t.next_at() is None and not t.due(100) and t.final_at(3.0) == 3.0


def test_rate_limit_blocks_until_retry_after_and_raises_the_interval() -> None:
    t = EditThrottle(first_delay=0.5, max_interval=4.0, backoff=1.5)
    t.start(0.0)
    t.sent(0.5)  # next at 1.25
    t.rate_limited(1.25, retry_after_ms=2000)
    assert t.next_at() == 3.25 and not t.due(3.2) and t.due(3.25)
    assert t.edits_left == 29  # the refused edit does not count
    assert t.interval >= 2.0
    assert t.final_at(2.0) == 3.25 and t.final_at(5.0) == 5.0  # the final edit waits for it too
    t.sent(3.25)
    assert t.next_at() == pytest.approx(3.25 + 3.0)  # 2.0 * 1.5, still <= max_interval


def test_rate_limit_longer_than_max_interval_is_respected_for_the_rest() -> None:
    t = EditThrottle(first_delay=0.5, max_interval=4.0, backoff=1.5)
    t.start(0.0)
    t.rate_limited(0.5, retry_after_ms=10_000)
    assert t.next_at() == 10.5
    t.sent(10.5)
    assert t.next_at() == 20.5  # the interval never shrinks below the server's retry_after


def test_rate_limit_before_start_and_odd_values() -> None:
    t = EditThrottle(first_delay=0.5)
    t.rate_limited(0.0, retry_after_ms=3000)
    assert not t.started and t.final_at(1.0) == 3.0
    t.start(1.0)
    assert t.next_at() == 3.0
    t2 = EditThrottle(first_delay=0.5)
    t2.start(0.0)
    t2.rate_limited(1.0, retry_after_ms=-5)  # nonsense from a server: no effect, no crash
    assert t2.next_at() == 1.0
    t2.rate_limited(1.0, retry_after_ms=100)
    t2.rate_limited(1.0, retry_after_ms=50)  # a shorter second limit does not shorten the first
    assert t2.next_at() == 1.1


@pytest.mark.parametrize(
    "kwargs", [{"first_delay": -1}, {"max_interval": 0}, {"backoff": 0.9}, {"max_edits": -1}]
)
def test_throttle_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        EditThrottle(**kwargs)  # type: ignore[arg-type]


def test_a_long_stream_stays_within_the_limits() -> None:
    t = EditThrottle(first_delay=0.5, max_interval=4.0, backoff=1.5, max_edits=30)
    t.start(0.0)
    sent: list[float] = []
    for i in range(1, 3000):  # a token every 50 ms for 150 s
        now = i * 0.05
        if t.due(now):
            t.sent(now)
            sent.append(now)
    assert len(sent) == 30 and t.edits_left == 0
    gaps = [b - a for a, b in itertools.pairwise(sent)]
    assert all(g <= 4.0 + 0.05 + 1e-9 for g in gaps) and sent[0] == pytest.approx(0.5)


# ------------------------------------------------------------------------------ split_message


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


# ------------------------------------------------------------------------------ render_markdown


def test_markdown_basics() -> None:
    html = render_markdown("# Title\n\nSome **bold** and `code`.\n\n- a\n- b\n\n1. x\n2. y")
    for needle in (
        "<h1>Title</h1>",
        "<strong>bold</strong>",
        "<code>code</code>",
        "<ul>",
        "<li>a</li>",
        "<ol>",
    ):
        assert needle in html


def test_single_paragraph_is_not_wrapped() -> None:
    assert render_markdown("just *this*") == "just <em>this</em>"
    assert render_markdown("one\n\ntwo") == "<p>one</p>\n<p>two</p>"


def test_line_breaks_are_kept() -> None:
    assert render_markdown("line one\nline two") == "line one<br />\nline two"


def test_fenced_code_and_tables() -> None:
    html = render_markdown("```python\nif a < b:\n    pass\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |")
    assert '<pre><code class="language-python">if a &lt; b:\n    pass\n</code></pre>' in html
    assert "<table>" in html and "<td>1</td>" in html


def test_list_right_after_a_line_of_text() -> None:
    html = render_markdown("Steps:\n- one\n- two")
    assert "<ul>" in html and "<li>one</li>" in html


@pytest.mark.parametrize(
    "text",
    [
        "<script>alert(1)</script>",
        "before\n\n<script>alert(1)</script>\n\nafter",
        "inline <script>alert(1)</script> here",
        "<img src=x onerror=alert(1)>",
        "<div onclick='x'>block</div>",
        "<!-- comment --> text",
        '<a href="javascript:alert(1)">x</a>',
        "`<script>` and ```\n<script>\n```",
    ],
)
def test_raw_html_is_escaped_never_passed_through(text: str) -> None:
    html = render_markdown(text)
    assert "<script" not in html and "<img" not in html and "<div" not in html and "<!--" not in html
    assert '<a href="javascript' not in html
    assert "&lt;" in html


def test_links_are_kept_and_unsafe_schemes_dropped() -> None:
    html = render_markdown(
        "[site](https://example.org/a?b=1&c=2) <https://x.org> [m](mailto:a@b.c) [mx](matrix:u/a:b.c) "
        "[js](javascript:alert(1)) [js2]( JaVa\tScRiPt:alert(1)) [d](data:text/html;base64,xx) [rel](/etc/x)"
    )
    assert '<a href="https://example.org/a?b=1&amp;c=2">site</a>' in html
    assert '<a href="https://x.org">https://x.org</a>' in html
    assert '<a href="mailto:a@b.c">m</a>' in html and '<a href="matrix:u/a:b.c">mx</a>' in html
    assert "javascript" not in html.lower().replace("alert", "") or 'href="' not in html.split("js")[1][:20]
    for label in ("js", "js2", "d", "rel"):
        assert f"<span>{label}</span>" in html


def test_images_become_links_except_mxc() -> None:
    html = render_markdown(
        "![chart](https://example.org/c.png) ![pic](mxc://example.org/abc) ![x](javascript:1)"
    )
    assert '<a href="https://example.org/c.png">chart</a>' in html
    assert '<img alt="pic" src="mxc://example.org/abc" />' in html
    assert "<span>x</span>" in html


def test_control_characters_and_markdown_placeholders_are_dropped() -> None:
    html = render_markdown("a\x00b\x02klzzwxh:0\x03c\x1bd")
    assert html == "abklzzwxh:0cd"


# ------------------------------------------------------------------------------ message_content


def test_plain_message() -> None:
    assert message_content("hello **you**") == {
        "msgtype": "m.text",
        "body": "hello **you**",
        "m.mentions": {},
        "format": "org.matrix.custom.html",
        "formatted_body": "hello <strong>you</strong>",
    }


def test_plain_text_and_notice() -> None:
    assert message_content("x", html=False) == {"msgtype": "m.text", "body": "x", "m.mentions": {}}
    assert message_content("x", notice=True, html=False) == {
        "msgtype": "m.notice",
        "body": "x",
        "m.mentions": {},
    }


def test_thread_message() -> None:
    content = message_content("hi", thread_root="$root", html=False)
    assert content["m.relates_to"] == {
        "rel_type": "m.thread",
        "event_id": "$root",
        "is_falling_back": True,
        "m.in_reply_to": {"event_id": "$root"},
    }
    latest = message_content("hi", thread_root="$root", reply_to="$latest", html=False)
    assert latest["m.relates_to"]["m.in_reply_to"] == {"event_id": "$latest"}


def test_plain_reply() -> None:
    content = message_content("hi", reply_to="$q", html=False)
    assert content == {
        "msgtype": "m.text",
        "body": "hi",
        "m.mentions": {},
        "m.relates_to": {"m.in_reply_to": {"event_id": "$q"}},
    }


def test_edit() -> None:
    content = message_content("new *text*", replaces="$orig", thread_root="$root", reply_to="$x", notice=True)
    assert content == {
        "msgtype": "m.notice",
        "body": "* new *text*",
        "m.mentions": {},
        "format": "org.matrix.custom.html",
        "formatted_body": "* new <em>text</em>",
        "m.new_content": {
            "msgtype": "m.notice",
            "body": "new *text*",
            "m.mentions": {},
            "format": "org.matrix.custom.html",
            "formatted_body": "new <em>text</em>",
        },
        "m.relates_to": {"rel_type": "m.replace", "event_id": "$orig"},
    }


def test_script_is_escaped_in_content() -> None:
    content = message_content("<script>alert('x')</script>", replaces="$e")
    assert "<script" not in content["formatted_body"]
    assert "<script" not in content["m.new_content"]["formatted_body"]
    assert content["m.new_content"]["body"] == "<script>alert('x')</script>"  # the body is plain text


def test_progress_line() -> None:
    assert progress_line("Running database_query") == "_Running database_query…_"
    assert progress_line("Running database_query...") == "_Running database_query…_"
    assert progress_line("  Looking\nthings   up… ") == "_Looking things up…_"
    assert progress_line("") == "_Working…_"
    assert render_markdown(progress_line("Running database_query")) == "<em>Running database_query…</em>"
    tricky = progress_line("Running _private * [tool](x) `q` \\")
    assert render_markdown(tricky) == "<em>Running _private * [tool](x) `q` \\…</em>"
    assert len(progress_line("x" * 1000)) < 210 and "\n" not in progress_line("a\nb")


# worst cases: every event the bot builds from a part must fit Matrix's 65536-byte limit


EVENT_ID = "$" + "A" * 254  # the longest event id the spec allows (255 bytes)
ROOM_ID = "!" + "r" * 254


def adversarial_texts() -> dict[str, str]:
    n = MAX_TEXT_BYTES
    table_head = "|" + "a|" * 60 + "\n|" + "-|" * 60 + "\n"
    return {
        "ampersands": "&" * n * 3,
        "angle brackets": "<" * n * 3,
        "quotes and backslashes": '"\\' * n * 2,
        "control characters": "\x01\x1f" * n,
        "newlines": "x\n" * n * 2,
        "2-byte letters": "é" * n * 2,
        "C1 controls": "\x85\x9f" * n,
        "CJK": "中文" * n,
        "emoji": "😀" * n,
        "ZWJ families": "👩\u200d👩\u200d👧\u200d👦" * n,
        "empty table cells": table_head + ("|" * 61 + "\n") * (n // 20),
        "reference link bomb": "[r]: https://example.org/" + "x" * 1200 + "\n\n" + "[a][r] " * n,
        "emphasis": "*a* " * n * 2,
        "list items": "- a\n" * n * 2,
        "links": "<https://a.b> " * n,
        "code with specials": "```\n" + 'if a<b && c>d: s = "\\\\"\n' * n + "```",
        "mixed": "".join(
            random.Random(7).choice(["&", "<", "😀", "é", '"', "\\", "|", "\n", "a", "\x01"])
            for _ in range(n * 3)
        ),
    }


def encrypted_event_size(content: dict[str, object]) -> int:
    """What the event weighs in an encrypted room: nio's compact ASCII JSON, Megolm, base64, envelope."""
    plaintext = json.dumps(
        {"type": "m.room.message", "content": content, "room_id": ROOM_ID}, separators=(",", ":")
    ).encode()
    megolm = len(plaintext) + 16 + 1 + 6 + 8 + 64  # padding, version, index, MAC, signature
    return math.ceil(megolm * 4 / 3) + 2500  # + algorithm/keys/relations + PDU (auth, hashes, signatures)


@pytest.mark.parametrize("name", list(adversarial_texts()))
def test_every_event_built_from_a_part_fits(name: str) -> None:
    text = adversarial_texts()[name]
    parts = split_message(text)
    assert len(parts) > 1
    for part in parts:
        for content in (
            message_content(part, replaces=EVENT_ID),
            message_content(part, thread_root=EVENT_ID, reply_to=EVENT_ID, notice=True),
            message_content(part, reply_to=EVENT_ID),
        ):
            assert len(json.dumps(content).encode()) <= CONTENT_MAX_BYTES
            assert len(json.dumps(content).encode()) + 1024 < 65536
            assert len(json.dumps(content, ensure_ascii=False).encode()) + 1024 < 65536  # canonical JSON
            assert encrypted_event_size(content) < 65536
            assert content["body"].endswith(part.replace("\x01", "").replace("\x1f", "")[-10:])


@pytest.mark.parametrize(
    "text",
    [
        ("The quick brown fox jumps over the lazy dog. **bold** `code` [link](https://example.org)\n" * 100),
        ("## 标题\n\n**粗体** 中文文本，这是一个测试。\n" * 200),
        ("```python\n" + 'if a < b and c > d: print("x & y")\n' * 200 + "```\n"),
        ("| name | value |\n|---|---|\n" + "| key | 42 |\n" * 400),
        ("Ünïcödé ➜ résumé naïve café — “quotes” • bullets\n" * 200),
    ],
)
def test_ordinary_answers_keep_their_formatting_at_full_size(text: str) -> None:
    part = split_message(text)[0]
    assert size(part) > MAX_TEXT_BYTES * 0.9
    assert "formatted_body" in message_content(part, replaces=EVENT_ID)


def test_html_is_dropped_only_when_it_would_not_fit() -> None:
    bomb = "[r]: https://example.org/" + "x" * 1200 + "\n\n" + "[a][r] " * 500
    assert size(bomb) <= MAX_TEXT_BYTES
    content = message_content(bomb, replaces=EVENT_ID)
    assert "formatted_body" not in content and "format" not in content
    assert content["m.new_content"] == {"msgtype": "m.text", "body": bomb, "m.mentions": {}}
    assert "formatted_body" in message_content(bomb[: bomb.index("[a]") + 7 * 5], replaces=EVENT_ID)
