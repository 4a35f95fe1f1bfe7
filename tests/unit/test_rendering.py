"""Rendering an answer's Markdown for Matrix, and the progress line (`vagent_bot.answers.rendering`)."""

from __future__ import annotations

import pytest

from vagent_bot.answers.rendering import progress_line, render_markdown


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


def test_progress_line() -> None:
    assert progress_line("Running database_query") == "_Running database_query…_"
    assert progress_line("Running database_query...") == "_Running database_query…_"
    assert progress_line("  Looking\nthings   up… ") == "_Looking things up…_"
    assert progress_line("") == "_Working…_"
    assert render_markdown(progress_line("Running database_query")) == "<em>Running database_query…</em>"
    tricky = progress_line("Running _private * [tool](x) `q` \\")
    assert render_markdown(tricky) == "<em>Running _private * [tool](x) `q` \\…</em>"
    assert len(progress_line("x" * 1000)) < 210 and "\n" not in progress_line("a\nb")
